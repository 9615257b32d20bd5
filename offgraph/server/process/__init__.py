"""The server process: Prometheus metrics (``metrics``, ``process_metrics``), GC tuning, TensorFlow's thread
pools, the event loop's lag, and ``workers`` (``--workers N``: the supervisor that runs the app in each worker)."""
