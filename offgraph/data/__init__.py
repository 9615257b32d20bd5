"""Named data sets converted into the trainer's input format (``offgraph data``)."""
