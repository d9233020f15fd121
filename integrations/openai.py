"""OpenAI client instrumentor: a ``chat {model}`` span per ``chat.completions.create``.

When the server is vLLM, the call also asks for the token ids the server saw and produced
(``return_token_ids``) and their logprobs, and records them on the span: training must use the
ids the model really sampled, never a re-tokenization of the text. The caller still gets the
response it would have had without us: fields we asked for on its behalf are reset to what the
server sends when nobody asks.

Which servers are vLLM is learned once per base URL from ``GET /version`` (vLLM answers it with
``{"version": ...}``); any other server gets exactly the request the caller made.

Streaming (``stream=True``, sync and async) returns the SDK's stream wrapped in a proxy that
records each chunk as it passes and ends the span exactly once: when the stream is exhausted,
raises, is closed (``close()``, ``with``/``async with`` exit, an early ``break`` then close) or
is garbage collected. vLLM 0.32 streams the ids like this (observed on a real server):

* the first chunk of each choice (the ``role`` delta) carries the top-level
  ``prompt_token_ids`` (a list when asked, ``null`` when not) and ``prompt_text: null``;
  its choice has no ``token_ids`` key;
* every later chunk's choice carries ``token_ids``: the ids of that chunk's tokens when asked,
  ``null`` when not; its ``logprobs`` is ``{"content": [...]}`` when asked, ``null`` when not;
* with ``stream_options.include_usage`` a last chunk has ``choices: []`` and the usage.

We never add ``stream_options`` (that would add a chunk the caller did not ask for), so a
stream's span has token usage only when the caller asked for it. For ``n > 1`` the ids and
logprobs are choice 0's; the finish reasons are every choice's. ``with_raw_response`` and
``with_streaming_response`` calls are recorded when the caller calls ``parse()``.

What is recorded follows ``AGL_BRIDGE_CAPTURE`` (``agl_bridge.capture``), read at each call:
``none`` asks the server for nothing and records no ids, text or tool names; ``token_ids``
(default) adds ids, logprobs, offered tool names and the names and ids of the tools called;
``messages`` adds the input and output messages, tool definitions and tool-call arguments.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from opentelemetry.trace import SpanKind, Status, StatusCode
from wrapt import ObjectProxy, wrap_function_wrapper

from agl_bridge import semconv as sc
from agl_bridge.aliases import default_table
from agl_bridge._version import __version__
from agl_bridge.capture import CaptureLevel, capture_level
from agl_bridge.scope import scope_attributes

logger = logging.getLogger(__name__)

_MODULE = "openai.resources.chat.completions"
TOKEN_IDS_ENV = "AGL_BRIDGE_TOKEN_IDS"  # auto (probe the server) | always | never
_MODES = ("auto", "always", "never")


def _given(value: Any) -> bool:
    """False for None and the openai SDK's ``omit``/``NOT_GIVEN`` sentinels."""
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj[key]`` for mappings (request params), ``obj.key`` for SDK models."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _extra(model: Any) -> dict[str, Any]:
    """Fields the SDK's pydantic model does not declare (vLLM's ``token_ids`` and friends)."""
    return getattr(model, "model_extra", None) or {}


def _json(value: Any) -> str:
    def default(o: Any) -> Any:
        dump = getattr(o, "model_dump", None)
        if callable(dump):
            return dump(mode="json", exclude_unset=True)
        if isinstance(o, (set, frozenset)):
            return list(o)
        return str(o)

    return json.dumps(value, default=default, ensure_ascii=False)


