"""The converter's reference implementation: a Python loop per call, kept only as a test oracle.

``agl_bridge.trainer.conversion`` is the converter. This is the plain loop it replaced, written
for clarity rather than speed; ``test_convert_columnar.py`` checks that the converter gives
exactly its transitions, in the same row order, and the same statistics on tricky tables.
It does not retokenize (``conversion.retokenize.fill_ids`` runs before either).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.schema import REQUIRED_SPAN_COLUMNS, SPAN_SCHEMA, TRANSITION_SCHEMA
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.reward_spans import EpisodeRewards, read_rewards
from agl_bridge.trainer.rewards.advantages import mean_of
from agl_bridge.trainer.rewards.credit import AdvantageUnit, Algorithm

_OPTIONAL_COLUMNS = (
    "task_id", "agent_name", "turn_index", "candidate_index", "coordination_round",
    "request_model", "policy_version", "completion_logprobs", "reward_scope",
    "end_time_unix_nano",
)
_KEY_COLUMNS = ("trace_id", "span_id", "episode_id", "task_id", "agent_name", "turn_index",
                "candidate_index", "coordination_round", "start_time_unix_nano",
                "end_time_unix_nano", "request_model", "policy_version")


@dataclass(frozen=True)
class Key:
    """Where a transition sits: what rewards and groups are matched on."""

    episode: str
    task: str | None
    agent: str | None
    turn: int | None
    candidate: int | None = None



def transition_reward(key: Key, rewards: EpisodeRewards, *, algorithm: Algorithm,
                      alpha: float = 1.0, gamma: float = 1.0, last_turn: int | None = None
                      ) -> float:
    discount = 1.0
    if gamma != 1.0 and key.turn is not None and last_turn is not None:
        discount = gamma ** (last_turn - key.turn)
    team = rewards.team * discount
    if algorithm == "lightning_rl":
        return team
    local = rewards.agent.get(key.agent, 0.0) + rewards.turn.get((key.agent, key.turn, None), 0.0)
    if key.candidate is not None:  # a tree-sampled candidate's own turn rewards
        local += rewards.turn.get((key.agent, key.turn, key.candidate), 0.0)
    return alpha * team + local


def group_key(key: Key, algorithm: Algorithm) -> str:
    """AT-GRPO: (task, agent, turn); LightningRL: task. Without a task id the episode stands in,
    which makes a group of one: no signal, counted, never merged into another task's group."""
    task = f"task:{key.task}" if key.task is not None else f"episode:{key.episode}"
    if algorithm == "lightning_rl":
        return task
    return f"{task}|agent:{key.agent}|turn:{key.turn}"



def advantages(rewards: Sequence[float], groups: Sequence[str], episodes: Sequence[str], *,
               unit: AdvantageUnit = "transition", scale: bool = True, eps: float = 1e-4
               ) -> tuple[list[float], int]:
    """Group-relative advantages, and the number of groups with zero variance.

    ``unit="transition"``: every transition counts once in its group's mean and std.
    ``unit="rollout"``: each episode counts once (its transitions in the group share one reward
    value in the statistics), so an episode with many calls does not outweigh the others.
    ``scale``: divide by the sample std (GRPO); off: mean-centred only (Dr. GRPO).
    A group of one, or with equal rewards, gives 0.
    """
    if not (len(rewards) == len(groups) == len(episodes)):
        raise ValueError(f"{len(rewards)} rewards, {len(groups)} groups, {len(episodes)} episodes")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    zero_variance = 0
    for idx in members.values():
        if unit == "rollout":
            per_episode: dict[str, list[float]] = defaultdict(list)
            for i in idx:
                per_episode[episodes[i]].append(rewards[i])
            values = [mean_of(v) for v in per_episode.values()]
        else:
            values = [rewards[i] for i in idx]
        if len(values) < 2:
            continue
        if min(values) == max(values):  # exactly: fsum([0.1] * 3) / 3 is not 0.1
            zero_variance += 1
            continue
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if std == 0.0:
            zero_variance += 1
            continue
        for i in idx:
            out[i] = (rewards[i] - mean) / (std + eps) if scale else rewards[i] - mean
    return out, zero_variance


def _episode_keys(table: pa.Table) -> list[str]:
    episodes = table["episode_id"].to_pylist()
    traces = table["trace_id"].to_pylist()
    # Without the scoping API, one trace is one episode: the best guess that never mixes two.
    return [e if e is not None else f"trace:{t}" for e, t in zip(episodes, traces)]


