"""Spans other instrumentors wrote, read as ours so that retokenization can train on them.

A team that already sends GenAI traces to a collector (the OpenTelemetry openai-v2
instrumentation, OpenLLMetry, OpenInference) has the messages of every LLM call but no token
ids, no episodes and often no agent on the call itself. ``normalize`` runs before
``retokenize.fill_ids`` and gives such a span what our converter reads:

* the messages as ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (role + parts JSON,
  the GenAI conventions' shape, which ours is) in the attributes JSON, from
  - OpenInference's ``llm.input_messages.{i}.message.*`` / ``llm.output_messages.{i}...``,
  - OpenLLMetry's flat ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*``,
  - span events: ``gen_ai.client.inference.operation.details`` (the messages as the
    attributes above) and the older ``gen_ai.content.prompt`` / ``gen_ai.content.completion``
    pair (OpenAI-format JSON);
  spans that already carry ``gen_ai.input.messages`` (openai-v2 with span content capture,
  OpenLLMetry since it adopted the attribute) are left as they are;
* the system prompt from ``gen_ai.system_instructions`` (an API that takes it apart from the
  history) as the first message, which the chat template renders as the server did;
* ``gen_ai.operation.name = chat`` where the convention says LLM call another way
  (``openinference.span.kind = LLM``, ``llm.request.type = chat``), and the model from
  ``llm.model_name``;
* the agent: ``gen_ai.agent.name`` on the span, else OpenInference's ``agent.name`` or an
  OpenLLMetry ``@agent`` span's entity name, else the nearest ancestor in the same trace that
  names one (the GenAI conventions put the agent on the ``invoke_agent`` span around its calls).

The episode is the session when the spans name one (``gen_ai.conversation.id``, OpenInference's
``session.id``, OpenLLMetry's ``session_id`` association property): a conversation of many
requests, each its own trace, is one rollout. ``session_episodes`` sets it on every span of the
session's traces before anything else reads the files (so evaluations, the buckets of a large
input and the stages key the same episodes); otherwise the episode is the trace
(``columns.episode_keys``), which every convention carries on every span.
A span whose messages cannot be read is named in the notes (convention and key) and left without
ids, so the converter skips it as it skips any call without ids.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.config import ConversionStats
from agl_bridge.trainer.conversion.evaluations import is_evaluation

OPENINFERENCE = "OpenInference"
OPENLLMETRY = "OpenLLMetry"
GENAI_EVENTS = "GenAI span events"
MAX_ANCESTORS = 64  # a parent chain longer than this (or a cycle) names no agent

Messages = list[dict[str, Any]]

# substrings that mark a row worth parsing (cheap, in Arrow, before any JSON is read)
_ATTRIBUTE_MARKS = (sc.OPENINFERENCE_INPUT_PREFIX, sc.OPENLLMETRY_PROMPT_PREFIX,
                    sc.GEN_AI_SYSTEM_INSTRUCTIONS,
                    sc.OPENINFERENCE_SPAN_KIND, sc.OPENLLMETRY_SPAN_KIND,
                    json.dumps(sc.OPENINFERENCE_AGENT_NAME), sc.OPENLLMETRY_REQUEST_TYPE)
_EVENT_MARKS = (sc.GEN_AI_OPERATION_DETAILS, sc.GEN_AI_CONTENT_PROMPT)
_INDEXED = re.compile(r"(\d+)\.(.+)")


class Unreadable(ValueError):
    """A span's messages in a convention that cannot be read: ``key`` says where."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key, self.why = key, why


