"""TraceToTransitions: span rows -> one transition per agent per turn, with rewards and groups.

The converter decides what the trainer learns from, so it is explicit about every choice:

* **Transitions.** LLM spans (``gen_ai.operation.name = chat``) with token ids. An agent's calls
  within one turn (same episode, agent, turn and candidate) are merged into one transition when
  each next prompt extends the context so far (previous prompt + completion): the tokens the
  next prompt adds (tool results, other agents' messages) join the completion with mask 0, so
  they are context, not trained on. A call that does not extend the context starts a new
  transition, and is counted.
* **Turns.** From ``agl_bridge.turn.index`` when the span has it. Otherwise from the
  orchestrator's coordination round (``agl_bridge.coordination.round``, which every span inside
  an ``agl_bridge.coordination.round`` span carries): a round is one turn of each agent in it.
  Otherwise inferred from the order of the calls: within an episode, in time order, an agent's
  turn is a run of its calls not interrupted by another agent's call (an agent's turn ends
  when another agent speaks); calls with no agent are one turn each. Both are counted.
* **Rewards** (``agl_bridge.reward`` spans) are matched within their episode only, by scope;
  see ``agl_bridge.trainer.credit`` for AT-GRPO mixing and LightningRL's identical assignment.
  A non-finite reward is rejected with its location (span id, and file when read from disk).
* **Groups and advantages** as configured (``ConvertConfig``); written with each transition.

Bad input never stops the batch: LLM spans without token ids, empty completions, duplicate span
ids, episodes without a reward (``missing_reward``), clock skew (end before start) and
unreadable files are skipped or noted and counted. The converter does not walk parent links
(every span carries its scope), so orphans, missing parents and cycles cannot derail it.

Speed: the conversion is columnar (``agl_bridge.trainer.columnar``: Arrow and numpy, token ids
never become Python objects). The per-call Python loop it replaced stays as
``reference_spans_to_transitions``: the oracle the fast path is tested against, and the path
for retokenization.

Memory: ``convert`` streams. A first pass over three small columns (episode, trace, task)
finds where each *unit* has been read whole: a unit is a task with all its episodes (a GRPO
group spans the episodes of one task; episodes that share tasks are joined), or an episode
without a task. The second pass reads batches of 16k rows, converts every unit as soon as it is
complete and writes its transitions, holding back only the rows of units still open. Memory
follows the batch size and the units in flight, not the dataset. If the first pass finds that
more than ``max_rows_in_memory`` rows would be held back (a task's episodes spread over the
whole input), ``convert`` instead spills the rows to hash buckets by task (temporary Parquet)
and converts bucket by bucket. Pure table in, table out: ``spans_to_transitions``.

Duplicate span ids are detected within a unit (a span exported twice lies in its own episode).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import (
    SchemaError,
    iter_parquet_files,
    read_checked,
    write_table_atomic,
    writer_options,
)
from agl_bridge.schema import REQUIRED_SPAN_COLUMNS, SPAN_SCHEMA, TRANSITION_SCHEMA
from agl_bridge.trainer import columnar
from agl_bridge.trainer.credit import (
    AdvantageUnit,
    Algorithm,
    EpisodeRewards,
    Key,
    Reward,
    advantages,
    group_key,
    transition_reward,
)

_OPTIONAL_COLUMNS = (
    "task_id", "agent_name", "turn_index", "candidate_index", "coordination_round",
    "request_model", "policy_version", "completion_logprobs", "reward_scope",
    "end_time_unix_nano",
)
_KEY_COLUMNS = ("trace_id", "span_id", "episode_id", "task_id", "agent_name", "turn_index",
                "candidate_index", "coordination_round", "start_time_unix_nano",
                "end_time_unix_nano", "request_model", "policy_version")
TURN_FROM_ROUND, TURN_INFERRED = columnar.TURN_FROM_ROUND, columnar.TURN_INFERRED


@dataclass(frozen=True)
class ConvertConfig:
    """How spans become transitions. Defaults: AT-GRPO."""

    algorithm: Algorithm = "at_grpo"
    alpha: float = 1.0  # AT-GRPO: weight of the team reward in r = alpha * team + local
    gamma: float = 1.0  # discount of the team reward over an agent's turns
    advantage_unit: AdvantageUnit = "transition"
    scale_advantages: bool = True  # divide by the group's std (GRPO); off: Dr. GRPO
    missing_reward: Literal["drop"] | float = "drop"  # an episode with no reward
    merge_turn_calls: bool = True
    # a tokenizer directory: rebuild ids from captured messages for spans without them
    # (flagged ``retokenized``), and count how often the rebuild disagrees with recorded ids
    retokenize: str | None = None


@dataclass
class ConversionStats:
    spans: int = 0
    episodes: int = 0
    llm_spans: int = 0
    transitions: int = 0
    files: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> LLM spans not converted
    notes: Counter = field(default_factory=Counter)  # reason -> worth knowing, not fatal
    rejected_rewards: list[str] = field(default_factory=list)  # where, first 20
    per_agent_turn: Counter = field(default_factory=Counter)  # (agent, turn) -> transitions
    rewards: list[float] = field(default_factory=list)
    zero_variance_groups: int = 0
    groups: int = 0

    def merge(self, other: ConversionStats) -> None:
        for name in ("spans", "episodes", "llm_spans", "transitions", "zero_variance_groups",
                     "groups"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skipped.update(other.skipped)
        self.notes.update(other.notes)
        self.per_agent_turn.update(other.per_agent_turn)
        self.rewards += other.rewards
        self.rejected_rewards += other.rejected_rewards[: max(0, 20 - len(self.rejected_rewards))]

    def summary(self) -> str:
        lines = [f"{self.spans} spans, {self.episodes} episodes, {self.llm_spans} LLM calls -> "
                 f"{self.transitions} transitions in {self.groups} groups "
                 f"({self.zero_variance_groups} with zero reward variance)"]
        if self.rewards:
            r = sorted(self.rewards)
            q = lambda f: r[min(len(r) - 1, int(f * len(r)))]  # noqa: E731
            lines.append(f"  reward: mean {math.fsum(r) / len(r):+.4f}, min {r[0]:+.4f}, "
                         f"p50 {q(0.5):+.4f}, max {r[-1]:+.4f}")
        if self.per_agent_turn:
            cells = ", ".join(f"{a}@{t}: {n}" for (a, t), n in sorted(
                self.per_agent_turn.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)))
            lines.append(f"  transitions per agent@turn: {cells}")
        lines += [f"  skipped {n} LLM call(s): {why}" for why, n in sorted(self.skipped.items())]
        lines += [f"  note: {n} x {why}" for why, n in sorted(self.notes.items())]
        lines += [f"  rejected reward: {where}" for where in self.rejected_rewards]
        return "\n".join(lines)


# -- the pure part ----------------------------------------------------------------------------
def _episode_keys(table: pa.Table) -> list[str]:
    episodes = table["episode_id"].to_pylist()
    traces = table["trace_id"].to_pylist()
    # Without the scoping API, one trace is one episode: the best guess that never mixes two.
    return [e if e is not None else f"trace:{t}" for e, t in zip(episodes, traces)]


def _column(table: pa.Table, name: str) -> list[Any]:
    return table[name].to_pylist() if name in table.column_names else [None] * table.num_rows


def _rewards(table: pa.Table, stats: ConversionStats, source: str
             ) -> dict[str, EpisodeRewards]:
    out: dict[str, EpisodeRewards] = defaultdict(EpisodeRewards)
    if table.num_rows == 0:
        return out
    episodes = _episode_keys(table)
    values, scopes = table["reward_value"].to_pylist(), _column(table, "reward_scope")
    agents, turns = _column(table, "agent_name"), _column(table, "turn_index")
    span_ids = table["span_id"].to_pylist()
    seen: set[str] = set()
    for i, value in enumerate(values):
        if span_ids[i] in seen:
            stats.notes["duplicate span id (later copy ignored)"] += 1
            continue
        seen.add(span_ids[i])
        if not math.isfinite(value):
            stats.notes["non-finite reward (rejected)"] += 1
            if len(stats.rejected_rewards) < 20:
                stats.rejected_rewards.append(
                    f"{value} in episode {episodes[i]}, span {span_ids[i]}{source}")
            continue
        why = out[episodes[i]].add(Reward(episodes[i], value, scopes[i], agents[i], turns[i]))
        if why:
            stats.notes[f"{why} (ignored)"] += 1
    return out


def _infer_turns(rows: list[dict[str, Any]], stats: ConversionStats) -> None:
    """Fill missing turns: an agent's turn is a run of its calls until another agent speaks."""
    by_episode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_episode[r["episode"]].append(r)
    for calls in by_episode.values():
        if all(r["turn"] is not None for r in calls):
            continue
        calls.sort(key=lambda r: (r["start"] or 0, r["span_id"]))
        turns: Counter = Counter()
        previous_agent: Any = object()
        for r in calls:
            agent = r["agent"]
            if agent is None or agent != previous_agent:
                turns[agent] += 1
            previous_agent = agent
            if r["turn"] is None:
                r["turn"] = turns[agent] - 1
                stats.notes[TURN_INFERRED] += 1


