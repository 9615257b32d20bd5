"""HTTP plumbing under the API: body and connection limits, the request id, error bodies and the 500
middleware, path redaction, route matching, path convertors. Knows no model and no route."""
