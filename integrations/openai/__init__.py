"""OpenAI client instrumentor: a ``chat {model}`` span per ``chat.completions.create``.

When the server is vLLM, the call also asks for the token ids the server saw and produced
(``return_token_ids``) and their logprobs, and records them on the span: training must use the
ids the model really sampled, never a re-tokenization of the text. The caller still gets the
response it would have had without us: fields we asked for on its behalf are reset to what the
server sends when nobody asks.

Which servers are vLLM is learned once per base URL from ``GET /version`` (``probe.py``); any
other server gets exactly the request the caller made.

Streaming (``stream=True``, sync and async) returns the SDK's stream wrapped in a proxy that
records each chunk and ends the span exactly once (``streams.py``). We never add
``stream_options`` (that would add a chunk the caller did not ask for), so a stream's span has
token usage only when the caller asked for it. ``with_raw_response`` and
``with_streaming_response`` calls are recorded when the caller calls ``parse()``.

What is recorded follows ``AGL_BRIDGE_CAPTURE`` (``agl_bridge.capture``), read at each call:
``none`` asks the server for nothing and records no ids, text or tool names; ``token_ids``
(default) adds ids, logprobs, offered tool names and the names and ids of the tools called;
``messages`` adds the input and output messages, tool definitions and tool-call arguments.

The package, by concern: ``probe`` (is the server vLLM), ``request`` (what we ask for and record
before the call), ``raw`` (ids and logprobs read from the server's JSON before the SDK builds
models of it), ``response`` (what the answer puts on the span), ``streams`` (stream proxies),
``wrappers`` (the tracing wrappers of ``create``), ``routing`` (alias routing) and ``patch``
(the one patch on ``create`` that routing and tracing share). This module only wires them.

``instrument()`` also turns alias routing on (``routing.py``; ``instrument(routing=False)`` does
not). ``uninstrument()`` stops tracing only: routing decides which adapter answers and is not
tracing, so it stays on until ``disable_routing()``. ``enable_routing``, ``disable_routing`` and
``routing_enabled`` (``routing.py``) are public here. The live prompt swap (``prompt_swap.py``:
an agent's system message replaced by the live version of its prompt, with
``AGL_BRIDGE_PROMPTS`` set) is turned on and off with routing, and is public here too.
"""

from __future__ import annotations

import os
from typing import Any

from agl_bridge.integrations.instrumentor import Instrumentor

from . import patch, raw
from .probe import ServerProbe
from .prompt_swap import disable_prompt_swap, enable_prompt_swap, prompt_swap_enabled
from .routing import disable_routing, enable_routing, routing_enabled
from .wrappers import MODES, TOKEN_IDS_ENV, ChatTracing

__all__ = ["MODES", "TOKEN_IDS_ENV", "OpenAIInstrumentor", "RoutingInstrumentor", "ServerProbe",
           "disable_prompt_swap", "disable_routing", "enable_prompt_swap", "enable_routing",
           "prompt_swap_enabled", "routing_enabled"]


class OpenAIInstrumentor(Instrumentor):
    """Traces ``chat.completions.create`` of ``openai.OpenAI`` and ``openai.AsyncOpenAI``.

    ``instrument(token_ids="auto" | "always" | "never")``: ask for vLLM token ids when the probe
    says the server is vLLM (default; also read from ``AGL_BRIDGE_TOKEN_IDS``), on every call, or
    never. ``instrument(routing=False)``: do not turn alias routing on.
    """

    # AGL_BRIDGE_AUTO instruments when this module is first imported, not at start-up
    hook_module = "openai"
    requires = ("openai >= 1.40",)
    _tracing: ChatTracing | None = None

    def _instrument(self, **kwargs: Any) -> None:
        from openai import AsyncStream, Stream

        mode = kwargs.get("token_ids") or os.environ.get(TOKEN_IDS_ENV, "auto")
        self._tracing = ChatTracing(self.tracer(kwargs), mode, kwargs.get("probe") or ServerProbe(),
                                    (Stream, AsyncStream))
        if kwargs.get("routing", True):
            enable_routing()
            enable_prompt_swap()
        raw.install()
        patch.set_tracing(self._tracing)

    def _uninstrument(self, **kwargs: Any) -> None:
        # clients that bound ``create`` while we were on (with_raw_response) still call the
        # patch, which reads the slot at each call: they stop being traced too
        patch.set_tracing(None)
        raw.uninstall()
        self._tracing = None

    @property
    def probe(self) -> ServerProbe | None:
        """The server probe of the current instrumentation (None when not instrumented)."""
        tracing = getattr(self, "_tracing", None)
        return tracing.probe if tracing is not None else None


class RoutingInstrumentor(Instrumentor):
    """Alias routing alone (entry point ``agl_bridge_routing``): for a process that disables
    the tracing instrumentor (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=agl_bridge_openai``) yet
    must follow hot-swaps. Tracing, if on, is unaffected."""

    hook_module = "openai"
    requires = OpenAIInstrumentor.requires

    def _instrument(self, **kwargs: Any) -> None:
        enable_routing()
        enable_prompt_swap()

    def _uninstrument(self, **kwargs: Any) -> None:
        disable_routing()
        disable_prompt_swap()
