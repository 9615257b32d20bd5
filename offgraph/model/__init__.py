"""DeepFM built from a feature spec, and its training: the Keras front and head, losses, metrics, splits."""