class ServerProbe:
    """Remembers, per base URL, whether the server is vLLM. One ``GET /version`` per URL."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self._timeout = timeout_s
        self._kinds: dict[str, str] = {}
        self._lock = threading.Lock()
        self._url_locks: dict[str, threading.Lock] = {}

    @staticmethod
    def version_url(base_url: str) -> str:
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return root + "/version"

    def cached(self, base_url: str) -> str | None:
        return self._kinds.get(base_url)

    def kind(self, base_url: str) -> str:
        """``"vllm"`` or ``"other"``; network errors count as other (and are remembered).

        Concurrent first calls for one URL wait for a single probe instead of each sending one.
        """
        found = self._kinds.get(base_url)
        if found is not None:
            return found
        with self._lock:
            url_lock = self._url_locks.setdefault(base_url, threading.Lock())
        with url_lock:
            found = self._kinds.get(base_url)
            if found is not None:
                return found
            kind = "other"
            try:
                with urllib.request.urlopen(self.version_url(base_url),
                                            timeout=self._timeout) as r:
                    body = json.loads(r.read(4096) or b"{}")
                    if isinstance(body, dict) and "version" in body:
                        kind = "vllm"
            except (urllib.error.URLError, OSError, ValueError):
                pass
            with self._lock:
                self._kinds.setdefault(base_url, kind)
            return self._kinds[base_url]


def _resolve_alias(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Ask for the live version of an alias (``AGL_BRIDGE_ALIASES``): running agents switch to a
    newly published adapter on their next call, with no code change."""
    table = default_table()
    model = kwargs.get("model")
    if table is None or not isinstance(model, str):
        return kwargs, None
    live = table.resolve(model)
    if live is None or live == model:
        return kwargs, None
    return {**kwargs, "model": live}, model


class _Call:
    """What was decided for one call before its request went out."""

    __slots__ = ("kwargs", "level", "server", "injected_ids", "injected_logprobs",
                 "scoped_policy", "stream")

    def __init__(self, kwargs: dict[str, Any], level: CaptureLevel, server: str,
                 want_ids: bool) -> None:
        self.level = level
        self.server = server
        self.stream = kwargs.get("stream") is True
        self.scoped_policy = False
        self.injected_ids = False
        self.injected_logprobs = False
        # Iterables we read for the span must still reach the SDK whole: a generator passed as
        # ``messages`` or ``tools`` is turned into a list once, here.
        readable = [key for key, needed in (("messages", self.messages), ("tools", self.ids),
                                            ("functions", self.ids))
                    if needed and _given(kwargs.get(key))
                    and not isinstance(kwargs[key], (list, tuple))]
        if readable:
            kwargs = dict(kwargs)
            for key in readable:
                kwargs[key] = list(kwargs[key])
        if want_ids:
            kwargs = dict(kwargs)
            extra = dict(kwargs.get("extra_body") or {})
            if "return_token_ids" not in extra:
                extra["return_token_ids"] = True
                self.injected_ids = True
            kwargs["extra_body"] = extra
            if not _given(kwargs.get("logprobs")):
                kwargs["logprobs"] = True
                self.injected_logprobs = True
        self.kwargs = kwargs

    @property
    def ids(self) -> bool:
        return self.level >= CaptureLevel.TOKEN_IDS

    @property
    def messages(self) -> bool:
        return self.level >= CaptureLevel.MESSAGES


# -- request side ------------------------------------------------------------------------------
def _tool_name(tool: Any) -> str | None:
    """Name of a tool definition: ``{"type": "function", "function": {"name": ...}}`` or custom."""
    kind = _get(tool, "type")
    body = _get(tool, kind) if isinstance(kind, str) else None
    name = _get(body, "name") if body is not None else None
    if name is None:  # legacy ``functions=[{"name": ...}]``
        name = _get(tool, "name")
    return name if isinstance(name, str) else None


