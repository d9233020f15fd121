"""The response side: what the server answered, put on the span, and the caller's response
given back as it would have been without us.

A whole response and a stream both end here: the stream side (``streams.py``) accumulates its
chunks into the same ``Choice`` records and calls ``common_attributes``/``record``, so both kinds
of call produce the same attributes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from wrapt import ObjectProxy

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import set_number_lists

from . import raw
from .raw import Take
from .request import Call, tool_call_part
from .utils import extra, to_json


class Choice:
    """One choice of a response, as recorded (filled from a message or from stream deltas)."""

    __slots__ = ("finish_reason", "index", "legacy_call", "reasoning", "text", "tool_calls")

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


def reasoning_of(obj: Any) -> str | None:
    """vLLM's reasoning text of a message or delta (``reasoning_content`` or ``reasoning``)."""
    fields = extra(obj)
    for key in ("reasoning_content", "reasoning"):
        value = fields.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def choice_from_message(choice: Any) -> Choice:
    out = Choice(getattr(choice, "index", 0) or 0)
    out.finish_reason = getattr(choice, "finish_reason", None)
    message = getattr(choice, "message", None)
    if message is None:
        return out
    if getattr(message, "content", None):
        out.text.append(message.content)
    reasoning = reasoning_of(message)
    if reasoning:
        out.reasoning.append(reasoning)
    for i, call in enumerate(getattr(message, "tool_calls", None) or ()):
        part = tool_call_part(call)
        out.tool_calls[i] = {"id": part["id"], "name": part["name"],
                             "arguments": [part["arguments"] or ""]}
    legacy = getattr(message, "function_call", None)
    if legacy is not None:
        out.legacy_call = {"name": legacy.name, "arguments": [legacy.arguments or ""]}
    return out


def common_attributes(call: Call, *, response_id: Any, model: Any, choices: list[Choice],
                      usage: Any) -> dict[str, Any]:
    """Id, model (the version that answered), finish reasons, usage, tool calls, output text."""
    attrs: dict[str, Any] = {}
    if response_id:
        attrs[sc.GEN_AI_RESPONSE_ID] = response_id
    if model:
        attrs[sc.GEN_AI_RESPONSE_MODEL] = model
        if not call.scoped_policy:
            attrs[sc.POLICY_VERSION] = model
    choices = sorted(choices, key=lambda c: c.index)
    reasons = [c.finish_reason for c in choices if c.finish_reason]
    if reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    if usage is not None:
        if getattr(usage, "prompt_tokens", None) is not None:
            attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = usage.prompt_tokens
        if getattr(usage, "completion_tokens", None) is not None:
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.completion_tokens
    attrs[sc.SERVER_KIND] = call.server
    first = choices[0] if choices and choices[0].index == 0 else None
    if call.ids and first is not None and first.tool_calls:
        calls = [c for _, c in sorted(first.tool_calls.items())]
        attrs[sc.LLM_TOOL_CALL_NAMES] = [c["name"] or "" for c in calls]
        attrs[sc.LLM_TOOL_CALL_IDS] = [c["id"] or "" for c in calls]
    if call.messages and choices:
        attrs[sc.GEN_AI_OUTPUT_MESSAGES] = to_json([c.output_message() for c in choices])
    return attrs


def record(span: trace.Span, call: Call, attrs: dict[str, Any], prompt_ids: Any,
           completion_ids: Any, logprobs: list[float] | None) -> None:
    """Put ``attrs``, the token ids (whether recorded, and if not why) and logprobs on the span:
    the scalars in one ``set_attributes``, the long number lists without the SDK's per-element
    checks where their element types allow (``agl_bridge.otel.attributes``)."""
    lists: dict[str, list[Any]] = {}
    if not call.ids:
        attrs[sc.TOKEN_IDS_STATUS] = sc.TOKEN_IDS_NOT_CAPTURED
    else:
        if prompt_ids is not None and completion_ids is not None:
            lists[sc.PROMPT_TOKEN_IDS] = list(prompt_ids)
            lists[sc.COMPLETION_TOKEN_IDS] = list(completion_ids)
            attrs[sc.TOKEN_IDS_STATUS] = sc.TOKEN_IDS_RECORDED
        else:
            attrs[sc.TOKEN_IDS_STATUS] = (sc.TOKEN_IDS_MISSING if call.server == "vllm"
                                          else sc.TOKEN_IDS_NOT_REQUESTED)
        if logprobs:
            lists[sc.COMPLETION_LOGPROBS] = logprobs
    span.set_attributes(attrs)
    set_number_lists(span, lists)


