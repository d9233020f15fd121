"""``agl-bridge replay``: production inputs played again, K times each, so they form groups.

Live traffic never repeats a request, so group-relative training has nothing to compare an
episode with. Replay takes the inputs of stored episodes and runs the user's team command on
each of them ``k`` times against the current policy: the K new episodes of one input share a
task id (``replay:<the original task or episode>``), which is exactly a GRPO group.

An input is what the team needs to play the episode again: the first request's messages
(``gen_ai.input.messages`` of the episode's first LLM call, captured at the ``messages`` level),
and/or the value of a field the user names (``--field``: a span column such as ``task_id``, or
an attribute recorded on the episode's spans, e.g. a ticket body id). The team command reads
them from its tasks file (``AGL_BRIDGE_TASKS``: ``task_id``, ``messages``, the field,
``source_episode``), as for any loop run (``team.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.loop.team import TeamRun, run_team

REPLAY_PREFIX = "replay:"


@dataclass
class ReplayInputs:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    episodes: int = 0  # stored episodes seen
    without_input: list[str] = field(default_factory=list)  # episodes with nothing to replay


def _messages(raw: str | None) -> list[dict[str, Any]] | None:
    """The chat messages of a captured request (GenAI-convention parts -> role + content)."""
    if not raw:
        return None
    try:
        attributes = json.loads(raw)
        value = attributes.get(sc.GEN_AI_INPUT_MESSAGES)
        messages = json.loads(value) if isinstance(value, str) else value
    except (ValueError, AttributeError, TypeError):
        return None
    if not isinstance(messages, list) or not messages:
        return None
    from agl_bridge.trainer.conversion.retokenize import chat_messages

    return chat_messages(messages)


def replay_inputs(spans: pa.Table, *, field_name: str | None = None,
                  limit: int | None = None) -> ReplayInputs:
    """One task per stored episode (in the order the episodes started): its first request's
    messages and/or the value of ``field_name``; episodes with neither are listed."""
    from agl_bridge.trainer.conversion.columns import episode_attributes, episode_keys

    out = ReplayInputs()
    if spans.num_rows == 0:
        return out
    keys = episode_keys(spans)
    order = pc.sort_indices(spans, sort_keys=[("start_time_unix_nano", "ascending")])
    spans, keys = spans.take(order), keys.take(order)
    is_chat = pc.fill_null(pc.equal(spans["operation_name"], sc.OP_CHAT), False)
    chats = spans.filter(is_chat)
    first_request: dict[str, list[dict[str, Any]] | None] = {}
    if "attributes" in chats.column_names:
        for episode, raw in zip(keys.filter(is_chat).to_pylist(),
                                chats["attributes"].to_pylist()):
            if episode not in first_request:
                first_request[episode] = _messages(raw)
    values = (episode_attributes(spans, keys, [field_name]).get(field_name, {})
              if field_name else {})
    tasks_of: dict[str, str | None] = {}
    for episode, task in zip(keys.to_pylist(), spans["task_id"].to_pylist()
                             if "task_id" in spans.column_names else [None] * spans.num_rows):
        if episode not in tasks_of or (tasks_of[episode] is None and task is not None):
            tasks_of[episode] = task
    chat_episodes = set(keys.filter(is_chat).to_pylist())
    for episode, task in tasks_of.items():
        if episode is None or episode not in chat_episodes:
            continue  # a trace with no LLM call (a framework's own spans) is no episode
        out.episodes += 1
        messages = first_request.get(episode)
        value = values.get(episode)
        if messages is None and value is None:
            out.without_input.append(episode)
            continue
        item: dict[str, Any] = {"task_id": REPLAY_PREFIX + (task or episode),
                                "source_episode": episode}
        if messages is not None:
            item["messages"] = messages
        if field_name and value is not None:
            item[field_name] = value
        out.tasks.append(item)
        if limit is not None and len(out.tasks) >= limit:
            break
    return out


def read_replay_spans(source: str | Path | Sequence[str | Path],
                      field_name: str | None = None) -> pa.Table:
    """The columns ``replay_inputs`` reads from span Parquet (a file, a directory tree or a
    list of them), evaluation records left out."""
    from agl_bridge.trainer.conversion import read_spans
    from agl_bridge.trainer.conversion.config import ConversionStats
    from agl_bridge.trainer.conversion.evaluations import is_evaluation

    columns = ["trace_id", "span_id", "episode_id", "task_id", "operation_name",
               "start_time_unix_nano", "attributes", "evaluation_name", "evaluation_target"]
    if field_name and field_name not in columns:
        columns.append(field_name)
    table = read_spans(source, ConversionStats(),  # a file that is no span file: skipped
                       columns=[c for c in columns if c in SPAN_SCHEMA.names])
    return table.filter(pc.invert(is_evaluation(table)))


def replay(spans_dir: str | Path, command: str | Sequence[str], out_dir: Path, *,
           base_url: str, aliases: Path | None, k: int, temperature: float,
           field_name: str | None = None, limit: int | None = None
           ) -> tuple[ReplayInputs, TeamRun | None]:
    """Replay the stored episodes under ``spans_dir`` ``k`` times each with the team command;
    the new spans go to ``out_dir/spans``."""
    inputs = replay_inputs(read_replay_spans(spans_dir, field_name), field_name=field_name,
                           limit=limit)
    if not inputs.tasks:
        return inputs, None
    run = run_team(command, inputs.tasks, out_dir, base_url=base_url, aliases=aliases,
                   rollouts=k, temperature=temperature, service="replay")
    return inputs, run