def _text_parts(content: Any) -> list[dict[str, Any]]:
    """GenAI message parts for an OpenAI ``content`` (a string or a list of content parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts = []
    for part in content:
        if _get(part, "type") == "text":
            parts.append({"type": "text", "content": _get(part, "text")})
        elif _get(part, "type") == "refusal":
            parts.append({"type": "refusal", "content": _get(part, "refusal")})
        else:  # images, audio, files: kept as given (a GenAI "generic" part)
            parts.append(json.loads(_json(part)))
    return parts


def _tool_call_part(call: Any) -> dict[str, Any]:
    kind = _get(call, "type") or "function"
    body = _get(call, kind) or _get(call, "function") or {}
    arguments = _get(body, "arguments")
    if arguments is None:
        arguments = _get(body, "input")  # custom tools
    return {"type": "tool_call", "id": _get(call, "id"), "name": _get(body, "name"),
            "arguments": arguments}


def _input_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages in the GenAI convention's shape (role + parts)."""
    out = []
    for message in messages or ():
        role = _get(message, "role")
        if role in ("tool", "function"):
            parts = [{"type": "tool_call_response",
                      "id": _get(message, "tool_call_id") or _get(message, "name"),
                      "response": _get(message, "content")}]
        else:
            parts = _text_parts(_get(message, "content"))
            for call in _get(message, "tool_calls") or ():
                parts.append(_tool_call_part(call))
            legacy = _get(message, "function_call")
            if legacy:
                parts.append({"type": "tool_call", "id": None, "name": _get(legacy, "name"),
                              "arguments": _get(legacy, "arguments")})
        entry: dict[str, Any] = {"role": role, "parts": parts}
        if _get(message, "name") and role not in ("tool", "function"):
            entry["name"] = _get(message, "name")
        out.append(entry)
    return out


def _content_attributes(kwargs: dict[str, Any], call: _Call) -> dict[str, Any]:
    """Offered tool names (token_ids level); definitions and messages (messages level)."""
    attrs: dict[str, Any] = {}
    tools = [t for key in ("tools", "functions") if _given(kwargs.get(key))
             for t in kwargs[key]]
    names = [n for n in map(_tool_name, tools) if n]
    if names:
        attrs[sc.LLM_TOOL_NAMES] = names
    if tools and call.messages:
        attrs[sc.GEN_AI_TOOL_DEFINITIONS] = _json(tools)
    if call.messages and _given(kwargs.get("messages")):
        attrs[sc.GEN_AI_INPUT_MESSAGES] = _json(_input_messages(kwargs["messages"]))
    return attrs


def _request_attributes(kwargs: dict[str, Any], instance: Any, call: _Call) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_OPENAI,
        sc.LLM_STREAM: call.stream,
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
    if call.ids:
        try:
            attrs.update(_content_attributes(kwargs, call))
        except Exception:  # an odd request must never fail the caller's call
            logger.debug("agl_bridge: could not record the request's content", exc_info=True)
    scope = scope_attributes()
    call.scoped_policy = sc.POLICY_VERSION in scope
    attrs.update(scope)
    return attrs


# -- response side -----------------------------------------------------------------------------
class _Choice:
    """One choice of a response, as recorded (filled from a message or from stream deltas)."""

    __slots__ = ("index", "finish_reason", "text", "reasoning", "tool_calls", "legacy_call")

    def __init__(self, index: int) -> None:
        self.index = index
        self.finish_reason: str | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}  # by position (a stream's tc.index)
        self.legacy_call: dict[str, Any] | None = None

    def output_message(self) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if self.reasoning:
            parts.append({"type": "reasoning", "content": "".join(self.reasoning)})
        if self.text:
            parts.append({"type": "text", "content": "".join(self.text)})
        for _, call in sorted(self.tool_calls.items()):
            parts.append({"type": "tool_call", "id": call["id"], "name": call["name"],
                          "arguments": "".join(call["arguments"])})
        if self.legacy_call:
            parts.append({"type": "tool_call", "id": None, "name": self.legacy_call["name"],
                          "arguments": "".join(self.legacy_call["arguments"])})
        return {"role": "assistant", "parts": parts, "finish_reason": self.finish_reason}


def _reasoning_of(obj: Any) -> str | None:
    extra = _extra(obj)
    for key in ("reasoning_content", "reasoning"):
        value = extra.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _choice_from_message(choice: Any) -> _Choice:
    out = _Choice(getattr(choice, "index", 0) or 0)
    out.finish_reason = getattr(choice, "finish_reason", None)
    message = getattr(choice, "message", None)
    if message is None:
        return out
    if getattr(message, "content", None):
        out.text.append(message.content)
    reasoning = _reasoning_of(message)
    if reasoning:
        out.reasoning.append(reasoning)
    for i, call in enumerate(getattr(message, "tool_calls", None) or ()):
        part = _tool_call_part(call)
        out.tool_calls[i] = {"id": part["id"], "name": part["name"],
                             "arguments": [part["arguments"] or ""]}
    legacy = getattr(message, "function_call", None)
    if legacy is not None:
        out.legacy_call = {"name": legacy.name, "arguments": [legacy.arguments or ""]}
    return out


