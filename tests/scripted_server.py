"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests that need fixed answers.

``vllm=True`` makes it look like vLLM where that matters to us: it answers ``GET /version``,
returns ``prompt_token_ids``/``token_ids`` when asked with ``return_token_ids`` and sends them
as null otherwise, like vLLM 0.32 does. Every request body is kept in ``requests``.

``stream=True`` requests get Server-Sent Events in the shape vLLM 0.32 streams them (observed
on a real server; see ``stream_events``):

* per choice, a first chunk with ``delta: {"role": "assistant", "content": ""}`` and
  ``logprobs: null``, no ``token_ids`` key in the choice; the chunk carries the top-level
  ``prompt_token_ids`` (a list when asked, else null) and ``prompt_text: null``;
* one chunk per completion token: the choice's ``token_ids`` (``[id]`` when asked, else null)
  and ``logprobs`` (``{"content": [one entry]}`` when asked, else null); the last one carries
  ``finish_reason``, ``stop_reason: null`` and a top-level ``system_fingerprint``;
* with ``stream_options.include_usage``, a last chunk with ``choices: []`` and the usage;
* then ``data: [DONE]``.

Choices are interleaved for ``n > 1`` (choice i's ids are the script's ids plus ``100 * i``).
``tool_calls`` makes every answer call those tools (``finish_reason: tool_calls``); streamed,
a call comes as a first delta with its id, type and name (empty arguments), then the
arguments in pieces, as OpenAI and vLLM's tool parsers send them. ``ids_for(body)`` can
script the ids per request, and ``script(body)`` the reply and tool calls per request (for
multi-agent runs whose agents must answer, vote or pick a speaker); ``stream_error_after``
sends vLLM's in-stream error event after that many chunks. ``error_message(body)`` words the
error (a ``status`` other than 200, or the in-stream error) per request, e.g. to echo the
prompt as some servers do.

``lora=True`` adds vLLM's runtime adapter endpoints, with its answers: ``POST
/v1/load_lora_adapter`` (400 "has already been loaded" for a name it has; ``load_delay_s``
stretches each load so that concurrent publishers overlap), ``POST /v1/unload_lora_adapter``
(404 "cannot be found" for a name it lacks; ``unload_status`` other than 200 makes every
unload fail with that status), ``GET /v1/models`` lists the base model and the loaded adapters
with the path each was loaded from (``root``, as vLLM does), a chat request for a model that is
neither ``base_model`` nor a loaded adapter gets 404 like vLLM's, and ``GET /metrics`` reports no
running or waiting adapters. ``adapters`` maps loaded names to their paths; ``loads`` counts
successful loads.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINGERPRINT = "vllm-0.32.0-scripted"


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # many concurrent clients connect at once in the tests
    daemon_threads = True


