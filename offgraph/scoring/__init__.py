"""The request path of the library scorer: feature join -> FG -> unique store keys -> row cache -> store
read -> pooling -> the dense head -> calibration (``offgraph.scoring.scorer.Scorer``)."""
