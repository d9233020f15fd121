"""The alias table over HTTP, for agents on hosts that do not share the registry's filesystem.

``AliasServer(registry)`` answers ``GET /aliases`` with the registry's ``aliases.json`` as it
is on disk. The publisher replaces that file atomically (temp file + rename), so a response is
the old table or the new one, never a mix; its ETag is a hash of the bytes, and a poll whose
``If-None-Match`` matches gets ``304 Not Modified`` with no body. Agents set
``AGL_BRIDGE_ALIASES=http://<host>:<port>/aliases`` (``agl_bridge.aliases.HttpAliasTable``).
``GET /prompts`` is the registry's prompt table (``prompts.json``, written the same way) by the
same rules, for ``AGL_BRIDGE_PROMPTS=http://<host>:<port>/prompts``
(``agl_bridge.prompts.HttpPromptTable``). Read-only: nothing a request sends changes anything.
``agl-bridge aliases-serve`` runs it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agl_bridge.trainer.serving.prompts import PROMPTS_FILE
from agl_bridge.trainer.serving.registry import ALIASES_FILE

PATH = "/aliases"
PROMPTS_PATH = "/prompts"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in (PATH, PROMPTS_PATH):
            self._send(404, b'{"error": "not found: GET /aliases or /prompts"}')
            return
        what = "alias table" if path == PATH else "prompt table"
        try:
            body = (self.server.aliases_file if path == PATH else
                    self.server.prompts_file).read_bytes()
        except FileNotFoundError:
            self._send(404, f'{{"error": "no {what} yet: nothing was published"}}'.encode())
            return
        except OSError as exc:
            self._send(503, f'{{"error": "{what} unreadable: {type(exc).__name__}"}}'
                       .encode())
            return
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if self.headers.get("If-None-Match") == etag:
            self._send(304, b"", etag)
            return
        self._send(200, body, etag)

    def _send(self, code: int, body: bytes, etag: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        if etag:
            self.send_header("ETag", etag)
        if code != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if code != 304:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # one line per poll: none
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    aliases_file: Path
    prompts_file: Path


class AliasServer:
    """Serves ``<registry>/aliases.json`` at ``http://host:port/aliases`` and
    ``<registry>/prompts.json`` at ``/prompts`` from a thread (or, with ``serve_forever``, from
    the caller's). ``port=0``: a free port (see ``url`` and ``prompts_url``)."""

    def __init__(self, registry: str | os.PathLike[str], host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.httpd = _Server((host, port), _Handler)
        self.httpd.aliases_file = Path(registry) / ALIASES_FILE
        self.httpd.prompts_file = Path(registry) / PROMPTS_FILE
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}{PATH}"

    @property
    def prompts_url(self) -> str:
        return self.url[:-len(PATH)] + PROMPTS_PATH

    def start(self) -> AliasServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="agl-bridge-alias-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> AliasServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