def _fail(span: trace.Span, exc: BaseException) -> None:
    span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _record_common(span: trace.Span, call: _Call, *, response_id: Any, model: Any,
                   choices: list[_Choice], usage: Any) -> None:
    if response_id:
        span.set_attribute(sc.GEN_AI_RESPONSE_ID, response_id)
    if model:
        span.set_attribute(sc.GEN_AI_RESPONSE_MODEL, model)
        if not call.scoped_policy:
            span.set_attribute(sc.POLICY_VERSION, model)
    choices = sorted(choices, key=lambda c: c.index)
    reasons = [c.finish_reason for c in choices if c.finish_reason]
    if reasons:
        span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, reasons)
    if usage is not None:
        if getattr(usage, "prompt_tokens", None) is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
        if getattr(usage, "completion_tokens", None) is not None:
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
    span.set_attribute(sc.SERVER_KIND, call.server)
    first = choices[0] if choices and choices[0].index == 0 else None
    if call.ids and first is not None and first.tool_calls:
        calls = [c for _, c in sorted(first.tool_calls.items())]
        span.set_attribute(sc.LLM_TOOL_CALL_NAMES, [c["name"] or "" for c in calls])
        span.set_attribute(sc.LLM_TOOL_CALL_IDS, [c["id"] or "" for c in calls])
    if call.messages and choices:
        span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES,
                           _json([c.output_message() for c in choices]))


def _record_ids(span: trace.Span, call: _Call, prompt_ids: Any, completion_ids: Any,
                logprobs: list[float] | None) -> None:
    if not call.ids:
        span.set_attribute(sc.TOKEN_IDS_STATUS, sc.TOKEN_IDS_NOT_CAPTURED)
        return
    if prompt_ids is not None and completion_ids is not None:
        span.set_attribute(sc.PROMPT_TOKEN_IDS, list(prompt_ids))
        span.set_attribute(sc.COMPLETION_TOKEN_IDS, list(completion_ids))
        span.set_attribute(sc.TOKEN_IDS_STATUS, sc.TOKEN_IDS_RECORDED)
    else:
        status = sc.TOKEN_IDS_MISSING if call.server == "vllm" else sc.TOKEN_IDS_NOT_REQUESTED
        span.set_attribute(sc.TOKEN_IDS_STATUS, status)
    if logprobs:
        span.set_attribute(sc.COMPLETION_LOGPROBS, logprobs)