def _indexed(attrs: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``prefix{i}.field`` keys -> {i: {field: value}}, in index order."""
    out: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            m = _INDEXED.fullmatch(key[len(prefix):])
            if m is None:
                raise Unreadable(key, f"not {prefix}<index>.<field>")
            out.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return dict(sorted(out.items()))


def _text(value: Any, key: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Unreadable(key, f"content is {type(value).__name__}, not text")
    return value


def _role(fields: dict[str, Any], field: str, key: str) -> str:
    role = fields.get(field)
    if not isinstance(role, str) or not role:
        raise Unreadable(key, "no role")
    return role


def _message(role: str, text: str, calls: list[dict[str, Any]], call_id: Any) -> dict[str, Any]:
    """One GenAI-convention message: text and tool calls as parts; a tool's answer as a
    ``tool_call_response`` part."""
    if role == "tool":
        return {"role": role, "parts": [{"type": "tool_call_response", "id": call_id,
                                         "response": text}]}
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    parts += [{"type": "tool_call", **c} for c in calls]
    return {"role": role, "parts": parts}


def _calls(fields: dict[str, Any], prefix: str, id_key: str, name_key: str, args_key: str
           ) -> list[dict[str, Any]]:
    calls = _indexed(fields, prefix)
    return [{"id": c.get(id_key), "name": c.get(name_key), "arguments": c.get(args_key) or "{}"}
            for c in calls.values()]


def _openinference(attrs: dict[str, Any]) -> tuple[Messages, Messages] | None:
    """``llm.input_messages.{i}.message.{role,content,contents,tool_calls,tool_call_id}``."""
    def read(prefix: str) -> Messages:
        out = []
        for i, fields in _indexed(attrs, prefix).items():
            key = f"{prefix}{i}.message"
            text = _text(fields.get("message.content"), f"{key}.content")
            if not text:  # multimodal form: message.contents.{j}.message_content.{type,text}
                contents = _indexed(fields, "message.contents.")
                text = "".join(_text(c.get("message_content.text"), f"{key}.contents.{j}")
                               for j, c in contents.items()
                               if c.get("message_content.type", "text") == "text")
            calls = _calls(fields, "message.tool_calls.", "tool_call.id",
                           "tool_call.function.name", "tool_call.function.arguments")
            out.append(_message(_role(fields, "message.role", f"{key}.role"), text, calls,
                                fields.get("message.tool_call_id")))
        return out

    inputs, outputs = read(sc.OPENINFERENCE_INPUT_PREFIX), read(sc.OPENINFERENCE_OUTPUT_PREFIX)
    if not inputs and not outputs:
        return None
    if outputs:
        finish = _openinference_finish(attrs)
        if finish is not None:
            outputs[0]["finish_reason"] = finish
    return inputs, outputs


def _openinference_finish(attrs: dict[str, Any]) -> str | None:
    """The finish reason: from the response OpenInference keeps as ``output.value`` JSON."""
    raw = attrs.get(sc.OPENINFERENCE_OUTPUT_VALUE)
    if not isinstance(raw, str):
        return None
    try:
        finish = json.loads(raw)["choices"][0]["finish_reason"]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return finish if isinstance(finish, str) else None


def _openllmetry(attrs: dict[str, Any]) -> tuple[Messages, Messages] | None:
    """``gen_ai.prompt.{i}.{role,content,tool_call_id,tool_calls.{k}.*}`` and
    ``gen_ai.completion.{i}.{role,content,finish_reason,tool_calls.{k}.*}``."""
    def read(prefix: str) -> Messages:
        out = []
        for i, fields in _indexed(attrs, prefix).items():
            key = f"{prefix}{i}"
            calls = _calls(fields, "tool_calls.", "id", "name", "arguments")
            message = _message(_role(fields, "role", f"{key}.role"),
                               _flat_content(fields.get("content"), f"{key}.content"), calls,
                               fields.get("tool_call_id"))
            if isinstance(fields.get("finish_reason"), str):
                message["finish_reason"] = fields["finish_reason"]
            out.append(message)
        return out

    inputs = read(sc.OPENLLMETRY_PROMPT_PREFIX)
    outputs = read(sc.OPENLLMETRY_COMPLETION_PREFIX)
    return (inputs, outputs) if inputs or outputs else None


def _flat_content(value: Any, key: str) -> str:
    """OpenLLMetry's content: text, or a message's list of content parts as JSON text (what
    it writes for multimodal messages); the text parts are kept."""
    text = _text(value, key)
    if text.startswith("[{"):
        try:
            parts = json.loads(text)
        except ValueError:
            return text
        if isinstance(parts, list) and all(isinstance(p, dict) and "type" in p for p in parts):
            return "".join(p.get("text") or "" for p in parts if p["type"] == "text")
    return text


def _openai_messages(raw: Any, key: str) -> Messages:
    """OpenAI-format messages (``role``, ``content``, ``tool_calls``, ``tool_call_id``), as
    JSON text or a list, -> GenAI-convention messages."""
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise Unreadable(key, f"not JSON ({exc.msg})") from None
    if not isinstance(items, list):
        raise Unreadable(key, "not a list of messages")
    out = []
    for m in items:
        if not isinstance(m, dict):
            raise Unreadable(key, "a message is not an object")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text") or "" for p in content
                              if isinstance(p, dict) and p.get("type") == "text")
        calls = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                  "arguments": (c.get("function") or {}).get("arguments") or "{}"}
                 for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        message = _message(_role(m, "role", key), _text(content, key), calls,
                           m.get("tool_call_id"))
        if isinstance(m.get("finish_reason"), str):
            message["finish_reason"] = m["finish_reason"]
        out.append(message)
    return out


def _genai_list(raw: Any, key: str) -> Messages:
    """GenAI-convention messages as an event attribute holds them (a list, or JSON text)."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise Unreadable(key, f"not JSON ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise Unreadable(key, "not a list of messages")
    return value


def _events(raw: str | None) -> tuple[Messages, Messages] | None:
    """The messages in a span's GenAI events, if it has such events."""
    if not raw:
        return None
    try:
        events = json.loads(raw)
    except ValueError:
        return None  # the events column is ours; a row that broke it is not ours to name
    inputs: Messages = []
    outputs: Messages = []
    found = False
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict):
            continue
        name, attrs = event.get("name"), event.get("attributes") or {}
        if name == sc.GEN_AI_OPERATION_DETAILS:
            found = True
            where = f"{name} event"
            inputs = _genai_list(attrs.get(sc.GEN_AI_INPUT_MESSAGES) or [],
                                 f"{where}: {sc.GEN_AI_INPUT_MESSAGES}")
            outputs = _genai_list(attrs.get(sc.GEN_AI_OUTPUT_MESSAGES) or [],
                                  f"{where}: {sc.GEN_AI_OUTPUT_MESSAGES}")
        elif name == sc.GEN_AI_CONTENT_PROMPT:
            found = True
            inputs = _openai_messages(attrs.get(sc.GEN_AI_PROMPT) or [],
                                      f"{name} event: {sc.GEN_AI_PROMPT}")
        elif name == sc.GEN_AI_CONTENT_COMPLETION:
            found = True
            outputs = _openai_messages(attrs.get(sc.GEN_AI_COMPLETION) or [],
                                       f"{name} event: {sc.GEN_AI_COMPLETION}")
    return (inputs, outputs) if found else None


