"""What a judge reads of an episode: its LLM calls in time order, as lines with agent names.

Pure: the caller (``agl_bridge.trainer.judging.spans``) reads the spans and hands in each call's
captured messages or token ids, and a ``decode`` function for the ids.

* **Messages** (capture level ``messages``: ``gen_ai.input.messages`` /
  ``gen_ai.output.messages``, GenAI-convention role + parts) are shown one per line:
  ``[agent] role: text``, tool calls as ``[calls NAME(ARGS)]``, tool results as
  ``tool: [result of ID] ...``.
* **Token ids only** (the default capture level): the prompt and completion ids decoded with
  the served model's tokenizer (``[agent] input: ...`` keeps the chat template's markup, which
  shows the roles; ``[agent] output: ...``).

An agent's next call usually repeats its whole conversation so far. Each agent's calls are
shown incrementally: the part of a prompt that repeats what that agent already sent and
received is left out, so a ten-turn episode reads as ten turns, not as fifty repeated
messages. A call that failed shows ``(no answer: the call failed: ...)``.

A call whose text cannot be built (messages that are not the convention's shape, ids but no
tokenizer, neither) raises ``EpisodeTextError`` naming the span: the caller reports the episode
and judges the others. An episode judged on part of its calls would be judged wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agl_bridge import semconv as sc

Decode = Callable[[Sequence[int], bool], str]  # (ids, is_prompt) -> text


class EpisodeTextError(ValueError):
    """A call whose text cannot be built; the message names the span."""


@dataclass(frozen=True)
class Call:
    """One LLM call as read from its span (JSON already parsed where it was JSON)."""

    span: str  # "trace_id/span_id": how reports name it
    agent: str | None
    start: int
    inputs: Any = None  # gen_ai.input.messages
    outputs: Any = None  # gen_ai.output.messages
    prompt_ids: Sequence[int] | None = None
    completion_ids: Sequence[int] | None = None
    failed: str | None = None  # the status message of a call that ended in error
    # the agent's own system prompt, where the span records it apart from the messages
    # (agl_bridge.prompt.text: a framework built the system message around it)
    prompt: str | None = None

    @property
    def has_messages(self) -> bool:
        return self.inputs is not None or self.outputs is not None

    @property
    def has_ids(self) -> bool:
        return self.prompt_ids is not None


def _part_text(part: Any, span: str) -> str:
    if not isinstance(part, dict):
        raise EpisodeTextError(f"span {span}: a message part is not an object: {part!r:.60}")
    kind = part.get("type")
    if kind == "text":
        return _text(part.get("content"))
    if kind == "reasoning":
        return f"[reasoning] {_text(part.get('content'))}"
    if kind == "tool_call":
        return f"[calls {part.get('name')}({_text(part.get('arguments'))})]"
    if kind == "tool_call_response":
        return f"[result of {part.get('id')}] {_text(part.get('response'))}"
    return f"[{kind or 'unknown'} part]"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def message_lines(messages: Any, agent: str | None, span: str, what: str) -> list[str]:
    """GenAI-convention messages as lines: ``[agent] role: text``."""
    if not isinstance(messages, list):
        raise EpisodeTextError(f"span {span}: {what} is not a list of messages "
                               f"({type(messages).__name__})")
    lines = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("parts", []), list):
            raise EpisodeTextError(f"span {span}: {what}[{k}] is not a message with parts")
        role = m.get("role") or "unknown"
        text = " ".join(_part_text(p, span) for p in m.get("parts") or [])
        lines.append(f"{_who(agent)}{role}: {text}")
    return lines


def _who(agent: str | None) -> str:
    return f"[{agent}] " if agent else ""


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def episode_blocks(calls: Sequence[Call], decode: Decode | None) -> tuple[str, ...]:
    """The episode's lines, calls in time order (then span id, for equal times).
    ``decode`` is needed only for calls captured without messages."""
    seen_lines: dict[str | None, list[str]] = {}
    seen_ids: dict[str | None, list[int]] = {}
    out: list[str] = []
    for call in sorted(calls, key=lambda c: (c.start, c.span)):
        who = _who(call.agent)
        if call.has_messages:
            inputs = message_lines(call.inputs if call.inputs is not None else [], call.agent,
                                   call.span, sc.GEN_AI_INPUT_MESSAGES)
            outputs = (message_lines(call.outputs, call.agent, call.span,
                                     sc.GEN_AI_OUTPUT_MESSAGES)[:1]
                       if call.outputs is not None else [])
            before = seen_lines.get(call.agent, [])
            out += inputs[_common(before, inputs):]
            out += outputs or [f"{who}(no answer{_failure(call)})"]
            seen_lines[call.agent] = inputs + outputs
        elif call.has_ids:
            if decode is None:
                raise EpisodeTextError(f"span {call.span}: only token ids were captured; pass "
                                       f"the served model's tokenizer (--tokenizer DIR) to read "
                                       f"them")
            prompt = list(call.prompt_ids or [])
            completion = list(call.completion_ids or [])
            before_ids = seen_ids.get(call.agent, [])
            new = prompt[_common(before_ids, prompt):]
            try:
                if new:
                    out.append(f"{who}input: {decode(new, True)}")
                out.append(f"{who}output: {decode(completion, False)}" if completion
                           else f"{who}(no answer{_failure(call)})")
            except Exception as exc:  # a tokenizer raises many kinds on ids it does not know
                raise EpisodeTextError(f"span {call.span}: its token ids do not decode with "
                                       f"this tokenizer ({type(exc).__name__}: {exc})") from exc
            seen_ids[call.agent] = prompt + completion
        elif call.failed is not None:  # failed before any ids came back: say so
            out.append(f"{who}(a call failed: {call.failed})")
        else:
            raise EpisodeTextError(f"span {call.span}: neither messages nor token ids were "
                                   f"captured (capture level none?)")
    return tuple(out)


def _failure(call: Call) -> str:
    return f": the call failed: {call.failed}" if call.failed is not None else ""
