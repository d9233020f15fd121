"""OpenAI client instrumentor: a ``chat {model}`` span per ``chat.completions.create``.

When the server is vLLM, the call also asks for the token ids the server saw and produced
(``return_token_ids``) and their logprobs, and records them on the span: training must use the
ids the model really sampled, never a re-tokenization of the text. The caller still gets the
response it would have had without us: fields we asked for on its behalf are reset to what the
server sends when nobody asks.

Which servers are vLLM is learned once per base URL from ``GET /version`` (vLLM answers it with
``{"version": ...}``); any other server gets exactly the request the caller made.
Streaming calls pass through untraced in this version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from opentelemetry.trace import SpanKind
from wrapt import wrap_function_wrapper

from agl_bridge import semconv as sc
from agl_bridge._version import __version__
from agl_bridge.scope import current_scope, scope_attributes

logger = logging.getLogger(__name__)

_MODULE = "openai.resources.chat.completions"
TOKEN_IDS_ENV = "AGL_BRIDGE_TOKEN_IDS"  # auto (probe the server) | always | never
_MODES = ("auto", "always", "never")


def _given(value: Any) -> bool:
    """False for None and the openai SDK's ``omit``/``NOT_GIVEN`` sentinels."""
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


class ServerProbe:
    """Remembers, per base URL, whether the server is vLLM. One ``GET /version`` per URL."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self._timeout = timeout_s
        self._kinds: dict[str, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def version_url(base_url: str) -> str:
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return root + "/version"

    def cached(self, base_url: str) -> str | None:
        return self._kinds.get(base_url)

    def kind(self, base_url: str) -> str:
        """``"vllm"`` or ``"other"``; network errors count as other (and are remembered)."""
        found = self._kinds.get(base_url)
        if found is not None:
            return found
        kind = "other"
        try:
            with urllib.request.urlopen(self.version_url(base_url), timeout=self._timeout) as r:
                body = json.loads(r.read(4096) or b"{}")
                if isinstance(body, dict) and "version" in body:
                    kind = "vllm"
        except (urllib.error.URLError, OSError, ValueError):
            pass
        with self._lock:
            self._kinds.setdefault(base_url, kind)
        return self._kinds[base_url]


class _Injected:
    __slots__ = ("token_ids", "logprobs")

    def __init__(self) -> None:
        self.token_ids = False
        self.logprobs = False


def _inject(kwargs: dict[str, Any], want_ids: bool) -> tuple[dict[str, Any], _Injected]:
    injected = _Injected()
    if not want_ids:
        return kwargs, injected
    kwargs = dict(kwargs)
    extra = dict(kwargs.get("extra_body") or {})
    if "return_token_ids" not in extra:
        extra["return_token_ids"] = True
        injected.token_ids = True
    kwargs["extra_body"] = extra
    if not _given(kwargs.get("logprobs")):
        kwargs["logprobs"] = True
        injected.logprobs = True
    return kwargs, injected


def _request_attributes(kwargs: dict[str, Any], instance: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_OPENAI,
    }
    for key, attr in (
        ("model", sc.GEN_AI_REQUEST_MODEL),
        ("temperature", sc.GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", sc.GEN_AI_REQUEST_TOP_P),
        ("seed", sc.GEN_AI_REQUEST_SEED),
        ("n", sc.GEN_AI_REQUEST_CHOICE_COUNT),
    ):
        value = kwargs.get(key)
        if _given(value):
            attrs[attr] = value
    max_tokens = kwargs.get("max_completion_tokens")
    if not _given(max_tokens):
        max_tokens = kwargs.get("max_tokens")
    if _given(max_tokens):
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    url = getattr(getattr(instance, "_client", None), "base_url", None)
    if url is not None:
        if url.host:
            attrs[sc.SERVER_ADDRESS] = url.host
        if url.port:
            attrs[sc.SERVER_PORT] = url.port
    attrs.update(scope_attributes())
    return attrs


def _record_response(span: trace.Span, result: Any, injected: _Injected, server: str) -> None:
    """Put what the server answered on the span, then undo what we asked on the caller's behalf."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, list):  # e.g. a raw response from .with_raw_response
        return
    if getattr(result, "id", None):
        span.set_attribute(sc.GEN_AI_RESPONSE_ID, result.id)
    if getattr(result, "model", None):
        span.set_attribute(sc.GEN_AI_RESPONSE_MODEL, result.model)
        if sc.POLICY_VERSION not in scope_keys():
            span.set_attribute(sc.POLICY_VERSION, result.model)
    reasons = [c.finish_reason for c in choices if getattr(c, "finish_reason", None)]
    if reasons:
        span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, reasons)
    usage = getattr(result, "usage", None)
    if usage is not None:
        if usage.prompt_tokens is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
        if usage.completion_tokens is not None:
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
    span.set_attribute(sc.SERVER_KIND, server)

    prompt_ids = getattr(result, "prompt_token_ids", None)
    first = choices[0] if choices else None
    completion_ids = getattr(first, "token_ids", None) if first is not None else None
    if prompt_ids is not None and completion_ids is not None:
        span.set_attribute(sc.PROMPT_TOKEN_IDS, list(prompt_ids))
        span.set_attribute(sc.COMPLETION_TOKEN_IDS, list(completion_ids))
        span.set_attribute(sc.TOKEN_IDS_STATUS, sc.TOKEN_IDS_RECORDED)
    else:
        status = sc.TOKEN_IDS_MISSING if server == "vllm" else sc.TOKEN_IDS_NOT_REQUESTED
        span.set_attribute(sc.TOKEN_IDS_STATUS, status)
    content = getattr(getattr(first, "logprobs", None), "content", None)
    if content:
        span.set_attribute(sc.COMPLETION_LOGPROBS, [float(t.logprob) for t in content])

    # Give the caller the response it would have had: vLLM sends these fields as null when the
    # request does not ask for them.
    if injected.token_ids:
        if "prompt_token_ids" in (result.model_extra or {}):
            result.prompt_token_ids = None
        for choice in choices:
            if "token_ids" in (choice.model_extra or {}):
                choice.token_ids = None
    if injected.logprobs:
        for choice in choices:
            choice.logprobs = None


