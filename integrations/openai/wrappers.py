"""The tracing wrappers of ``chat.completions.create``: one ``chat {model}`` span per call.

``ChatTracing`` holds what one ``instrument()`` decided (tracer, token-id mode, probe) and wraps
the sync and async ``create``: decide what to ask the server for, start the span, call, then
record the response, or hand back a stream or raw response whose span ends with it. It runs in
the tracing slot of the shared patch (``patch.py``), after routing: the request it sees already
asks for the live version, and ``alias`` is what the agent asked for; ``prompt`` is the version
of the agent's prompt the swap put in (``prompt_swap.py``). Where a framework's integration put
the agent's prompt into a message it builds around it (``placed_prompt``), the span records
that text apart (``agl_bridge.prompt.text``, at the messages capture level).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind

from agl_bridge import semconv as sc
from agl_bridge.capture import CaptureLevel, capture_level
from agl_bridge.errors import record_error

from . import branches, raw
from .placed import placed_text
from .probe import ServerProbe
from .request import Call, request_attributes
from .response import RawResponseProxy, record_response
from .streams import AsyncStreamProxy, StreamProxy, StreamRecorder
from .utils import given

logger = logging.getLogger(__name__)

TOKEN_IDS_ENV = "AGL_BRIDGE_TOKEN_IDS"  # auto (probe the server) | always | never
MODES = ("auto", "always", "never")


class ChatTracing:
    """Traces ``create`` calls with one tracer, token-id mode and server probe."""

    def __init__(self, tracer: trace.Tracer, mode: str, probe: ServerProbe,
                 stream_types: tuple[type, type]) -> None:
        if mode not in MODES:
            raise ValueError(f"token_ids / {TOKEN_IDS_ENV} must be one of {MODES}, got {mode!r}")
        self.tracer = tracer
        self.mode = mode
        self.probe = probe
        self.stream_types = stream_types  # (Stream, AsyncStream)

    # -- decisions ------------------------------------------------------------------------------
    def needs_probe(self, instance: Any, level: CaptureLevel) -> str | None:
        """The base URL to probe before this call, if one is needed and not yet known."""
        if self.mode != "auto" or level < CaptureLevel.TOKEN_IDS:
            return None
        base_url = str(instance._client.base_url)
        return base_url if self.probe.cached(base_url) is None else None

    def decide(self, instance: Any, kwargs: dict[str, Any], level: CaptureLevel) -> Call:
        """Which server this is and what to ask it for. ``none`` asks for nothing."""
        if level < CaptureLevel.TOKEN_IDS:
            server = self.probe.cached(str(instance._client.base_url)) or "unknown"
            return Call(kwargs, level, server, want_ids=False)
        if self.mode == "never":
            return Call(kwargs, level, "unknown", want_ids=False)
        if self.mode == "always":
            return Call(kwargs, level, "vllm", want_ids=True)
        kind = self.probe.kind(str(instance._client.base_url))
        return Call(kwargs, level, kind, want_ids=kind == "vllm")

    @staticmethod
    def taking(call: Call) -> Any:
        """Let the call's ``Take`` read the bodies the SDK parses until ``raw.deactivate``.

        Only when we asked the server for something on the caller's behalf: then the take
        resets it in the body before the SDK builds models of it. When we asked nothing (ids
        not requested, or the caller asked for them herself) the SDK builds the same models
        either way and the ids are read from them: the same values, without the take's work
        on every body (about 250k instructions a 16-chunk stream, benchmarks/README.md)."""
        if not call.ids or not (call.injected_ids or call.injected_logprobs):
            return None
        call.take = raw.Take(call)
        return raw.activate(call.take)

    # -- the span -------------------------------------------------------------------------------
    def start(self, instance: Any, call: Call, alias: str | None = None,
              prompt: str | None = None) -> trace.Span:
        model = call.kwargs.get("model") if given(call.kwargs.get("model")) else None
        attributes = request_attributes(call.kwargs, instance, call)
        if alias is not None:
            attributes[sc.POLICY_ALIAS] = alias
        if prompt is not None:
            attributes[sc.PROMPT_VERSION] = prompt
        if call.messages:
            own = placed_text()
            if own is not None:
                attributes[sc.PROMPT_TEXT] = own
        branches.start_attributes(call, attributes)
        return self.tracer.start_span(sc.chat_span_name(model), kind=SpanKind.CLIENT,
                                      attributes=attributes)

    def finish(self, span: trace.Span, result: Any, call: Call) -> Any:
        """Wrap a stream (its span ends with it) or record a response and end the span."""
        if call.stream and isinstance(result, self.stream_types):
            recorder = StreamRecorder(span, call)
            if isinstance(result, self.stream_types[1]):
                return AsyncStreamProxy(result, recorder)
            return StreamProxy(result, recorder)
        if callable(getattr(result, "parse", None)) and hasattr(result, "http_response"):
            return RawResponseProxy(result, lambda parsed: self.finish(span, parsed, call), span,
                                    call.take)
        if call.branch is not None and isinstance(getattr(result, "choices", None), list) and (
                result.choices):
            return branches.finish(self.tracer, span, result, call)
        try:
            record_response(span, result, call)
        except Exception:
            logger.debug("agl_bridge: could not record a response", exc_info=True)
        finally:
            span.end()
        return result

    # -- wrappers -------------------------------------------------------------------------------
    def sync_create(self, wrapped, instance, args, kwargs, alias: str | None = None,
                    prompt: str | None = None):
        if not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        level = capture_level()
        call = self.decide(instance, kwargs, level)
        branches.prepare(call)
        span = self.start(instance, call, alias, prompt)
        token = self.taking(call)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                result = wrapped(*args, **call.kwargs)
        except BaseException as exc:
            record_error(span, exc, level=call.level)
            span.end()
            raise
        finally:
            if token is not None:
                raw.deactivate(token)
        return self.finish(span, result, call)

    async def async_create(self, wrapped, instance, args, kwargs, alias: str | None = None,
                           prompt: str | None = None):
        if not is_instrumentation_enabled():
            return await wrapped(*args, **kwargs)
        level = capture_level()
        base_url = self.needs_probe(instance, level)
        if base_url is not None:
            await asyncio.to_thread(self.probe.kind, base_url)  # never block the event loop
        call = self.decide(instance, kwargs, level)
        branches.prepare(call)
        span = self.start(instance, call, alias, prompt)
        token = self.taking(call)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                result = await wrapped(*args, **call.kwargs)
        except BaseException as exc:
            record_error(span, exc, level=call.level)
            span.end()
            raise
        finally:
            if token is not None:
                raw.deactivate(token)
        return self.finish(span, result, call)