def _record_response(span: trace.Span, result: Any, call: _Call) -> None:
    """Put what the server answered on the span, then undo what we asked on the caller's behalf."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, list):  # raw responses never get here: see _RawResponseProxy
        return
    _record_common(span, call, response_id=getattr(result, "id", None),
                   model=getattr(result, "model", None),
                   choices=[_choice_from_message(c) for c in choices],
                   usage=getattr(result, "usage", None))
    first = choices[0] if choices else None
    content = getattr(getattr(first, "logprobs", None), "content", None)
    _record_ids(span, call, getattr(result, "prompt_token_ids", None),
                getattr(first, "token_ids", None) if first is not None else None,
                [float(t.logprob) for t in content] if content else None)

    # Give the caller the response it would have had: vLLM sends these fields as null when the
    # request does not ask for them.
    if call.injected_ids:
        if "prompt_token_ids" in _extra(result):
            result.prompt_token_ids = None
        for choice in choices:
            if "token_ids" in _extra(choice):
                choice.token_ids = None
    if call.injected_logprobs:
        for choice in choices:
            choice.logprobs = None


class _StreamRecorder:
    """Accumulates a stream's chunks and ends its span exactly once."""

    def __init__(self, span: trace.Span, call: _Call) -> None:
        self.span = span
        self.call = call
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] | None = None
        self.logprobs: list[float] = []
        self.choices: dict[int, _Choice] = {}
        self._ended = False
        self._lock = threading.Lock()

    def process(self, chunk: Any) -> None:
        """Record one chunk, then reset in it what the caller did not ask for."""
        try:
            self._accumulate(chunk)
        except Exception:  # never let recording break the caller's stream
            logger.debug("agl_bridge: could not record a stream chunk", exc_info=True)
        call = self.call
        choices = getattr(chunk, "choices", None) or ()
        if call.injected_ids:
            if _extra(chunk).get("prompt_token_ids") is not None:
                chunk.prompt_token_ids = None
            for choice in choices:
                if _extra(choice).get("token_ids") is not None:
                    choice.token_ids = None
        if call.injected_logprobs:
            for choice in choices:
                if getattr(choice, "logprobs", None) is not None:
                    choice.logprobs = None

    def _accumulate(self, chunk: Any) -> None:
        if self.response_id is None and getattr(chunk, "id", None):
            self.response_id = chunk.id
        if self.model is None and getattr(chunk, "model", None):
            self.model = chunk.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        call = self.call
        if call.ids and self.prompt_ids is None:
            prompt_ids = _extra(chunk).get("prompt_token_ids")
            if prompt_ids is not None:
                self.prompt_ids = list(prompt_ids)
        for choice in getattr(chunk, "choices", None) or ():
            index = getattr(choice, "index", 0) or 0
            acc = self.choices.get(index)
            if acc is None:
                acc = self.choices[index] = _Choice(index)
            if getattr(choice, "finish_reason", None):
                acc.finish_reason = choice.finish_reason
            if call.ids and index == 0:
                token_ids = _extra(choice).get("token_ids")
                if token_ids is not None:
                    if self.completion_ids is None:
                        self.completion_ids = []
                    self.completion_ids.extend(token_ids)
                content = getattr(getattr(choice, "logprobs", None), "content", None)
                if content:
                    self.logprobs.extend(float(t.logprob) for t in content)
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            if call.messages:
                if getattr(delta, "content", None):
                    acc.text.append(delta.content)
                reasoning = _reasoning_of(delta)
                if reasoning:
                    acc.reasoning.append(reasoning)
                legacy = getattr(delta, "function_call", None)
                if legacy is not None:
                    if acc.legacy_call is None:
                        acc.legacy_call = {"name": None, "arguments": []}
                    if legacy.name:
                        acc.legacy_call["name"] = legacy.name
                    if legacy.arguments:
                        acc.legacy_call["arguments"].append(legacy.arguments)
            if call.ids:
                for tc in getattr(delta, "tool_calls", None) or ():
                    slot = acc.tool_calls.get(tc.index)
                    if slot is None:
                        slot = acc.tool_calls[tc.index] = {"id": None, "name": None,
                                                           "arguments": []}
                    if tc.id:
                        slot["id"] = tc.id
                    fn = getattr(tc, "function", None)
                    if fn is not None:
                        if fn.name:
                            slot["name"] = fn.name
                        if fn.arguments and call.messages:
                            slot["arguments"].append(fn.arguments)

    def end(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        span, call = self.span, self.call
        try:
            _record_common(span, call, response_id=self.response_id, model=self.model,
                           choices=list(self.choices.values()), usage=self.usage)
            completion = self.completion_ids
            if completion is None and self.prompt_ids is not None:
                completion = []  # the stream stopped before choice 0 sent a token
            _record_ids(span, call, self.prompt_ids, completion, self.logprobs)
            if exc is not None:
                _fail(span, exc)
        except Exception:
            logger.debug("agl_bridge: could not record a stream", exc_info=True)
        finally:
            span.end()


class _EndsWhenCollected:
    """A stream the caller drops unfinished still ends its span, when it is collected."""

    def __del__(self) -> None:
        recorder = getattr(self, "_self_recorder", None)
        if recorder is not None:
            try:
                recorder.end()
            except Exception:  # pragma: no cover - e.g. at interpreter shutdown
                pass


class _StreamProxy(_EndsWhenCollected, ObjectProxy):
    """The SDK's ``Stream`` as the caller knows it, recording each chunk on the span."""

    def __init__(self, wrapped: Any, recorder: _StreamRecorder) -> None:
        super().__init__(wrapped)
        self._self_recorder = recorder

    def __iter__(self):
        return self

    def __next__(self):
        try:
            chunk = self.__wrapped__.__next__()
        except StopIteration:
            self._self_recorder.end()
            raise
        except BaseException as exc:
            self._self_recorder.end(exc)
            raise
        self._self_recorder.process(chunk)
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_recorder.end()



class _AsyncStreamProxy(_EndsWhenCollected, ObjectProxy):
    """The SDK's ``AsyncStream`` as the caller knows it, recording each chunk on the span."""

    def __init__(self, wrapped: Any, recorder: _StreamRecorder) -> None:
        super().__init__(wrapped)
        self._self_recorder = recorder

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            chunk = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            self._self_recorder.end()
            raise
        except BaseException as exc:
            self._self_recorder.end(exc)
            raise
        self._self_recorder.process(chunk)
        return chunk

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        await self.close()

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_recorder.end()

    async def aclose(self) -> None:
        await self.close()



class _RawResponseProxy(ObjectProxy):
    """What ``with_raw_response`` / ``with_streaming_response`` return, as the caller knows it.

    langchain-openai calls ``with_raw_response.create()`` then ``parse()`` at once.
    The chat completion (or stream) exists only once the caller calls ``parse()``: that is
    where it is recorded (a stream: wrapped, and its span ends with it), and where the fields we
    asked for are reset. A raw response never parsed ends its span when it is collected. The
    raw HTTP body (``.content``, ``.text``, ``iter_lines()``) is the server's and keeps them.
    """

    def __init__(self, wrapped: Any, finish: Any, span: trace.Span) -> None:
        super().__init__(wrapped)
        self._self_finish = finish
        self._self_span = span
        self._self_parsed: tuple[Any, Any] | None = None  # (parsed, what the caller got)

    def _self_done(self, parsed: Any) -> Any:
        if self._self_parsed is None:  # the first parse() is the call's result: record it
            self._self_parsed = (parsed, self._self_finish(parsed))
        if parsed is self._self_parsed[0]:  # the SDK caches parse(): same object, same answer
            return self._self_parsed[1]
        return parsed  # parse(to=...) into something else: not ours to record

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        parsed = self.__wrapped__.parse(*args, **kwargs)
        if inspect.isawaitable(parsed):  # AsyncAPIResponse.parse is a coroutine
            async def finish() -> Any:
                return self._self_done(await parsed)

            return finish()
        return self._self_done(parsed)

    def __enter__(self):
        self.__wrapped__.__enter__()
        return self

    async def __aenter__(self):
        await self.__wrapped__.__aenter__()
        return self

    def __del__(self) -> None:
        try:
            if hasattr(self, "_self_span") and self._self_parsed is None:
                self._self_span.end()
        except Exception:  # pragma: no cover - e.g. at interpreter shutdown
            pass


class OpenAIInstrumentor(BaseInstrumentor):
    """Traces ``chat.completions.create`` of ``openai.OpenAI`` and ``openai.AsyncOpenAI``.

    ``instrument(token_ids="auto" | "always" | "never")``: ask for vLLM token ids when the probe
    says the server is vLLM (default; also read from ``AGL_BRIDGE_TOKEN_IDS``), on every call, or
    never.
    """

    # AGL_BRIDGE_AUTO instruments when this module is first imported, not at start-up
    hook_module = "openai"

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("openai >= 1.40",)

    def _instrument(self, **kwargs: Any) -> None:
        from openai import AsyncStream, Stream

        provider = kwargs.get("tracer_provider")
        self._tracer = trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, provider)
        mode = kwargs.get("token_ids") or os.environ.get(TOKEN_IDS_ENV, "auto")
        if mode not in _MODES:
            raise ValueError(f"token_ids / {TOKEN_IDS_ENV} must be one of {_MODES}, got {mode!r}")
        self._mode = mode
        self._stream_types = (Stream, AsyncStream)
        self.probe = kwargs.get("probe") or ServerProbe()
        self._active = True
        wrap_function_wrapper(_MODULE, "Completions.create", self._sync_create)
        wrap_function_wrapper(_MODULE, "AsyncCompletions.create", self._async_create)

    def _uninstrument(self, **kwargs: Any) -> None:
        import openai.resources.chat.completions as mod

        # openai's with_raw_response binds ``create`` when first used: a client that did so
        # while we were on keeps calling our wrapper, which must then step aside
        self._active = False
        unwrap(mod.Completions, "create")
        unwrap(mod.AsyncCompletions, "create")

    # -- decisions --------------------------------------------------------------------------
    def _needs_probe(self, instance: Any, level: CaptureLevel) -> str | None:
        """The base URL to probe before this call, if one is needed and not yet known."""
        if self._mode != "auto" or level < CaptureLevel.TOKEN_IDS:
            return None
        base_url = str(instance._client.base_url)
        return base_url if self.probe.cached(base_url) is None else None

    def _decide(self, instance: Any, kwargs: dict[str, Any], level: CaptureLevel) -> _Call:
        """Which server this is and what to ask it for. ``none`` asks for nothing."""
        if level < CaptureLevel.TOKEN_IDS:
            server = self.probe.cached(str(instance._client.base_url)) or "unknown"
            return _Call(kwargs, level, server, want_ids=False)
        if self._mode == "never":
            return _Call(kwargs, level, "unknown", want_ids=False)
        if self._mode == "always":
            return _Call(kwargs, level, "vllm", want_ids=True)
        kind = self.probe.kind(str(instance._client.base_url))
        return _Call(kwargs, level, kind, want_ids=kind == "vllm")

    def _start(self, instance: Any, call: _Call, alias: str | None = None) -> trace.Span:
        model = call.kwargs.get("model") if _given(call.kwargs.get("model")) else None
        attributes = _request_attributes(call.kwargs, instance, call)
        if alias is not None:
            attributes[sc.POLICY_ALIAS] = alias
        return self._tracer.start_span(sc.chat_span_name(model), kind=SpanKind.CLIENT,
                                       attributes=attributes)

    def _finish(self, span: trace.Span, result: Any, call: _Call) -> Any:
        """Wrap a stream (its span ends with it) or record a response and end the span."""
        if call.stream and isinstance(result, self._stream_types):
            recorder = _StreamRecorder(span, call)
            if isinstance(result, self._stream_types[1]):
                return _AsyncStreamProxy(result, recorder)
            return _StreamProxy(result, recorder)
        if callable(getattr(result, "parse", None)) and hasattr(result, "http_response"):
            return _RawResponseProxy(result, lambda parsed: self._finish(span, parsed, call),
                                     span)
        try:
            _record_response(span, result, call)
        except Exception:
            logger.debug("agl_bridge: could not record a response", exc_info=True)
        finally:
            span.end()
        return result

    # -- wrappers ---------------------------------------------------------------------------
    def _sync_create(self, wrapped, instance, args, kwargs):
        if not (getattr(self, "_active", False) and is_instrumentation_enabled()):
            return wrapped(*args, **kwargs)
        kwargs, alias = _resolve_alias(kwargs)
        level = capture_level()
        call = self._decide(instance, kwargs, level)
        span = self._start(instance, call, alias)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                result = wrapped(*args, **call.kwargs)
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        return self._finish(span, result, call)

    async def _async_create(self, wrapped, instance, args, kwargs):
        if not (getattr(self, "_active", False) and is_instrumentation_enabled()):
            return await wrapped(*args, **kwargs)
        kwargs, alias = _resolve_alias(kwargs)
        level = capture_level()
        base_url = self._needs_probe(instance, level)
        if base_url is not None:
            await asyncio.to_thread(self.probe.kind, base_url)  # never block the event loop
        call = self._decide(instance, kwargs, level)
        span = self._start(instance, call, alias)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                result = await wrapped(*args, **call.kwargs)
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        return self._finish(span, result, call)
