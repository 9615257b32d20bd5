"""URL path convertors of the server's routes (registered with Starlette on import)."""

from __future__ import annotations

from starlette.convertors import StringConvertor, register_url_convertor


class NoColon(StringConvertor):
    """A path segment without ':': GET /v1/models/ml:score is the :score route's (405), not model 'ml:score's,
    and GET /v1/models/ml/versions/1:predict is the :predict route's, not version '1:predict's."""

    regex = "[^/:]+"


register_url_convertor("no_colon", NoColon())
