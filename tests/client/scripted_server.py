"""A real HTTP server on a loopback socket that answers from a script: the 503s with Retry-After a
client must retry, which the scoring server gives only while a model loads or a read fails."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCORE_BODY = {
    "model": "ml",
    "version": 3,
    "scores": [0.25, 0.5],
    "score_kind": "ctr",
    "unknown_candidates": 0,
    "unknown_request": False,
}
UNAVAILABLE = {"detail": "model 'ml' is loading: no version serves yet: retry shortly"}


class ScriptedServer:
    """Answers each request with the next ``(status, headers, body)`` of ``script``, the last one
    forever after; records ``(monotonic time, method, path)`` of every request in ``seen``."""

    def __init__(self, script: list[tuple[int, dict[str, str], dict]]):
        self.script, self.seen = list(script), []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the scoring server

            def _answer(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                with lock:
                    outer.seen.append((time.monotonic(), self.command, self.path))
                    status, headers, body = outer.script[min(len(outer.seen), len(outer.script)) - 1]
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def unavailable(retry_after: str | None = "0") -> tuple[int, dict[str, str], dict]:
    return 503, ({} if retry_after is None else {"retry-after": retry_after}), UNAVAILABLE


OK_SCORE = (200, {}, SCORE_BODY)
