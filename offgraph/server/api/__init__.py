"""The HTTP API: routers (``routers/``: one module each, FastAPI's "bigger applications" layout), the
dependencies they share (``deps``: nothing else passes between routers), request and response models
(``schemas``, ``anchor_schemas``), request bodies (``score_body``, ``tfserving_body``), the JSON of a model's
status (``model_status``, ``version_status``), /docs and its examples, and the app's shared state (``state``)."""