def _column(table: pa.Table, name: str) -> list[Any]:
    return table[name].to_pylist() if name in table.column_names else [None] * table.num_rows


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
                stats.notes[reasons.TURN_INFERRED] += 1



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
            context = prompt + completion
            continue
        if cur is not None:
            stats.notes[reasons.NOT_EXTENDING] += 1
            out.append(cur)
        cur = {**r, "prompt": list(prompt), "completion": list(completion),
               "mask": [1] * len(completion),
               "logprobs": list(logprobs) if logprobs is not None else None, "merged": 1,
               "retokenized": False}
        context = list(prompt) + list(completion)
    if cur is not None:
        out.append(cur)
    return out



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
            holey[parents.to_numpy()] = True
            stats.notes[reasons.HOLEY_LIST] += int(holey.sum())
            col = pc.if_else(pa.array(holey), pa.nulls(len(col), col.type), col)
        spans = spans.set_column(spans.column_names.index(name), name, col)
    return spans


def reference_spans_to_transitions(spans: pa.Table, config: ConvertConfig | None = None, *,
                                   missing_reward: Literal["drop"] | float | None = None,
                                   source: str = "") -> tuple[pa.Table, ConversionStats]:
    """The reference implementation: a Python loop per call, kept as the fast path's oracle
    (``tests/trainer/conversion/test_convert_columnar.py``)."""
    cfg = config or ConvertConfig()
    if missing_reward is not None:
        cfg = ConvertConfig(**{**cfg.__dict__, "missing_reward": missing_reward})
    stats = ConversionStats(spans=spans.num_rows)
    needed = [c for c in (*REQUIRED_SPAN_COLUMNS, *_OPTIONAL_COLUMNS) if c in spans.column_names]
    spans = _without_holey_lists(spans.select(needed), stats)  # select: zero-copy
    counted = spans.filter(pc.or_(pc.fill_null(pc.equal(spans["operation_name"], sc.OP_CHAT),
                                               False), pc.is_valid(spans["reward_value"])))
    stats.episodes = len(pc.unique(pc.coalesce(
        counted["episode_id"], pc.binary_join_element_wise("trace:", counted["trace_id"], ""))))
    # reward matching (one loop over the reward rows) is shared with the converter: the oracle
    # checks what is done per LLM call
    rewards = read_rewards(spans.filter(pc.is_valid(spans["reward_value"])), stats, source)

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
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for i in range(llm.num_rows):
        ident = (cols["trace_id"][i], cols["span_id"][i])
        if ident in seen:
            stats.notes[reasons.DUPLICATE_SPAN] += 1
            continue
        seen.add(ident)
        if not has_prompt[i] or completion_len[i] < 0:
            stats.skipped[reasons.NO_TOKEN_IDS] += 1
            continue
        if completion_len[i] == 0:
            stats.skipped[reasons.EMPTY_COMPLETION] += 1
            continue
        if logprobs_len[i] is not None and logprobs_len[i] != completion_len[i]:
            stats.notes[reasons.BAD_LOGPROBS] += 1
            bad_logprobs.add(i)
        start, end = cols["start_time_unix_nano"][i], cols["end_time_unix_nano"][i]
        if start is not None and end is not None and end < start:
            stats.notes[reasons.CLOCK_SKEW] += 1
        turn = cols["turn_index"][i]
        if turn is None and cols["coordination_round"][i] is not None:
            turn = cols["coordination_round"][i]
            stats.notes[reasons.TURN_FROM_ROUND] += 1
        row = {"row": i, "episode": episodes[i], "task": cols["task_id"][i],
                     "agent": cols["agent_name"][i], "turn": turn,
                     "candidate": cols["candidate_index"][i], "start": start,
                     "trace_id": ident[0], "span_id": ident[1],
                     "model": cols["request_model"][i], "policy": cols["policy_version"][i]}
        rows.append(row)
    _infer_turns(rows, stats)

    # reward first: an episode without one is dropped (or filled) before any list is touched
    kept = []
    for r in rows:
        ep = rewards.get(r["episode"])
        if ep is None or ep.empty:
            if cfg.missing_reward == "drop":
                stats.skipped[reasons.NO_REWARD] += 1
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
            merged += _merge(g, lists, stats)

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
        stats.notes[reasons.NO_TASK] += sum(
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
        "retokenized": [False] * len(everything),
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


