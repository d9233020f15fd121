"""TraceToTransitions v0: span rows -> one transition per LLM call.

Credit assignment is Agent Lightning's identical assignment: the episode's reward goes to every
LLM call of that episode. Rewards are matched within an episode only (never by time across
episodes: with concurrent rollouts that sends rewards to the wrong calls). Groups are tasks:
every rollout of one task is compared with the others (GRPO).

``spans_to_transitions`` is a pure function of a table; ``convert`` is the IO edge around it.
Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files, read_checked, write_table_atomic
from agl_bridge.schema import REQUIRED_SPAN_COLUMNS, SPAN_SCHEMA, TRANSITION_SCHEMA

# Span columns the converter reads (beyond the required ones, read when present).
_OPTIONAL_COLUMNS = (
    "task_id", "agent_name", "turn_index", "candidate_index", "request_model", "policy_version",
    "completion_logprobs", "reward_scope",
)
# Reward scopes that v0 broadcasts to the whole episode; the others wait for the full converter.
_BROADCAST_SCOPES = (None, sc.RewardScope.EPISODE, sc.RewardScope.TEAM)


@dataclass
class ConversionStats:
    spans: int = 0
    episodes: int = 0
    llm_spans: int = 0
    transitions: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> LLM spans not converted
    notes: Counter = field(default_factory=Counter)  # reason -> things worth knowing, not fatal

    def summary(self) -> str:
        lines = [f"{self.spans} spans, {self.episodes} episodes, {self.llm_spans} LLM calls -> "
                 f"{self.transitions} transitions"]
        lines += [f"  skipped {n} LLM call(s): {why}" for why, n in sorted(self.skipped.items())]
        lines += [f"  note: {n} x {why}" for why, n in sorted(self.notes.items())]
        return "\n".join(lines)


def _episode_key(row: dict[str, Any]) -> str:
    # Without the scoping API, one trace is one episode: the best guess that never mixes two.
    return row["episode_id"] or f"trace:{row['trace_id']}"


def spans_to_transitions(
    spans: pa.Table,
    *,
    missing_reward: Literal["drop"] | float = "drop",
) -> tuple[pa.Table, ConversionStats]:
    """Build transitions from a span table (SPAN_SCHEMA columns; the required ones at least).

    ``missing_reward``: what an episode with no reward span gets: ``"drop"`` (its calls are
    skipped and counted) or a number to use as its reward.
    """
    stats = ConversionStats(spans=spans.num_rows)
    cols = [c for c in REQUIRED_SPAN_COLUMNS + _OPTIONAL_COLUMNS if c in spans.column_names]
    rows = spans.select(cols).to_pylist()

    seen: set[tuple[str, str]] = set()
    rewards: dict[str, float] = defaultdict(float)
    has_reward: set[str] = set()
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        key = (row["trace_id"], row["span_id"])
        if key in seen:
            stats.notes["duplicate span id (later copy ignored)"] += 1
            continue
        seen.add(key)
        episode = _episode_key(row)
        value = row["reward_value"]
        if value is not None:
            scope = row.get("reward_scope")
            if not math.isfinite(value):
                stats.notes[f"non-finite reward {value} in episode {episode} (ignored)"] += 1
            elif scope in _BROADCAST_SCOPES:
                rewards[episode] += value
                has_reward.add(episode)
            else:
                stats.notes[f"reward with scope {scope!r} (not used by v0 converter)"] += 1
        if row["operation_name"] == sc.OP_CHAT:
            calls[episode].append(row)

    stats.episodes = len({_episode_key(r) for r in rows})
    out: list[dict[str, Any]] = []
    for episode, episode_calls in calls.items():
        episode_calls.sort(key=lambda r: (r["start_time_unix_nano"], r["span_id"]))
        for row in episode_calls:
            stats.llm_spans += 1
            prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
            if prompt is None or completion is None:
                stats.skipped["no token ids on the LLM span"] += 1
                continue
            if not completion:
                stats.skipped["empty completion"] += 1
                continue
            if episode in has_reward:
                reward = rewards[episode]
            elif missing_reward == "drop":
                stats.skipped["episode has no reward"] += 1
                continue
            else:
                reward = float(missing_reward)
            logprobs = row.get("completion_logprobs")
            if logprobs is not None and len(logprobs) != len(completion):
                stats.notes["logprobs length differs from completion (logprobs dropped)"] += 1
                logprobs = None
            task = row.get("task_id")
            if task is None:
                stats.notes["LLM call without task id (grouped alone, no GRPO signal)"] += 1
            out.append({
                "episode_id": episode,
                "task_id": task,
                "agent_name": row.get("agent_name"),
                "turn_index": row.get("turn_index"),
                "candidate_index": row.get("candidate_index"),
                "trace_id": row["trace_id"],
                "span_id": row["span_id"],
                "request_model": row.get("request_model"),
                "policy_version": row.get("policy_version"),
                "prompt_ids": prompt,
                "completion_ids": completion,
                "completion_mask": [1] * len(completion),
                "behaviour_logprobs": logprobs,
                "reward": reward,
                "group_id": f"task:{task}" if task is not None else f"episode:{episode}",
                "start_time_unix_nano": row["start_time_unix_nano"],
            })
    stats.transitions = len(out)
    return pa.Table.from_pylist(out, schema=TRANSITION_SCHEMA), stats


def read_spans(source: str | os.PathLike[str] | list[str | os.PathLike[str]]) -> pa.Table:
    """Read span Parquet (file, directory tree or list), refusing files that lack a column."""
    tables = []
    for path in iter_parquet_files(source):
        table = read_checked(path, REQUIRED_SPAN_COLUMNS)
        keep = [c for c in SPAN_SCHEMA.names if c in table.column_names]
        tables.append(table.select(keep))
    if not tables:
        raise FileNotFoundError(f"no span Parquet files under {source}")
    return pa.concat_tables(tables, promote_options="default")


def convert(source: str | os.PathLike[str], out_path: str | os.PathLike[str], *,
            missing_reward: Literal["drop"] | float = "drop") -> ConversionStats:
    """Span Parquet under ``source`` -> transitions Parquet at ``out_path`` (written atomically)."""
    table, stats = spans_to_transitions(read_spans(source), missing_reward=missing_reward)
    write_table_atomic(table, Path(out_path))
    return stats