def scope_keys() -> set[str]:
    return {sc.SCOPE_ATTRIBUTES[k] for k in current_scope()}


class OpenAIInstrumentor(BaseInstrumentor):
    """Traces ``chat.completions.create`` of ``openai.OpenAI`` and ``openai.AsyncOpenAI``.

    ``instrument(token_ids="auto" | "always" | "never")``: ask for vLLM token ids when the probe
    says the server is vLLM (default; also read from ``AGL_BRIDGE_TOKEN_IDS``), on every call, or
    never.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("openai >= 1.40",)

    def _instrument(self, **kwargs: Any) -> None:
        provider = kwargs.get("tracer_provider")
        self._tracer = trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, provider)
        mode = kwargs.get("token_ids") or os.environ.get(TOKEN_IDS_ENV, "auto")
        if mode not in _MODES:
            raise ValueError(f"token_ids / {TOKEN_IDS_ENV} must be one of {_MODES}, got {mode!r}")
        self._mode = mode
        self.probe = kwargs.get("probe") or ServerProbe()
        wrap_function_wrapper(_MODULE, "Completions.create", self._sync_create)
        wrap_function_wrapper(_MODULE, "AsyncCompletions.create", self._async_create)

    def _uninstrument(self, **kwargs: Any) -> None:
        import openai.resources.chat.completions as mod

        unwrap(mod.Completions, "create")
        unwrap(mod.AsyncCompletions, "create")

    # -- decisions --------------------------------------------------------------------------
    def _server(self, instance: Any) -> tuple[str, bool]:
        """(server kind, whether to ask for token ids) for a call's client."""
        if self._mode == "never":
            return "unknown", False
        if self._mode == "always":
            return "vllm", True
        kind = self.probe.kind(str(instance._client.base_url))
        return kind, kind == "vllm"

    # -- wrappers ---------------------------------------------------------------------------
    def _sync_create(self, wrapped, instance, args, kwargs):
        if kwargs.get("stream") is True or not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        server, want_ids = self._server(instance)
        call_kwargs, injected = _inject(kwargs, want_ids)
        with self._span(kwargs, instance) as span:
            result = self._call(span, wrapped, args, call_kwargs)
            _record_response(span, result, injected, server)
            return result

    async def _async_create(self, wrapped, instance, args, kwargs):
        if kwargs.get("stream") is True or not is_instrumentation_enabled():
            return await wrapped(*args, **kwargs)
        base_url = str(instance._client.base_url)
        if self._mode == "auto" and self.probe.cached(base_url) is None:
            await asyncio.to_thread(self.probe.kind, base_url)  # never block the event loop
        server, want_ids = self._server(instance)
        call_kwargs, injected = _inject(kwargs, want_ids)
        with self._span(kwargs, instance) as span:
            try:
                result = await wrapped(*args, **call_kwargs)
            except BaseException as exc:
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
                raise
            _record_response(span, result, injected, server)
            return result

    def _span(self, kwargs: dict[str, Any], instance: Any):
        model = kwargs.get("model") if _given(kwargs.get("model")) else None
        return self._tracer.start_as_current_span(
            sc.chat_span_name(model),
            kind=SpanKind.CLIENT,
            attributes=_request_attributes(kwargs, instance),
        )

    @staticmethod
    def _call(span: trace.Span, wrapped, args, kwargs):
        try:
            return wrapped(*args, **kwargs)
        except BaseException as exc:
            span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
            raise