class ScriptedServer:
    def __init__(self, *, vllm: bool = True, reply: str = "hello",
                 completion_ids: list[int] | None = None, status: int = 200,
                 tool_calls: list[dict[str, str]] | None = None,
                 ids_for: Callable[[dict[str, Any]], tuple[list[int], list[int]]] | None = None,
                 script: Callable[[dict[str, Any]], tuple[str, list[dict[str, str]]]] | None = None,
                 chunk_delay_s: float = 0.0, stream_error_after: int | None = None,
                 unique_ids: bool = False,
                 error_message: Callable[[dict[str, Any]], str] | None = None,
                 lora: bool = False, base_model: str = "base", load_delay_s: float = 0.0,
                 choice_replies: list[str] | None = None) -> None:
        self.vllm = vllm
        self.reply = reply
        self.choice_replies = choice_replies  # non-stream, n > 1: choice i says the i-th (mod)
        self.completion_ids = completion_ids or [11, 12, 13]
        self.status = status
        self.tool_calls = tool_calls or []
        self.ids_for = ids_for
        self.script = script
        self.chunk_delay_s = chunk_delay_s
        self.stream_error_after = stream_error_after
        self.unique_ids = unique_ids  # response ids chatcmpl-scripted-1, -2, ... (else one id)
        self.responses = 0
        self.error_message = error_message
        self.requests: list[dict[str, Any]] = []
        self.lora = lora
        self.base_model = base_model
        self.load_delay_s = load_delay_s
        self.adapters: dict[str, str] = {}
        self.unload_status = 200
        self.loads = 0
        self.version_hits = 0
        self.gets: list[str] = []  # paths of every GET, in order
        self.streams_cut = 0  # streams the client closed before [DONE]
        self._lock = threading.Lock()
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
                with server._lock:
                    server.gets.append(self.path)
                if self.path == "/version":
                    with server._lock:
                        server.version_hits += 1
                    if server.vllm:
                        return self._send(200, {"version": "0.32.0"})
                if self.path == "/v1/models" and server.lora:  # as vLLM: adapters' root
                    with server._lock:
                        adapters = dict(server.adapters)
                    return self._send(200, {"object": "list", "data": [
                        {"id": server.base_model, "object": "model", "root": "base-dir",
                         "parent": None},
                        *({"id": n, "object": "model", "root": path,
                           "parent": server.base_model} for n, path in adapters.items())]})
                if self.path == "/metrics" and server.lora:
                    data = (b'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
                            b'waiting_lora_adapters=""} 1.7e+09\n')
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                if server.status != 200:
                    message = (server.error_message(body) if server.error_message
                               else "scripted failure")
                    return self._send(server.status, {"error": {"message": message}})
                if server.lora:
                    answer = server.lora_answer(self.path, body)
                    if answer is not None:
                        return self._send(*answer)
                if body.get("stream"):
                    return self._stream(body)
                self._send(200, server.completion(body))

            def _stream(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                try:
                    for event in server.stream_events(body):
                        self.wfile.write(b"data: " + event.encode() + b"\n\n")
                        self.wfile.flush()
                        if server.chunk_delay_s:
                            time.sleep(server.chunk_delay_s)
                except (BrokenPipeError, ConnectionResetError):
                    with server._lock:
                        server.streams_cut += 1

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    # -- what to answer -----------------------------------------------------------------------
    def lora_answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        """vLLM's answer to an adapter request, or None for a request served as usual."""
        name = body.get("lora_name")
        if path == "/v1/load_lora_adapter":
            with self._lock:
                if name in self.adapters:
                    return 400, {"error": {"message": f"The lora adapter '{name}' has already "
                                 "been loaded. If you want to load the adapter in place, set "
                                 "'load_inplace' to True."}}
            time.sleep(self.load_delay_s)
            with self._lock:
                self.adapters[name] = body["lora_path"]
                self.loads += 1
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if self.unload_status != 200:
                return self.unload_status, {"error": {"message": "scripted unload failure"}}
            with self._lock:
                if self.adapters.pop(name, None) is None:
                    return 404, {"error": {"message": f"The lora adapter '{name}' cannot be "
                                 "found."}}
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        model = body.get("model")
        with self._lock:
            known = model == self.base_model or model in self.adapters
        if not known:
            return 404, {"error": {"message": f"The model `{model}` does not exist."}}
        return None

    def ids(self, body: dict[str, Any]) -> tuple[list[int], list[int]]:
        if self.ids_for is not None:
            return self.ids_for(body)
        return [1, 2, 3, len(body["messages"])], list(self.completion_ids)

    @staticmethod
    def logprob_entries(ids: list[int], start: int = 0) -> list[dict[str, Any]]:
        return [{"token": str(t), "logprob": -0.5 - 0.25 * (start + i), "bytes": [],
                 "top_logprobs": []} for i, t in enumerate(ids)]

    def answer(self, body: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
        """(reply text, tool calls) for this request."""
        return self.script(body) if self.script else (self.reply, self.tool_calls)

    @staticmethod
    def _tool_calls_message(calls: list[dict[str, str]]) -> list[dict[str, Any]]:
        return [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt_ids, completion_ids = self.ids(body)
        reply, calls = self.answer(body)
        want_ids = self.vllm and body.get("return_token_ids")
        choices = []
        for i in range(body.get("n") or 1):
            ids = [t + 100 * i for t in completion_ids]
            choice: dict[str, Any] = {
                "index": i, "finish_reason": "tool_calls" if calls else "stop",
                "message": {"role": "assistant", "content": (
                    self.choice_replies[i % len(self.choice_replies)] if self.choice_replies
                    else reply)},
                "logprobs": None,
            }
            if calls:
                choice["message"]["tool_calls"] = self._tool_calls_message(calls)
            if body.get("logprobs"):
                choice["logprobs"] = {"content": self.logprob_entries(ids)}
            if self.vllm:
                choice["token_ids"] = ids if want_ids else None
            choices.append(choice)
        with self._lock:
            self.responses += 1
            number = self.responses
        out: dict[str, Any] = {
            "id": f"chatcmpl-scripted-{number}" if self.unique_ids else "chatcmpl-scripted",
            "object": "chat.completion", "created": 1,
            "model": body["model"], "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                      "total_tokens": len(prompt_ids) + len(completion_ids)},
        }
        if self.vllm:
            out["prompt_token_ids"] = prompt_ids if want_ids else None
        return out

    @staticmethod
    def _deltas(n_tokens: int, reply: str, calls: list[dict[str, str]]) -> list[dict[str, Any]]:
        """The content of the token chunks of one choice: text pieces, then tool-call pieces."""
        deltas: list[dict[str, Any]] = []
        text = reply or ""
        pieces = max(1, n_tokens - 2 * len(calls)) if text else 0
        step = -(-len(text) // pieces) if pieces else 0
        deltas += [{"content": text[k * step:(k + 1) * step]} for k in range(pieces)]
        for position, call in enumerate(calls):
            deltas.append({"tool_calls": [{"index": position, "id": call["id"], "type": "function",
                                           "function": {"name": call["name"], "arguments": ""}}]})
            args = call["arguments"]
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                deltas.append({"tool_calls": [{"index": position,
                                               "function": {"arguments": piece}}]})
        while len(deltas) < n_tokens:
            deltas.append({"content": ""})
        return deltas

    def stream_events(self, body: dict[str, Any]) -> list[str]:
        prompt_ids, completion_ids = self.ids(body)
        reply, calls = self.answer(body)
        want_ids = self.vllm and body.get("return_token_ids")
        n = body.get("n") or 1
        head = {"id": "chatcmpl-scripted-stream", "object": "chat.completion.chunk",
                "created": 1, "model": body["model"]}
        events: list[dict[str, Any]] = []
        for i in range(n):
            first: dict[str, Any] = dict(head, choices=[{
                "index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}])
            if self.vllm:
                first["prompt_token_ids"] = prompt_ids if want_ids else None
                first["prompt_text"] = None
            events.append(first)
        per_choice = []
        for i in range(n):
            ids = [t + 100 * i for t in completion_ids]
            deltas = self._deltas(len(ids), reply, calls)
            chunks = []
            for k, delta in enumerate(deltas):
                token = ids[k:k + 1]
                choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None,
                                          "finish_reason": None}
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": self.logprob_entries(token, k)}
                chunk = dict(head, choices=[choice])
                if k == len(deltas) - 1:
                    choice["finish_reason"] = "tool_calls" if calls else "stop"
                    if self.vllm:
                        choice["stop_reason"] = None
                    chunk["system_fingerprint"] = FINGERPRINT
                if self.vllm:
                    choice["token_ids"] = token if want_ids else None
                chunks.append(chunk)
            per_choice.append(chunks)
        for k in range(max(len(c) for c in per_choice)):  # interleave the choices
            events += [chunks[k] for chunks in per_choice if k < len(chunks)]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(dict(head, choices=[], usage={
                "prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids) * n,
                "total_tokens": len(prompt_ids) + len(completion_ids) * n},
                system_fingerprint=FINGERPRINT))
        out = [json.dumps(e) for e in events]
        if self.stream_error_after is not None:
            out = out[:self.stream_error_after] + [json.dumps({"error": {
                "object": "error", "message": (self.error_message(body) if self.error_message
                                               else "scripted stream failure"),
                "type": "InternalServerError", "param": None, "code": 500}})]
        return out + ["[DONE]"]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