def _retokenizer(tokenizer_dir: str | None):
    if tokenizer_dir is None:
        return None
    from agl_bridge.trainer.retokenize import Retokenizer

    return Retokenizer(tokenizer_dir)


def _rebuild(retokenizer, raw_attributes: str | None, stats: ConversionStats, *, has_ids: bool,
             row: int, llm: pa.Table) -> tuple[list[int], list[int]] | None:
    """Ids rebuilt from the span's messages; where the span has recorded ids, count agreement."""
    try:
        rebuilt = retokenizer.ids(json.loads(raw_attributes) if raw_attributes else {})
    except (ValueError, TypeError, KeyError) as exc:
        stats.notes[f"messages could not be retokenized ({type(exc).__name__})"] += 1
        return None
    if rebuilt is None:
        return None
    if has_ids:
        recorded = llm.slice(row, 1).select(["prompt_token_ids", "completion_token_ids"]
                                            ).to_pylist()[0]
        for part, mine, theirs in (("prompt", rebuilt[0], recorded["prompt_token_ids"]),
                                   ("completion", rebuilt[1], recorded["completion_token_ids"])):
            agrees = "agrees with" if mine == theirs else "differs from"
            stats.notes[f"retokenized {part} {agrees} the recorded ids"] += 1
    return rebuilt


