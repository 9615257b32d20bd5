"""/docs (Swagger UI) and /redoc from assets this server serves itself, never a CDN: the pages render on a host
without internet access and load nothing from another host.

FastAPI's self-hosting recipe: the app is built with ``docs_url=None, redoc_url=None`` (FastAPI's own pages
load their JavaScript, CSS and favicon from a CDN, and ReDoc's fonts from Google), the files the
``fastapi-offline`` package ships are mounted at ``STATIC_URL``, and both pages, built by FastAPI's
``fastapi.openapi.docs``, point at them. URLs follow the request's ``root_path`` as FastAPI's own pages do.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/docs-static"
ASSETS = str(files("fastapi_offline") / "static")
"""swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js and favicon.png."""
FAVICON = f"{STATIC_URL}/favicon.png"


def install_docs(app: FastAPI) -> None:
    """Serve /docs, its OAuth2 redirect page and /redoc on ``app`` (built with docs_url=None, redoc_url=None)."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("build the app with docs_url=None and redoc_url=None: their pages load a CDN's assets")
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    app.mount(STATIC_URL, StaticFiles(directory=ASSETS), name="docs-static")

    def page(
        request: Request, build: Callable[..., HTMLResponse], title: str, options: dict[str, Any], **local: str
    ) -> HTMLResponse:
        """``build``'s page: its URLs (``openapi_url`` and ``local``, paths on this server) under the request's
        root path, and ``options``."""
        root = request.scope.get("root_path", "").rstrip("/")
        urls = {k: root + path for k, path in {"openapi_url": openapi_url, **local}.items()}
        return build(title=f"{app.title} - {title}", **urls, **options)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return page(
            request,
            get_swagger_ui_html,
            "Swagger UI",
            {"swagger_ui_parameters": app.swagger_ui_parameters},
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=FAVICON,
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return page(
            request,
            get_redoc_html,
            "ReDoc",
            {"with_google_fonts": False},  # Google's fonts: another host; the page falls back to the browser's
            redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=FAVICON,
        )
