"""The request side: what we ask the server for on the caller's behalf, and what the span records
of the request before it goes out.

A ``Call`` is decided once per ``create()`` and read by the response and stream sides: it says
what capture level applies, which server this is, and which fields we added (so they can be
reset in what the caller gets back).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from agl_bridge import semconv as sc
from agl_bridge.capture import CaptureLevel
from agl_bridge.scope import scope_attributes

from .utils import get, given, to_json

if TYPE_CHECKING:
    from agl_bridge.branching import Branch

    from .raw import Take

logger = logging.getLogger(__name__)


class Call:
    """What was decided for one call before its request went out."""

    __slots__ = (
        "branch",
        "ids",
        "injected_ids",
        "injected_logprobs",
        "kwargs",
        "level",
        "messages",
        "request_attributes",
        "scoped_policy",
        "server",
        "stream",
        "take",
    )

    def __init__(self, kwargs: dict[str, Any], level: CaptureLevel, server: str,
                 want_ids: bool) -> None:
        self.level = level
        self.ids = level >= CaptureLevel.TOKEN_IDS  # record ids, logprobs and tool names
        self.messages = level >= CaptureLevel.MESSAGES  # and the messages themselves
        self.server = server
        self.stream = kwargs.get("stream") is True
        self.scoped_policy = False
        self.injected_ids = False
        self.injected_logprobs = False
        self.take: Take | None = None  # set by the tracing wrapper when ids are recorded
        self.branch: Branch | None = None  # set when this call is sampled K ways (branches.py)
        self.request_attributes: dict[str, Any] | None = None  # kept for a branch's siblings
        # Iterables we read for the span must still reach the SDK whole: a generator passed as
        # ``messages`` or ``tools`` is turned into a list once, here.
        readable = [key for key, needed in (("messages", self.messages), ("tools", self.ids),
                                            ("functions", self.ids))
                    if needed and given(kwargs.get(key))
                    and not isinstance(kwargs[key], (list, tuple))]
        if readable:
            kwargs = dict(kwargs)
            for key in readable:
                kwargs[key] = list(kwargs[key])
        if want_ids:
            # Both go in ``extra_body``, which the SDK merges into the JSON body as it is: the
            # same body as a ``logprobs=True`` parameter, without the SDK's transform of one
            # more typed parameter (about 100k instructions a call, benchmarks/README.md).
            kwargs = dict(kwargs)
            extra = dict(kwargs.get("extra_body") or {})
            if "return_token_ids" not in extra:
                extra["return_token_ids"] = True
                self.injected_ids = True
            if not given(kwargs.get("logprobs")) and "logprobs" not in extra:
                extra["logprobs"] = True
                self.injected_logprobs = True
            kwargs["extra_body"] = extra
        self.kwargs = kwargs



def tool_name(tool: Any) -> str | None:
    """Name of a tool definition: ``{"type": "function", "function": {"name": ...}}`` or custom."""
    kind = get(tool, "type")
    body = get(tool, kind) if isinstance(kind, str) else None
    name = get(body, "name") if body is not None else None
    if name is None:  # legacy ``functions=[{"name": ...}]``
        name = get(tool, "name")
    return name if isinstance(name, str) else None


def text_parts(content: Any) -> list[dict[str, Any]]:
    """GenAI message parts for an OpenAI ``content`` (a string or a list of content parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts = []
    for part in content:
        if get(part, "type") == "text":
            parts.append({"type": "text", "content": get(part, "text")})
        elif get(part, "type") == "refusal":
            parts.append({"type": "refusal", "content": get(part, "refusal")})
        else:  # images, audio, files: kept as given (a GenAI "generic" part)
            parts.append(json.loads(to_json(part)))
    return parts


def tool_call_part(call: Any) -> dict[str, Any]:
    """A GenAI ``tool_call`` part from an OpenAI tool call (request message or response)."""
    kind = get(call, "type") or "function"
    body = get(call, kind) or get(call, "function") or {}
    arguments = get(body, "arguments")
    if arguments is None:
        arguments = get(body, "input")  # custom tools
    return {"type": "tool_call", "id": get(call, "id"), "name": get(body, "name"),
            "arguments": arguments}


def input_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages in the GenAI convention's shape (role + parts)."""
    out = []
    for message in messages or ():
        role = get(message, "role")
        if role in ("tool", "function"):
            parts = [{"type": "tool_call_response",
                      "id": get(message, "tool_call_id") or get(message, "name"),
                      "response": get(message, "content")}]
        else:
            parts = text_parts(get(message, "content"))
            for call in get(message, "tool_calls") or ():
                parts.append(tool_call_part(call))
            legacy = get(message, "function_call")
            if legacy:
                parts.append({"type": "tool_call", "id": None, "name": get(legacy, "name"),
                              "arguments": get(legacy, "arguments")})
        entry: dict[str, Any] = {"role": role, "parts": parts}
        if get(message, "name") and role not in ("tool", "function"):
            entry["name"] = get(message, "name")
        out.append(entry)
    return out


def content_attributes(kwargs: dict[str, Any], call: Call) -> dict[str, Any]:
    """Offered tool names (token_ids level); definitions and messages (messages level)."""
    attrs: dict[str, Any] = {}
    tools = [t for key in ("tools", "functions") if given(kwargs.get(key))
             for t in kwargs[key]]
    names = [n for n in map(tool_name, tools) if n]
    if names:
        attrs[sc.LLM_TOOL_NAMES] = names
    if tools and call.messages:
        attrs[sc.GEN_AI_TOOL_DEFINITIONS] = to_json(tools)
    if call.messages and given(kwargs.get("messages")):
        attrs[sc.GEN_AI_INPUT_MESSAGES] = to_json(input_messages(kwargs["messages"]))
    return attrs


def request_attributes(kwargs: dict[str, Any], instance: Any, call: Call) -> dict[str, Any]:
    """The span's attributes at its start: request parameters, server, content, scope."""
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
        if given(value):
            attrs[attr] = value
    max_tokens = kwargs.get("max_completion_tokens")
    if not given(max_tokens):
        max_tokens = kwargs.get("max_tokens")
    if given(max_tokens):
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    url = getattr(getattr(instance, "_client", None), "base_url", None)
    if url is not None:
        if url.host:
            attrs[sc.SERVER_ADDRESS] = url.host
        if url.port:
            attrs[sc.SERVER_PORT] = url.port
    if call.ids:
        try:
            attrs.update(content_attributes(kwargs, call))
        except Exception:  # an odd request must never fail the caller's call
            logger.debug("agl_bridge: could not record the request's content", exc_info=True)
    scope = scope_attributes()
    call.scoped_policy = sc.POLICY_VERSION in scope
    attrs.update(scope)
    return attrs