def _merge(group: list[dict[str, Any]], lists: dict[int, tuple], stats: ConversionStats
           ) -> list[dict[str, Any]]:
    """One agent-turn's calls (time order) -> merged transitions (see the module docstring)."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    context: list[int] = []
    for r in group:
        prompt, completion, logprobs = lists[r["row"]]
        if cur is not None and prompt[:len(context)] == context:
            observation = prompt[len(context):]
            cur["completion"] += observation + completion
            cur["mask"] += [0] * len(observation) + [1] * len(completion)
            if cur["logprobs"] is not None and logprobs is not None:
                cur["logprobs"] += [0.0] * len(observation) + list(logprobs)
            else:
                cur["logprobs"] = None
            cur["merged"] += 1
            cur["retokenized"] = cur.get("retokenized", False) or "lists" in r
            context = prompt + completion
            continue
        if cur is not None:
            stats.notes["call does not extend its turn's context (kept separate)"] += 1
            out.append(cur)
        cur = {**r, "prompt": list(prompt), "completion": list(completion),
               "mask": [1] * len(completion),
               "logprobs": list(logprobs) if logprobs is not None else None, "merged": 1,
               "retokenized": "lists" in r}
        context = list(prompt) + list(completion)
    if cur is not None:
        out.append(cur)
    return out


def spans_to_transitions(spans: pa.Table, config: ConvertConfig | None = None, *,
                         missing_reward: Literal["drop"] | float | None = None,
                         source: str = "") -> tuple[pa.Table, ConversionStats]:
    """Transitions from a span table (SPAN_SCHEMA columns; the required ones at least).

    ``source`` names where the rows came from, for messages. Runs the columnar fast path
    (``agl_bridge.trainer.columnar``); retokenization, and input it does not handle, go
    through the reference implementation, which gives the same transitions.
    """
    cfg = config or ConvertConfig()
    if missing_reward is not None:
        cfg = ConvertConfig(**{**cfg.__dict__, "missing_reward": missing_reward})
    if cfg.retokenize:
        return reference_spans_to_transitions(spans, cfg, source=source)
    try:
        return _fast_spans_to_transitions(spans, cfg, source)
    except columnar.Unsupported:
        return reference_spans_to_transitions(spans, cfg, source=source)


def _fast_spans_to_transitions(spans: pa.Table, cfg: ConvertConfig, source: str,
                               select: Any = None) -> tuple[pa.Table, ConversionStats]:
    """The columnar path over the rows ``select`` (a numpy boolean mask; all without)."""
    spans = columnar.conform(spans).combine_chunks()
    episodes = columnar.episode_keys(spans)
    is_reward = pc.is_valid(spans["reward_value"])
    if select is None:
        stats = ConversionStats(spans=spans.num_rows)
        stats.episodes = len(pc.unique(episodes))
    else:
        stats = ConversionStats(spans=int(select.sum()))
        stats.episodes = len(pc.unique(episodes.filter(columnar.np_array(select))))
        is_reward = pc.and_(is_reward, columnar.np_array(select))
    reward_rows = spans.select(["trace_id", "span_id", "episode_id", "agent_name", "turn_index",
                                "reward_value", "reward_scope"]).filter(is_reward)
    rewards = _rewards(reward_rows, stats, source)
    table = columnar.convert_table(spans, cfg, stats, rewards, episodes=episodes, select=select)
    return table, stats


HOLEY_LIST = "null inside an id or logprob list (the list is ignored)"


def _without_holey_lists(spans: pa.Table, stats: ConversionStats) -> pa.Table:
    """A list of ids or logprobs with a null inside counts as absent (the call is skipped for
    missing ids, or keeps no logprobs), counted: a hole cannot be trained on, and the
    transition schema's lists hold no nulls. Capture never writes one (``otel.rows``
    promotes only whole lists of numbers); tables built by hand can hold them."""
    for name in ("prompt_token_ids", "completion_token_ids", "completion_logprobs"):
        if name not in spans.column_names:
            continue
        col = spans[name]
        if col.type != SPAN_SCHEMA.field(name).type:
            col = col.cast(SPAN_SCHEMA.field(name).type)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        flat = pc.list_flatten(col)
        if flat.null_count:
            import numpy as np

            parents = pc.list_parent_indices(col).filter(pc.is_null(flat))
            holey = np.zeros(len(col), bool)
            holey[columnar.to_numpy(parents)] = True
            stats.notes[HOLEY_LIST] += int(holey.sum())
            col = pc.if_else(columnar.np_array(holey), pa.nulls(len(col), col.type), col)
        spans = spans.set_column(spans.column_names.index(name), name, col)
    return spans


def reference_spans_to_transitions(spans: pa.Table, config: ConvertConfig | None = None, *,
                                   missing_reward: Literal["drop"] | float | None = None,
                                   source: str = "") -> tuple[pa.Table, ConversionStats]:
    """The reference implementation: a Python loop per call, kept as the fast path's oracle
    (``tests/test_convert_columnar.py``) and for retokenization."""
    cfg = config or ConvertConfig()
    if missing_reward is not None:
        cfg = ConvertConfig(**{**cfg.__dict__, "missing_reward": missing_reward})
    stats = ConversionStats(spans=spans.num_rows)
    needed = [c for c in (*REQUIRED_SPAN_COLUMNS, *_OPTIONAL_COLUMNS, "attributes")
              if c in spans.column_names and (c != "attributes" or cfg.retokenize)]
    spans = _without_holey_lists(spans.select(needed), stats)  # select: zero-copy
    stats.episodes = len(pc.unique(pc.coalesce(
        spans["episode_id"], pc.binary_join_element_wise("trace:", spans["trace_id"], ""))))
    rewards = _rewards(spans.filter(pc.is_valid(spans["reward_value"])), stats, source)

    llm = spans.filter(pc.equal(spans["operation_name"], sc.OP_CHAT))
    stats.llm_spans = llm.num_rows
    if "completion_logprobs" not in llm.column_names:
        llm = llm.append_column("completion_logprobs", pa.nulls(
            llm.num_rows, SPAN_SCHEMA.field("completion_logprobs").type))
    episodes = _episode_keys(llm)
    cols = {c: _column(llm, c) for c in _KEY_COLUMNS}
    has_prompt = pc.is_valid(llm["prompt_token_ids"]).to_pylist()
    completion_len = pc.fill_null(pc.list_value_length(llm["completion_token_ids"]), -1
                                  ).to_pylist()
    logprobs_len = pc.list_value_length(llm["completion_logprobs"]).to_pylist()
    bad_logprobs: set[int] = set()
    retokenizer = _retokenizer(cfg.retokenize)
    attributes = _column(llm, "attributes") if retokenizer is not None else []
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for i in range(llm.num_rows):
        ident = (cols["trace_id"][i], cols["span_id"][i])
        if ident in seen:
            stats.notes["duplicate span id (later copy ignored)"] += 1
            continue
        seen.add(ident)
        rebuilt = None
        if retokenizer is not None:
            rebuilt = _rebuild(retokenizer, attributes[i], stats,
                               has_ids=has_prompt[i] and completion_len[i] >= 0, row=i, llm=llm)
        if rebuilt is None and (not has_prompt[i] or completion_len[i] < 0):
            stats.skipped["no token ids on the LLM span"] += 1
            continue
        if rebuilt is None and completion_len[i] == 0:
            stats.skipped["empty completion"] += 1
            continue
        if logprobs_len[i] is not None and logprobs_len[i] != completion_len[i]:
            stats.notes["logprobs length differs from completion (logprobs dropped)"] += 1
            bad_logprobs.add(i)
        start, end = cols["start_time_unix_nano"][i], cols["end_time_unix_nano"][i]
        if start is not None and end is not None and end < start:
            stats.notes["span ends before it starts (clock skew; kept)"] += 1
        turn = cols["turn_index"][i]
        if turn is None and cols["coordination_round"][i] is not None:
            turn = cols["coordination_round"][i]
            stats.notes[TURN_FROM_ROUND] += 1
        row = {"row": i, "episode": episodes[i], "task": cols["task_id"][i],
                     "agent": cols["agent_name"][i], "turn": turn,
                     "candidate": cols["candidate_index"][i], "start": start,
                     "trace_id": ident[0], "span_id": ident[1],
                     "model": cols["request_model"][i], "policy": cols["policy_version"][i]}
        if rebuilt is not None and not (has_prompt[i] and completion_len[i] >= 0):
            row["lists"] = (rebuilt[0], rebuilt[1], None)  # ids only from the rebuild
            stats.notes["ids rebuilt from messages (retokenized)"] += 1
        rows.append(row)
    _infer_turns(rows, stats)

    # reward first: an episode without one is dropped (or filled) before any list is touched
    kept = []
    for r in rows:
        ep = rewards.get(r["episode"])
        if ep is None or ep.empty:
            if cfg.missing_reward == "drop":
                stats.skipped["episode has no reward"] += 1
                continue
            ep = rewards[r["episode"]]
            ep.team, ep.has_team = float(cfg.missing_reward), True
        kept.append(r)

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in kept:
        groups[(r["episode"], r["agent"], r["turn"], r["candidate"])].append(r)
    singles = [g[0] for g in groups.values() if len(g) == 1 or not cfg.merge_turn_calls]
    if not cfg.merge_turn_calls:
        singles = [r for g in groups.values() for r in g]
    rebuilt_singles = [{**r, "prompt": r["lists"][0], "completion": r["lists"][1],
                        "mask": [1] * len(r["lists"][1]), "logprobs": None, "merged": 1}
                       for r in singles if "lists" in r]
    singles = [r for r in singles if "lists" not in r]
    multi = [sorted(g, key=lambda r: (r["start"] or 0, r["span_id"]))
             for g in groups.values() if len(g) > 1 and cfg.merge_turn_calls]
    merged: list[dict[str, Any]] = []
    if multi:
        idx = [r["row"] for g in multi for r in g]
        part = llm.take(pa.array(idx, pa.int64()))
        lists = {i: (p, c, None if i in bad_logprobs else lp) for i, p, c, lp in zip(
            idx, part["prompt_token_ids"].to_pylist(), part["completion_token_ids"].to_pylist(),
            part["completion_logprobs"].to_pylist())}
        for g in multi:
            lists.update({r["row"]: r["lists"] for r in g if "lists" in r})
            merged += _merge(g, lists, stats)
    merged = rebuilt_singles + merged

    everything = singles + merged
    last_turn: dict[tuple, int] = {}
    for r in everything:
        if r["turn"] is not None:
            k = (r["episode"], r["agent"])
            last_turn[k] = max(last_turn.get(k, r["turn"]), r["turn"])
    keys = [Key(r["episode"], r["task"], r["agent"], r["turn"], r["candidate"]) for r in everything]
    reward_values = [transition_reward(k, rewards[k.episode], algorithm=cfg.algorithm,
                                       alpha=cfg.alpha, gamma=cfg.gamma,
                                       last_turn=last_turn.get((k.episode, k.agent)))
                     for k in keys]
    group_ids = [group_key(k, cfg.algorithm) for k in keys]
    advs, zero_var = advantages(reward_values, group_ids, [k.episode for k in keys],
                                unit=cfg.advantage_unit, scale=cfg.scale_advantages)
    if any(k.task is None for k in keys):
        stats.notes["transition without task id (its own group: no GRPO signal)"] += sum(
            k.task is None for k in keys)
    stats.transitions, stats.rewards = len(everything), reward_values
    stats.groups, stats.zero_variance_groups = len(set(group_ids)), zero_var
    stats.per_agent_turn.update((r["agent"], r["turn"]) for r in everything)
    table = _build_table(llm, singles, merged, keys, reward_values, group_ids, advs,
                         bad_logprobs)
    return table, stats


def _build_table(llm: pa.Table, singles: list[dict], merged: list[dict], keys: list[Key],
                 reward_values: list[float], group_ids: list[str], advs: list[float],
                 bad_logprobs: set[int]) -> pa.Table:
    """Single calls keep their id lists as Arrow arrays (no Python per token); merged ones are
    built from the Python lists their merge produced."""
    everything = singles + merged
    n_single = len(singles)
    meta = {
        "episode_id": [k.episode for k in keys], "task_id": [k.task for k in keys],
        "agent_name": [k.agent for k in keys], "turn_index": [k.turn for k in keys],
        "candidate_index": [k.candidate for k in keys],
        "trace_id": [r["trace_id"] for r in everything],
        "span_id": [r["span_id"] for r in everything],
        "merged_calls": [r.get("merged", 1) for r in everything],
        "request_model": [r["model"] for r in everything],
        "policy_version": [r["policy"] for r in everything],
        "reward": reward_values, "group_id": group_ids, "advantage": advs,
        "retokenized": [bool(r.get("retokenized", "lists" in r)) for r in everything],
        "start_time_unix_nano": [r["start"] for r in everything],
    }
    rows_idx = [r["row"] for r in singles]
    lists_only = llm.select(["prompt_token_ids", "completion_token_ids", "completion_logprobs"])
    if rows_idx == list(range(llm.num_rows)):
        taken = lists_only  # the common case: every call is its own transition, in order
    else:
        taken = lists_only.take(pa.array(rows_idx, pa.int64()))
    completion = taken["completion_token_ids"].combine_chunks()
    ones = pc.cast(pc.add(pc.multiply(completion.flatten(), 0), 1), pa.int8())
    mask = pa.ListArray.from_arrays(completion.offsets, ones)
    logprobs = pc.cast(taken["completion_logprobs"].combine_chunks(),
                       TRANSITION_SCHEMA.field("behaviour_logprobs").type)
    if bad_logprobs:
        drop = pa.array([r["row"] in bad_logprobs for r in singles], pa.bool_())
        logprobs = pc.if_else(drop, pa.nulls(len(singles), logprobs.type), logprobs)

    def column(name: str, single_part: pa.Array, merged_values: list) -> pa.ChunkedArray:
        typ = TRANSITION_SCHEMA.field(name).type
        return pa.chunked_array([pc.cast(single_part, typ), pa.array(merged_values, typ)], typ)

    lists = {
        "prompt_ids": column("prompt_ids", taken["prompt_token_ids"].combine_chunks(),
                             [r["prompt"] for r in merged]),
        "completion_ids": column("completion_ids", completion, [r["completion"] for r in merged]),
        "completion_mask": column("completion_mask", mask, [r["mask"] for r in merged]),
        "behaviour_logprobs": column("behaviour_logprobs", logprobs,
                                     [r["logprobs"] for r in merged]),
    }
    data = {}
    for f in TRANSITION_SCHEMA:
        if f.name in lists:
            data[f.name] = lists[f.name]
        else:
            data[f.name] = pa.chunked_array([pa.array(meta[f.name][:n_single], f.type),
                                             pa.array(meta[f.name][n_single:], f.type)], f.type)
    # Row order carries no meaning (the trainer shuffles); sorting would copy every id list.
    return pa.Table.from_pydict(data, schema=TRANSITION_SCHEMA)


# -- the IO edge ------------------------------------------------------------------------------
def read_spans(source: str | os.PathLike[str] | list[str | os.PathLike[str]],
               stats: ConversionStats | None = None,
               columns: list[str] | None = None) -> pa.Table:
    """Span Parquet (file, directory tree or list) as one table. A file that lacks a required
    column is refused by name; a file that cannot be read at all (truncated, not Parquet) is
    counted in ``stats`` and skipped when ``stats`` is given, else it raises."""
    return pa.concat_tables(list(_read_tables(source, stats, columns)) or [_empty()],
                            promote_options="default")


def _empty() -> pa.Table:
    return SPAN_SCHEMA.empty_table()


def _read_tables(source, stats: ConversionStats | None,
                 columns: list[str] | None = None) -> Iterator[pa.Table]:
    files = list(iter_parquet_files(source))
    if not files:
        raise FileNotFoundError(f"no span Parquet files under {source}")
    for path in files:
        try:
            table = read_checked(path, REQUIRED_SPAN_COLUMNS, columns)
        except SchemaError:
            raise
        except (pa.ArrowInvalid, OSError) as exc:
            if stats is None:
                raise
            stats.notes[f"unreadable file skipped: {path.name} ({type(exc).__name__})"] += 1
            continue
        if stats is not None:
            stats.files += 1
        keep = [c for c in SPAN_SCHEMA.names if c in table.column_names]
        yield table.select(keep)


def _episode_tasks(files: list[Path]) -> dict[str, str]:
    """Episode -> task, from a cheap first pass over three columns. Buckets must hold whole
    groups (a GRPO group spans the episodes of a task), so they are keyed by task."""
    tasks: dict[str, str] = {}
    for path in files:
        try:
            t = pq.read_table(path, columns=["episode_id", "trace_id", "task_id"])
        except (pa.ArrowInvalid, OSError, KeyError):
            continue  # unreadable or without task ids: read (and counted) in the second pass
        t = t.filter(pc.is_valid(t["task_id"]))
        for episode, task in zip(_episode_keys(t), t["task_id"].to_pylist()):
            tasks.setdefault(episode, task)
    return tasks


def _bucket_of(table: pa.Table, buckets: int, tasks: dict[str, str]) -> list[int]:
    return [zlib.crc32(tasks.get(k, k).encode()) % buckets for k in _episode_keys(table)]


@contextmanager
def _short_lived_arrays() -> Iterator[None]:
    """Allocators suited to memory that lives for one batch, for the call, then restored.

    Each batch allocates a few hundred MiB and frees them. Memory handed back to the kernel
    comes back zeroed at its next touch (``clear_page``), in 2 MiB huge pages where the
    allocator asked for them, so a conversion kept paying for zeroing:

    * numpy asks for huge pages for every array of 4 MiB or more: off (numpy's private
      switch; nothing happens if it is gone). 1M-span benchmark: 0.5-1.0 CPU s less.
    * Arrow's default pool (mimalloc) returned the Parquet reader's growing buffers and
      faulted them in again batch after batch (perf: clear_page 9.8% of the CPU samples);
      jemalloc keeps freed extents for reuse a while (clear_page 1.0%). Used where the wheel
      has it, unless ``ARROW_DEFAULT_MEMORY_POOL`` chooses a pool. Both switches are
      process-wide: other threads allocating meanwhile get the same allocators, which is
      harmless (buffers remember their pool).
    """
    restore: list[Callable[[], Any]] = []
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    if _set_madvise_hugepage is not None:
        previous = _set_madvise_hugepage(False)
        restore.append(lambda: _set_madvise_hugepage(previous))
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pool = pa.jemalloc_memory_pool()
        except NotImplementedError:  # a build without jemalloc (Windows wheels)
            pool = None
        if pool is not None:
            previous_pool = pa.default_memory_pool()
            pa.set_memory_pool(pool)
            restore.append(lambda: pa.set_memory_pool(previous_pool))
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()


@_short_lived_arrays()
def convert(source: str | os.PathLike[str] | list, out_path: str | os.PathLike[str],
            config: ConvertConfig | None = None, *,
            missing_reward: Literal["drop"] | float | None = None,
            max_rows_in_memory: int = 100_000,
            progress: Callable[[int, int], None] | None = None) -> ConversionStats:
    """Spans under ``source`` -> transitions Parquet at ``out_path`` (atomic).

    ``source``: span Parquet (a file, a directory tree of partitions, or a list), or OTLP/JSON
    files as the OpenTelemetry Collector's file exporter writes them (``*.json``, ``*.jsonl``,
    gzipped too). Spans already in memory: ``spans_to_transitions(spans_to_table(spans))``.

    Only the columns conversion uses are read (the JSON blobs only when retokenizing).
    Streams: units (a task with its episodes) are converted as soon as they have been read
    whole, so memory stays near a batch plus the units in flight (see the module docstring).
    If more than ``max_rows_in_memory`` rows would wait for their unit, or when retokenizing,
    rows are instead spilled to hash buckets by task (a GRPO group spans the episodes of one
    task) and converted bucket by bucket (a dataset of at most ``max_rows_in_memory`` rows
    that cannot stream is converted in memory). ``progress(done, total)`` is called per batch
    read (streaming) or per bucket.
    """
    cfg = config or ConvertConfig()
    if missing_reward is not None:
        cfg = ConvertConfig(**{**cfg.__dict__, "missing_reward": missing_reward})
    otlp_files = _otlp_json_files(source)
    if otlp_files:  # Collector file-exporter output: import to span Parquet, then convert that
        with tempfile.TemporaryDirectory(prefix="agl-bridge-otlp-") as tmp:
            from agl_bridge.otel.parquet_writer import SpanParquetWriter
            from agl_bridge.otel.receiver import import_otlp_json

            writer = SpanParquetWriter(tmp, background_rotation=False, recover=False)
            summary = import_otlp_json(otlp_files, writer)
            writer.close()
            stats = convert(tmp, out_path, cfg, max_rows_in_memory=max_rows_in_memory,
                            progress=progress)
            if summary.lines_bad:
                stats.notes["OTLP/JSON line that could not be read (quarantined)"] += \
                    summary.lines_bad
            return stats
    stats = ConversionStats()
    files = list(iter_parquet_files(source))
    if not files:
        raise FileNotFoundError(f"no span Parquet files under {source}")
    columns = _columns_for(cfg)
    if not cfg.retokenize:
        plan = _stream_plan(files, max_rows_in_memory)
        if plan is not None:
            return _convert_streaming(plan, out_path, cfg, columns, f" (under {source})",
                                      progress)
    total_rows = 0
    for path in files:
        try:
            total_rows += pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowInvalid, OSError):
            pass  # counted when read
    if total_rows <= max_rows_in_memory:
        read_stats = ConversionStats()
        spans = read_spans(files, read_stats, columns)
        table, stats = spans_to_transitions(spans, cfg, source=f" (under {source})")
        stats.notes.update(read_stats.notes)
        stats.files = read_stats.files
        if progress:
            progress(1, 1)
        write_table_atomic(table, Path(out_path))
        return stats

    buckets = max(2, math.ceil(total_rows / max(1, max_rows_in_memory // 2)))
    spill = Path(tempfile.mkdtemp(prefix="agl-bridge-convert-"))
    try:
        writers: dict[int, pq.ParquetWriter] = {}
        read_stats = ConversionStats()
        tasks = _episode_tasks(files)
        for table in _read_tables(files, read_stats, columns):
            table = table.cast(pa.schema([SPAN_SCHEMA.field(c) for c in table.column_names]))
            table = _conform(table, columns)
            ids = pa.array(_bucket_of(table, buckets, tasks), pa.int32())
            for b in range(buckets):
                part = table.filter(pc.equal(ids, b))
                if part.num_rows:
                    if b not in writers:
                        writers[b] = pq.ParquetWriter(spill / f"{b}.parquet", part.schema,
                                                      **writer_options(part.schema))
                    writers[b].write_table(part)
        for w in writers.values():
            w.close()
        stats.notes.update(read_stats.notes)
        stats.files = read_stats.files
        out_writer = None
        tmp_out = Path(out_path).with_name(f".tmp-{os.getpid()}-{Path(out_path).name}")
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            done_buckets = sorted(writers)
            for n, b in enumerate(done_buckets, 1):
                part_table, part_stats = spans_to_transitions(
                    pq.read_table(spill / f"{b}.parquet"), cfg, source=f" (under {source})")
                stats.merge(part_stats)
                if out_writer is None:
                    out_writer = pq.ParquetWriter(tmp_out, TRANSITION_SCHEMA,
                                                  **writer_options(TRANSITION_SCHEMA))
                out_writer.write_table(part_table)
                if progress:
                    progress(n, len(done_buckets))
            if out_writer is None:
                write_table_atomic(TRANSITION_SCHEMA.empty_table(), Path(out_path))
            else:
                out_writer.close()
                os.replace(tmp_out, out_path)
        finally:
            if tmp_out.exists():
                tmp_out.unlink()
        return stats
    finally:
        shutil.rmtree(spill, ignore_errors=True)


# -- streaming: episode-complete chunks --------------------------------------------------------
@dataclass
class _StreamPlan:
    files: list[tuple[Path, int, str | None]]  # path, first row's position, why unreadable
    episodes: pa.Array  # episode keys
    done_at: Any  # numpy, per episode: position of the last row of its unit
    first: Any  # numpy, per episode: position of its first row
    unit_first: Any  # numpy, per episode: position of the first row of its unit
    batch_rows: int
    batches: int

    def lookup(self, keys: pa.Array, start: int, end: int) -> tuple[Any, Any, Any]:
        """For rows at positions [start, end) with these episode keys: (episode known, done
        at, unit begun before ``start``), hashing only the episodes that can be there."""
        import numpy as np

        cand = np.flatnonzero((self.first < end) & (self.done_at >= start))
        idx = pc.index_in(keys, value_set=self.episodes.take(columnar.np_array(cand)))
        known = (columnar.to_numpy(pc.is_valid(idx)) if idx.null_count
                 else np.ones(len(keys), bool))
        ep = cand[columnar.to_numpy(pc.fill_null(idx, columnar.lit(0, idx.type)))] if len(
            cand) else np.zeros(len(keys), np.int64)
        done = np.where(known, self.done_at[ep] if len(cand) else 0, np.iinfo(np.int64).max)
        return known, done, known & (self.unit_first[ep] < start if len(cand) else False)


_PLAN_COLUMNS = ["episode_id", "trace_id", "task_id"]


def _stream_plan(files: list[Path], max_rows_in_memory: int) -> _StreamPlan | None:
    """First pass, over two or three small columns: where each episode's unit (its task: a
    GRPO group spans the episodes of one task; episodes sharing a task are joined; an episode
    without a task is its own unit) has been read whole. None when streaming would hold more
    than ``max_rows_in_memory`` rows waiting for units to complete (units spread across the
    whole input): then the caller spills. Numpy aggregation only (no Acero: importing it costs
    about half a second)."""
    import numpy as np

    batch_rows = max(1, min(16_384, max_rows_in_memory // 2))
    keys, firsts, lasts, counts, pair_eps, pair_tasks = [], [], [], [], [], []
    plan_files, boundaries = [], []
    pos = 0
    for path, summary in _map_files(_plan_file, files):
        if isinstance(summary, str):  # unreadable: counted (and named) in the second pass
            plan_files.append((path, pos, summary))
            continue
        plan_files.append((path, pos, None))
        n, dictionary, first, last, count, pairs = summary
        if n == 0:
            continue
        boundaries += list(range(pos + batch_rows, pos + n, batch_rows)) + [pos + n]
        keys.append(dictionary)
        firsts.append(first + pos)
        lasts.append(last + pos)
        counts.append(count)
        if pairs is not None:
            pair_eps.append(pairs[0])
            pair_tasks.append(pairs[1])
        pos += n
    if not keys:
        z = np.zeros(0, np.int64)
        return _StreamPlan(plan_files, pa.nulls(0, pa.string()), z, z, z, batch_rows, 0)
    enc = pc.dictionary_encode(pa.chunked_array(keys).combine_chunks())
    ep_of = columnar.to_numpy(enc.indices).astype(np.int64)
    episodes = enc.dictionary
    n_eps = len(episodes)
    first = np.full(n_eps, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, ep_of, np.concatenate(firsts))
    last = np.zeros(n_eps, np.int64)
    np.maximum.at(last, ep_of, np.concatenate(lasts))
    count = np.bincount(ep_of, weights=np.concatenate(counts), minlength=n_eps).astype(np.int64)
    unit = _units(episodes, pair_eps, pair_tasks)
    n_units = int(unit.max()) + 1
    u_first = np.full(n_units, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(u_first, unit, first)
    u_last = np.zeros(n_units, np.int64)
    np.maximum.at(u_last, unit, last)
    u_count = np.bincount(unit, weights=count, minlength=n_units).astype(np.int64)
    # rows held at a batch boundary b: those of units begun before b and not complete at b
    b = np.asarray(sorted(boundaries), np.int64)
    lo = np.searchsorted(b, u_first, side="right")
    hi = np.searchsorted(b, u_last, side="right")
    held = np.zeros(len(b) + 1, np.int64)
    np.add.at(held, lo, u_count)
    np.add.at(held, np.minimum(hi, len(b)), -u_count)
    if len(b) and int(np.cumsum(held)[:-1].max(initial=0)) > max_rows_in_memory:
        return None
    return _StreamPlan(plan_files, episodes, u_last[unit], first, u_first[unit], batch_rows,
                       len(boundaries))


def _plan_file(path: Path) -> tuple | str:
    """One file's part of the plan, positions relative to the file: (rows, episode keys,
    first and last row and row count per key, distinct (episode, task) pairs or None); the
    exception's name if the file cannot be read. A missing required column raises."""
    import numpy as np

    try:
        pf = pq.ParquetFile(path, memory_map=True)
        names = pf.schema_arrow.names
        if any(c not in names for c in REQUIRED_SPAN_COLUMNS):
            read_checked(path, REQUIRED_SPAN_COLUMNS)  # raises, naming file and column
        t = pf.read(columns=[c for c in _PLAN_COLUMNS if c in names and
                             (c != "trace_id" or _may_be_null(pf, "episode_id"))],
                    use_threads=False)
    except SchemaError:
        raise
    except (pa.ArrowInvalid, OSError) as exc:
        return type(exc).__name__
    n = t.num_rows
    if n == 0:
        return 0, None, None, None, None, None
    enc = pc.dictionary_encode(columnar.episode_keys(t))
    codes = columnar.to_numpy(enc.indices).astype(np.int64)
    k = len(enc.dictionary)
    _, first = np.unique(codes, return_index=True)
    _, last = np.unique(codes[::-1], return_index=True)
    pairs = None
    if "task_id" in t.column_names and t["task_id"].null_count < n:
        task = columnar._arr(t["task_id"])
        with_task = np.flatnonzero(columnar.to_numpy(task.is_valid()))
        task_codes = columnar._codes(task.take(columnar.np_array(with_task)))
        width = int(task_codes.max()) + 1
        pair = np.unique(codes[with_task] * width + task_codes)
        tdict = pc.dictionary_encode(task.take(columnar.np_array(with_task))).dictionary
        pairs = (enc.dictionary.take(columnar.np_array(pair // width)),
                 tdict.take(columnar.np_array(pair % width)))
    return n, enc.dictionary, first, n - 1 - last, np.bincount(codes, minlength=k), pairs


def _map_files(fn: Callable[[Path], Any], files: list[Path]) -> Iterator[tuple[Path, Any]]:
    """(path, fn(path)) in file order, a few files at a time: reading and hashing release the
    GIL, and the plan pass otherwise runs on one core while the others wait for it."""
    from concurrent.futures import ThreadPoolExecutor

    workers = min(4, os.cpu_count() or 1, len(files))
    if workers <= 1:
        yield from ((path, fn(path)) for path in files)
        return
    with ThreadPoolExecutor(workers, "agl-bridge-convert-plan") as pool:
        yield from zip(files, pool.map(fn, files))


def _may_be_null(pf: pq.ParquetFile, column: str) -> bool:
    """False only when the file's statistics say the column has no null."""
    meta = pf.metadata
    try:
        i = [pf.schema.column(k).path for k in range(len(pf.schema))].index(column)
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None or not st.has_null_count or st.null_count:
                return True
    except (ValueError, IndexError):
        return True
    return False


def _units(episodes: pa.Array, pair_eps: list, pair_tasks: list) -> Any:
    """Unit code per episode (numpy): from the distinct (episode, task) pairs, the connected
    component of episodes and tasks (one task per episode: its task); no task: itself."""
    import numpy as np

    n = len(episodes)
    if not pair_eps:
        return np.arange(n, dtype=np.int64)
    e_idx = pc.index_in(pa.chunked_array(pair_eps).combine_chunks(), value_set=episodes)
    e_idx = columnar.to_numpy(e_idx).astype(np.int64)
    t_codes = columnar._codes(pa.chunked_array(pair_tasks))
    # union-find over episodes (0..n-1) and tasks (n..): vectorised label propagation
    parent = np.arange(n + int(t_codes.max(initial=-1)) + 1, dtype=np.int64)
    a, b = e_idx, t_codes + n
    while True:
        ra, rb = parent[a], parent[b]
        low = np.minimum(ra, rb)
        changed = (parent[ra] != low) | (parent[rb] != low)
        np.minimum.at(parent, ra, low)
        np.minimum.at(parent, rb, low)
        parent = parent[parent]  # path halving
        if not changed.any():
            break
    while True:  # full compression
        nxt = parent[parent]
        if (nxt == parent).all():
            break
        parent = nxt
    return np.unique(parent[:n], return_inverse=True)[1].reshape(-1).astype(np.int64)


# Batches between two hand-backs of freed memory. The allocators reuse what a batch freed for
# the next, so memory plateaus within a few batches anyway (1M-span benchmark: 400-450 MiB
# from the 8th batch on without any hand-back); handing back costs time, since the next batch
# faults every page in again: after every batch it took a quarter of the conversion's CPU.
_RELEASE_EVERY = 32


def _release_memory() -> None:
    """Give freed memory back to the system: Arrow's pool, and the C heap (numpy's
    temporaries; glibc keeps large freed blocks otherwise). A bound on slow growth from
    fragmentation on very long inputs."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


def _malloc_trim() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim() if os.name == "posix" else None


def _read_ahead(plan: _StreamPlan, columns: list[str]) -> Iterator[tuple]:
    """The second pass's reads, one batch ahead in a thread (Parquet decoding releases the
    GIL): ("batch", path, table), ("unreadable", path, why), ("read", path) per file."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: tuple) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def work() -> None:
        try:
            for path, start, unreadable in plan.files:
                if unreadable:
                    put(("unreadable", path, unreadable))
                    continue
                try:
                    pf = pq.ParquetFile(path, memory_map=True)
                    names = set(pf.schema_arrow.names)
                    # decoded in this thread alone: Arrow's pool would add two more
                    # threads on cores the converter and the writer already keep busy
                    # (six alternating pairs: 5.95 vs 6.17 s mean wall, 30-40 MiB less RSS)
                    for batch in pf.iter_batches(batch_size=plan.batch_rows, use_threads=False,
                                                 columns=[c for c in columns if c in names]):
                        put(("batch", path, columnar.conform(pa.Table.from_batches([batch])),
                             start))
                        start += batch.num_rows
                        if stop.is_set():
                            return
                except (pa.ArrowInvalid, OSError) as exc:
                    put(("unreadable", path, type(exc).__name__))
                    continue
                put(("read", path))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(("error", exc))
        put(("end",))

    thread = threading.Thread(target=work, name="agl-bridge-convert-read", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item[0] == "end":
                return
            if item[0] == "error":
                raise item[1]
            yield item
    finally:
        stop.set()
        thread.join()


def _convert_streaming(plan: _StreamPlan, out_path: str | os.PathLike[str], cfg: ConvertConfig,
                       columns: list[str], source: str,
                       progress: Callable[[int, int], None] | None) -> ConversionStats:
    """Second pass: read in batches; convert the rows of every unit read whole, hold the others
    back; write the transitions as they come. Reading, converting and writing overlap (a
    reader thread one batch ahead, a writer thread one table behind). Memory: a few batches
    plus the held rows."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    stats = ConversionStats()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".tmp-{os.getpid()}-{out_path.name}")
    pending: list[pa.Table] = []
    pending_rows = 0
    done_batches = 0
    writes: list = []

    def flush(pool: ThreadPoolExecutor, writer: pq.ParquetWriter) -> None:
        nonlocal pending, pending_rows
        if pending:
            while writes:  # at most one table waits to be written
                writes.pop(0).result()
            writes.append(pool.submit(writer.write_table, pa.concat_tables(pending)))
            pending, pending_rows = [], 0

    def convert_rows(rows: pa.Table, select: Any, pool, writer: pq.ParquetWriter) -> None:
        nonlocal pending_rows
        try:
            table, part = _fast_spans_to_transitions(rows, cfg, source, select)
        except columnar.Unsupported:
            if select is not None:
                rows = rows.filter(columnar.np_array(select))
            table, part = reference_spans_to_transitions(rows, cfg, source=source)
        stats.merge(part)
        if table.num_rows:
            pending.append(table)
            pending_rows += table.num_rows
            if pending_rows >= 8_192:
                flush(pool, writer)

    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f, ThreadPoolExecutor(1, "agl-bridge-convert-write") as pool:
            writer = pq.ParquetWriter(f, TRANSITION_SCHEMA, **writer_options(TRANSITION_SCHEMA))
            try:
                held: pa.Table | None = None  # rows of units still open, one chunk
                held_done = np.zeros(0, np.int64)
                for item in _read_ahead(plan, columns):
                    if item[0] == "unreadable":
                        stats.notes[f"unreadable file skipped: {item[1].name} ({item[2]})"] += 1
                        continue
                    if item[0] == "read":
                        stats.files += 1
                        continue
                    rows, start = item[2], item[3]
                    end = start + rows.num_rows
                    _, done, begun = plan.lookup(columnar.episode_keys(rows), start, end)
                    complete = done < end
                    fresh = complete & ~begun  # units wholly in this batch: converted in place
                    if fresh.any():
                        convert_rows(rows, None if fresh.all() else fresh, pool, writer)
                    late = complete & begun  # units completed now, with rows held before
                    held_complete = held_done < end
                    parts = []
                    if held is not None and held_complete.any():
                        parts.append(held.filter(columnar.np_array(held_complete)))
                    if late.any():
                        parts.append(rows.filter(columnar.np_array(late)))
                    if parts:
                        convert_rows(pa.concat_tables(parts).combine_chunks(), None, pool,
                                     writer)
                    keep = []
                    if held is not None and not held_complete.all():
                        keep.append((held.filter(columnar.np_array(~held_complete)),
                                     held_done[~held_complete]))
                    if not complete.all():
                        keep.append((rows.filter(columnar.np_array(~complete)), done[~complete]))
                    held = (pa.concat_tables([k[0] for k in keep]).combine_chunks() if keep
                            else None)
                    held_done = (np.concatenate([k[1] for k in keep]) if keep
                                 else np.zeros(0, np.int64))
                    done_batches += 1
                    if done_batches % _RELEASE_EVERY == 0:
                        _release_memory()
                    if progress:
                        progress(min(done_batches, plan.batches - 1), plan.batches)
                if held is not None and held.num_rows:  # units cut short by an unreadable file
                    convert_rows(held, None, pool, writer)
                flush(pool, writer)
            finally:
                try:
                    while writes:  # never close the writer under a write in flight
                        writes.pop(0).result()
                finally:
                    writer.close()
            f.flush()
            os.fsync(f.fileno())
        if progress:
            progress(plan.batches, plan.batches)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return stats


_OTLP_JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def _otlp_json_files(source: Any) -> list[Path]:
    """The OTLP/JSON files among the sources (files named *.json[l][.gz])."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return [Path(s) for s in sources
            if Path(s).is_file() and str(s).endswith(_OTLP_JSON_SUFFIXES)]


def _columns_for(cfg: ConvertConfig) -> list[str]:
    """The span columns the converter reads: the JSON blobs only when retokenizing. The span
    name is required of a file (the contract) but never read: the operation column says what
    a span is (reading the names took 0.09 CPU s per million spans)."""
    extra = ["attributes"] if cfg.retokenize else []
    return [c for c in SPAN_SCHEMA.names if c != "name"
            and c in (*REQUIRED_SPAN_COLUMNS, *_OPTIONAL_COLUMNS, *extra)]


def _conform(table: pa.Table, columns: list[str]) -> pa.Table:
    """Add the columns a file lacks (older writers) as nulls, in schema order."""
    for name in columns:
        if name not in table.column_names:
            f = SPAN_SCHEMA.field(name)
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(columns)