READERS: tuple[tuple[str, Callable[[dict[str, Any]], tuple[Messages, Messages] | None]], ...] = (
    (OPENINFERENCE, _openinference), (OPENLLMETRY, _openllmetry))


def _is_llm(attrs: dict[str, Any]) -> bool:
    return (attrs.get(sc.OPENINFERENCE_SPAN_KIND) == "LLM"
            or attrs.get(sc.OPENLLMETRY_REQUEST_TYPE) == sc.OP_CHAT)


def _own_agent(attrs: dict[str, Any]) -> str | None:
    name = attrs.get(sc.OPENINFERENCE_AGENT_NAME)
    if not isinstance(name, str) and attrs.get(sc.OPENLLMETRY_SPAN_KIND) == "agent":
        name = attrs.get(sc.OPENLLMETRY_ENTITY_NAME)
    return name if isinstance(name, str) and name else None


def _marked(column: pa.ChunkedArray, marks: tuple[str, ...]) -> list[bool]:
    hit = None
    for mark in marks:
        m = pc.fill_null(pc.match_substring(column, mark), False)
        hit = m if hit is None else pc.or_(hit, m)
    return hit.to_pylist() if hit is not None else [False] * len(column)


def normalize(spans: pa.Table, stats: ConversionStats) -> pa.Table:
    """``spans`` with other instrumentors' LLM calls in our shape (module docstring); rows
    that need nothing are returned unchanged, and so is a table with none."""
    n = spans.num_rows
    if n == 0 or "attributes" not in spans.column_names:
        return spans
    attributes = spans["attributes"].to_pylist()
    events = spans["events"].to_pylist() if "events" in spans.column_names else [None] * n
    wanted = _marked(spans["attributes"], _ATTRIBUTE_MARKS)
    if "events" in spans.column_names:
        wanted = [a or b for a, b in zip(wanted, _marked(spans["events"], _EVENT_MARKS))]
    operations = spans["operation_name"].to_pylist()
    agents = (spans["agent_name"].to_pylist() if "agent_name" in spans.column_names
              else [None] * n)
    models = (spans["request_model"].to_pylist() if "request_model" in spans.column_names
              else [None] * n)
    changed = False
    for i in range(n):
        if not wanted[i]:
            continue
        try:
            attrs = json.loads(attributes[i]) if attributes[i] else {}
        except ValueError:
            continue  # not ours to name: the attributes JSON is written by our rows
        if not isinstance(attrs, dict):
            continue
        if agents[i] is None and (own := _own_agent(attrs)) is not None:
            agents[i], changed = own, True
        read = _read_messages(attrs, events[i], stats)
        if sc.GEN_AI_SYSTEM_INSTRUCTIONS in attrs:
            read = _with_system(attrs, read, stats)
        if read is not None:
            attrs[sc.GEN_AI_INPUT_MESSAGES] = json.dumps(read[0])
            attrs[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps(read[1])
            attributes[i], changed = json.dumps(attrs), True
        if operations[i] is None and (read is not None or _is_llm(attrs)):
            operations[i], changed = sc.OP_CHAT, True
        model = attrs.get(sc.OPENINFERENCE_MODEL_NAME)
        if models[i] is None and isinstance(model, str) and operations[i] == sc.OP_CHAT:
            models[i], changed = model, True
    if _inherit_agents(spans, operations, agents, stats):
        changed = True
    if not changed:
        return spans
    for name, values in (("attributes", attributes), ("operation_name", operations),
                         ("agent_name", agents), ("request_model", models)):
        column = pa.array(values, SPAN_SCHEMA.field(name).type)
        if name in spans.column_names:
            spans = spans.set_column(spans.column_names.index(name), name, column)
        else:
            spans = spans.append_column(SPAN_SCHEMA.field(name), column)
    return spans


def _read_messages(attrs: dict[str, Any], events: str | None,
                   stats: ConversionStats) -> tuple[Messages, Messages] | None:
    """The call's messages in our shape, if another convention holds them; a span whose
    messages cannot be read is named in the notes and gets none."""
    if sc.GEN_AI_INPUT_MESSAGES in attrs:
        return None  # ours already (openai-v2 span capture, recent OpenLLMetry)
    for convention, reader in (*READERS, (GENAI_EVENTS, lambda _: _events(events))):
        try:
            found = reader(attrs)
        except Unreadable as exc:
            stats.notes[reasons.foreign_unreadable(convention, exc.key, exc.why)] += 1
            return None
        if found is not None:
            if not found[1]:
                stats.notes[reasons.foreign_unreadable(convention, "output messages",
                                                       "none recorded")] += 1
                return None
            stats.notes[reasons.foreign_read(convention)] += 1
            return found
    return None


def _with_system(attrs: dict[str, Any], read: tuple[Messages, Messages] | None,
                 stats: ConversionStats) -> tuple[Messages, Messages] | None:
    """The messages with ``gen_ai.system_instructions`` (the system prompt an API took apart
    from the chat history) put first as the system message the chat template renders, unless
    the history already starts with one; None when there is nothing to change."""
    key = sc.GEN_AI_SYSTEM_INSTRUCTIONS
    try:
        if read is None:
            if sc.GEN_AI_INPUT_MESSAGES not in attrs or sc.GEN_AI_OUTPUT_MESSAGES not in attrs:
                return None
            read = (_genai_list(attrs[sc.GEN_AI_INPUT_MESSAGES], sc.GEN_AI_INPUT_MESSAGES),
                    _genai_list(attrs[sc.GEN_AI_OUTPUT_MESSAGES], sc.GEN_AI_OUTPUT_MESSAGES))
        parts = _genai_list(attrs[key], key)
    except Unreadable as exc:
        stats.notes[reasons.foreign_left_out(exc.key, exc.why)] += 1
        return None
    inputs, outputs = read
    if inputs and inputs[0].get("role") in ("system", "developer"):
        return read
    return [{"role": "system", "parts": parts}, *inputs], outputs


def _inherit_agents(spans: pa.Table, operations: list[Any], agents: list[Any],
                    stats: ConversionStats) -> bool:
    """LLM calls without an agent take the nearest ancestor's in their trace (as the GenAI
    conventions nest calls in ``invoke_agent`` spans); True if any did."""
    orphans = [i for i, (op, agent) in enumerate(zip(operations, agents))
               if op == sc.OP_CHAT and agent is None]
    if not orphans or "parent_span_id" not in spans.column_names:
        return False
    traces, ids = spans["trace_id"].to_pylist(), spans["span_id"].to_pylist()
    parents = spans["parent_span_id"].to_pylist()
    by_id = {(t, s): k for k, (t, s) in enumerate(zip(traces, ids))}
    found = False
    for i in orphans:
        k: int | None = i
        for _ in range(MAX_ANCESTORS):
            parent = parents[k] if k is not None else None
            k = by_id.get((traces[i], parent)) if parent else None
            if k is None:
                break
            if agents[k] is not None:
                agents[i], found = agents[k], True
                stats.notes[reasons.AGENT_FROM_ANCESTOR] += 1
                break
    return found


# -- sessions: a conversation of many traces is one episode --------------------------------------
SESSION_KEYS = (sc.GEN_AI_CONVERSATION_ID, sc.OPENINFERENCE_SESSION_ID, sc.OPENLLMETRY_SESSION_ID)
SESSION_PREFIX = "session:"


def trace_sessions(tables: Iterable[pa.Table]) -> dict[str, str]:
    """trace id -> the session one of its spans names (the first found), for the traces that
    name one."""
    out: dict[str, str] = {}
    marks = tuple(json.dumps(k) for k in SESSION_KEYS)
    for table in tables:
        if "attributes" not in table.column_names or table.num_rows == 0:
            continue
        hit = _marked(table["attributes"], marks)
        traces = table["trace_id"].filter(pa.array(hit)).to_pylist()
        for trace, raw in zip(traces, table["attributes"].filter(pa.array(hit)).to_pylist()):
            if trace in out:
                continue
            try:
                attrs = json.loads(raw)
            except ValueError:
                continue
            for key in SESSION_KEYS:
                value = attrs.get(key) if isinstance(attrs, dict) else None
                if isinstance(value, str) and value:
                    out[trace] = value
                    break
    return out


def with_session_episodes(table: pa.Table, sessions: Mapping[str, str]) -> pa.Table:
    """``episode_id = session:<id>`` on the spans of a session's traces that carry no episode
    (evaluation records keep theirs: they are placed by what they name)."""
    if not sessions or table.num_rows == 0:
        return table
    traces = table["trace_id"].to_pylist()
    episodes = (table["episode_id"].to_pylist() if "episode_id" in table.column_names
                else [None] * table.num_rows)
    records = is_evaluation(table).to_pylist()
    changed = False
    for i, trace in enumerate(traces):
        if episodes[i] is None and not records[i] and trace in sessions:
            episodes[i], changed = SESSION_PREFIX + sessions[trace], True
    if not changed:
        return table
    column = pa.array(episodes, SPAN_SCHEMA.field("episode_id").type)
    if "episode_id" in table.column_names:
        return table.set_column(table.column_names.index("episode_id"), "episode_id", column)
    return table.append_column(SPAN_SCHEMA.field("episode_id"), column)


@contextlib.contextmanager
def session_episodes(files: Sequence[Path]) -> Iterator[list[Path]]:
    """``files``, with those holding spans of a session's traces rewritten (in a temporary
    directory, for the ``with`` block) so that the session is their episode. Done before
    anything else reads them, so evaluations, buckets and the stages key the same episodes."""
    def read(path: Path, columns: list[str] | None) -> pa.Table | None:
        try:
            pf = pq.ParquetFile(path, memory_map=True)
            names = pf.schema_arrow.names
            if columns is not None and not set(columns) <= set(names):
                return None
            return pf.read(columns=columns, use_threads=False)
        except (pa.ArrowInvalid, OSError):
            return None  # named when the stages read it

    sessions = trace_sessions(t for t in (read(p, ["trace_id", "attributes"]) for p in files)
                              if t is not None)
    if not sessions:
        yield list(files)
        return
    with tempfile.TemporaryDirectory(prefix="agl-bridge-sessions-") as tmp:
        out: list[Path] = []
        for n, path in enumerate(files):
            ids = read(path, ["trace_id"])
            if ids is None or not any(t in sessions for t in ids["trace_id"].to_pylist()):
                out.append(path)
                continue
            table = read(path, None)
            if table is None:
                out.append(path)
                continue
            target = Path(tmp) / f"{n:06d}-{path.name}"
            pq.write_table(with_session_episodes(table, sessions), target)
            out.append(target)
        yield out
