"""The Kafka transport, ``kafka://HOST:PORT/TOPIC``: the updater's source (``source``), stream-train's sink
(``sink``), and what both share (``messages``: the message format; ``admin``: topics; ``health``: broker
connectivity). Opened through the family fronts ``offgraph.streaming.sources.open_source`` and
``offgraph.streaming.sinks.open_sink``, which load it on use; nothing is imported here."""
