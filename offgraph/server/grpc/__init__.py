"""The gRPC port of the server (``offgraph serve --grpc-port``): ``server`` runs it, one module per protocol
plugs its services in (``server.SERVICES``), ``status`` maps the score path's errors to gRPC status codes."""