def record_response(span: trace.Span, result: Any, call: Call) -> None:
    """Put what the server answered on the span, then undo what we asked on the caller's behalf
    (done already, in the body, when ``raw.py`` read it: the models never had the fields)."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, list):  # raw responses never get here: see RawResponseProxy
        return
    attrs = common_attributes(call, response_id=getattr(result, "id", None),
                              model=getattr(result, "model", None),
                              choices=[choice_from_message(c) for c in choices],
                              usage=getattr(result, "usage", None))
    take = call.take
    if take is not None and take.absorbed:
        record(span, call, attrs, take.prompt_ids, take.completion_ids, take.logprobs)
        return
    ids, logprobs = model_ids(choices[0]) if choices else (None, None)
    record(span, call, attrs, getattr(result, "prompt_token_ids", None), ids, logprobs)
    give_back(result, call)


def model_ids(choice: Any) -> tuple[Any, list[float] | None]:
    """A choice's completion ids and logprobs as the SDK's models hold them (when the raw take
    could not read the body)."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    return (getattr(choice, "token_ids", None),
            [float(t.logprob) for t in content] if content else None)


def give_back(result: Any, call: Call) -> None:
    """Give the caller the response it would have had: vLLM sends the fields we asked for on
    its behalf as null when the request does not ask for them."""
    choices = result.choices
    if call.injected_ids:
        if "prompt_token_ids" in extra(result):
            result.prompt_token_ids = None
        for choice in choices:
            if "token_ids" in extra(choice):
                choice.token_ids = None
    if call.injected_logprobs:
        for choice in choices:
            choice.logprobs = None


class RawResponseProxy(ObjectProxy):
    """What ``with_raw_response`` / ``with_streaming_response`` return, as the caller knows it.

    langchain-openai calls ``with_raw_response.create()`` then ``parse()`` at once.
    The chat completion (or stream) exists only once the caller calls ``parse()``: that is
    where it is recorded (a stream: wrapped, and its span ends with it), and where the fields we
    asked for are reset. A raw response never parsed ends its span when it is collected. The
    raw HTTP body (``.content``, ``.text``, ``iter_lines()``) is the server's and keeps them.
    """

    def __init__(self, wrapped: Any, finish: Callable[[Any], Any], span: trace.Span,
                 take: Take | None = None) -> None:
        super().__init__(wrapped)
        self._self_finish = finish
        self._self_span = span
        self._self_take = take  # reads the body while parse() builds the models
        self._self_parsed: tuple[Any, Any] | None = None  # (parsed, what the caller got)

    def _self_done(self, parsed: Any) -> Any:
        if self._self_parsed is None:  # the first parse() is the call's result: record it
            self._self_parsed = (parsed, self._self_finish(parsed))
        if parsed is self._self_parsed[0]:  # the SDK caches parse(): same object, same answer
            return self._self_parsed[1]
        return parsed  # parse(to=...) into something else: not ours to record

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        take = self._self_take
        token = raw.activate(take) if take is not None else None
        try:
            parsed = self.__wrapped__.parse(*args, **kwargs)
        finally:
            if token is not None:
                raw.deactivate(token)
        if inspect.isawaitable(parsed):  # AsyncAPIResponse.parse is a coroutine
            async def finish() -> Any:
                token = raw.activate(take) if take is not None else None
                try:
                    value = await parsed
                finally:
                    if token is not None:
                        raw.deactivate(token)
                return self._self_done(value)

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
