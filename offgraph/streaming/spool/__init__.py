"""The spool transport, ``spool:DIR``: delta files published into a directory by rename. The updater's source
(``source``, woken by ``watch``) and stream-train's sink (``sink``). Opened through the family fronts
``offgraph.streaming.sources.open_source`` and ``offgraph.streaming.sinks.open_sink``, which load it on use;
nothing is imported here."""
