"""Export a trained DeepFM into a servable model version (``offgraph export``), check it against the
trained model (``offgraph check``), and write synthetic versions of any size (``offgraph synth``,
``offgraph plan``).

    models/<name>/<version>/manifest.json   (written last, by atomic rename)
                           /dense/          (SavedModel of the dense head only)
                           /store/          (sharded, quantized RocksDB tables)

The directory format itself is ``offgraph.modeldir``.
"""
