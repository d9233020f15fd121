"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests that need fixed answers.

``vllm=True`` makes it look like vLLM where that matters to us: it answers ``GET /version``,
returns ``prompt_token_ids``/``token_ids`` when asked with ``return_token_ids`` and sends them
as null otherwise, like vLLM 0.32 does. Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedServer:
    def __init__(self, *, vllm: bool = True, reply: str = "hello",
                 completion_ids: list[int] | None = None, status: int = 200) -> None:
        self.vllm = vllm
        self.reply = reply
        self.completion_ids = completion_ids or [11, 12, 13]
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.version_hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/version" and server.vllm:
                    server.version_hits += 1
                    return self._send(200, {"version": "0.32.0"})
                if self.path == "/version":
                    server.version_hits += 1
                self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if server.status != 200:
                    return self._send(server.status, {"error": {"message": "scripted failure"}})
                self._send(200, server.completion(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = [1, 2, 3, len(body["messages"])]
        want_ids = self.vllm and body.get("return_token_ids")
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": self.reply},
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": str(t), "logprob": -0.5 - 0.25 * i, "bytes": [], "top_logprobs": []}
                for i, t in enumerate(self.completion_ids)]}
        out: dict[str, Any] = {
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": 1,
            "model": body["model"], "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(self.completion_ids),
                      "total_tokens": len(prompt_ids) + len(self.completion_ids)},
        }
        if self.vllm:
            choice["token_ids"] = self.completion_ids if want_ids else None
            out["prompt_token_ids"] = prompt_ids if want_ids else None
        return out

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
