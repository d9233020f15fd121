"""The converter's stages: a table of span rows -> a table of transitions, column by column.

``convert_rows`` gathers the rows' rewards, then runs them in order; each narrows or extends
what the last produced:

1. ``select_calls``: LLM rows, deduplicated by (trace id, span id); calls without token ids or
   with an empty completion are skipped, logprobs of the wrong length dropped, clock skew noted;
2. ``assign_turns`` (``turns.py``);
3. ``join_rewards``: each call's episode rewards; episodes without one dropped or filled;
4. ``order_calls``: calls grouped by (episode, agent, turn, candidate); groups of one call
   first, in order of their row, then the calls of multi-call groups, each group sorted by
   (start, span id);
5. ``split_turns``: whether each call extends the context of the previous call of its group
   (previous prompt + completion is a prefix of its prompt): a byte comparison of slices of the
   flat token id buffers. A call that does not starts a transition of its own (counted);
6. ``token_lists``: the transitions' id, mask and logprob lists, gathered from the flat buffers
   (a merged turn: observation with mask 0, completion with mask 1);
7. ``assign_credit``: rewards, group ids and advantages (``agl_bridge.trainer.rewards``);
8. ``assemble``: the transition table.

Token ids never become Python objects; the only Python loops run per episode (rewards, turn
inference where spans carry no turn) or per group (advantages).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.schema import TRANSITION_SCHEMA, values_list
from agl_bridge.trainer.arrow import (
    Lists,
    arr,
    codes,
    combine,
    interleave,
    list_array,
    lit,
    note,
    np_array,
    second_mask,
    segments,
    take_lists,
    to_numpy,
)
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.columns import (
    RETOKENIZED,
    conform,
    episode_attributes,
    episode_keys,
)
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.evaluations import is_evaluation
from agl_bridge.trainer.conversion.reward_spans import (
    REWARD_COLUMNS,
    EpisodeRewards,
    add_evaluations,
    add_recipe,
    read_rewards,
)
from agl_bridge.trainer.conversion.turns import assign_turns
from agl_bridge.trainer.rewards.advantages import group_advantages
from agl_bridge.trainer.rewards.baselines import (
    BATCH,
    GROUP,
    batch_group_ids,
    choose,
    key_attribute,
    key_group_ids,
    task_group_ids,
)
from agl_bridge.trainer.rewards.credit import discounted, last_turns, transition_rewards
from agl_bridge.trainer.rewards.evaluations import EvaluationReward
from agl_bridge.trainer.rewards.recipes import EPISODE_KEY

# the per-call columns carried through the stages (the lists stay in the span table)
_SMALL = ("trace_id", "span_id", "start_time_unix_nano", "end_time_unix_nano", "task_id",
          "agent_name", "turn_index", "candidate_index", "coordination_round", "request_model",
          "policy_version")


@dataclass
class SpanLists:
    """The span table's id and logprob lists, read where they lie."""

    prompt: Lists
    completion: Lists
    logprobs: Lists

    @classmethod
    def of(cls, spans: pa.Table) -> SpanLists:
        return cls(Lists(spans["prompt_token_ids"]), Lists(spans["completion_token_ids"]),
                   Lists(spans["completion_logprobs"]))


@dataclass
class Calls:
    """The LLM calls still being converted, one row each; stages narrow them together."""

    table: pa.Table  # the ``_SMALL`` columns
    episode: pa.Array  # episode key
    rows: np.ndarray  # the call's row in the span table
    logprobs_ok: np.ndarray  # its logprobs are usable
    retokenized: np.ndarray  # its ids were rebuilt from messages

    def __len__(self) -> int:
        return len(self.rows)

    def narrow(self, keep: np.ndarray) -> None:
        """Keep the calls at the positions ``keep`` (int indices)."""
        t = np_array(keep)
        self.table, self.episode = self.table.take(t), arr(self.episode.take(t))
        self.rows, self.logprobs_ok = self.rows[keep], self.logprobs_ok[keep]
        self.retokenized = self.retokenized[keep]


@dataclass
class Order:
    """Calls in output order: groups of one call first, then multi-call groups' calls."""

    order: np.ndarray  # positions into Calls, in output order
    singles: int  # how many calls come first as groups of one
    rows: np.ndarray  # the calls' rows in the span table, in output order
    groups: np.ndarray  # the calls' group codes, in output order


@dataclass
class Turns:
    """Transitions as runs of calls in output order (a merged turn is a run of several)."""

    new: np.ndarray  # per call in output order: it starts a transition
    first: np.ndarray  # per transition: position of its first call in output order

    @property
    def count(self) -> int:
        return len(self.first)


def convert_rows(spans: pa.Table, cfg: ConvertConfig, source: str = "",
                 select: np.ndarray | None = None,
                 evaluations: Mapping[str, list[EvaluationReward]] | None = None
                 ) -> tuple[pa.Table, ConversionStats]:
    """Transitions and statistics of the span rows ``select`` (a numpy boolean mask; all
    without) of ``spans`` (SPAN_SCHEMA columns, the required ones at least). ``source`` names
    where the rows came from, for messages; ``evaluations``: rewards that arrived after the
    fact, by episode key (``conversion/evaluations.py``)."""
    spans = conform(spans, cfg.extra_columns).combine_chunks()
    episodes = episode_keys(spans)
    is_reward = pc.is_valid(spans["reward_value"])
    rows = pc.invert(is_evaluation(spans))  # evaluation records are not an episode's spans
    stats = ConversionStats(spans=spans.num_rows if select is None else int(select.sum()))
    if select is not None:
        rows = pc.and_(rows, np_array(select))
        is_reward = pc.and_(is_reward, np_array(select))
    present = pc.unique(episodes.filter(rows))
    # an episode has an LLM call or a reward: a framework's runtime spans in traces of their own
    # (autogen-core's messaging) are not episodes of their own
    is_chat = pc.fill_null(pc.equal(spans["operation_name"], lit(sc.OP_CHAT)), lit(False))
    stats.episodes = len(pc.unique(episodes.filter(pc.and_(rows, pc.or_(is_chat, is_reward)))))
    rewards = read_rewards(spans.select(REWARD_COLUMNS).filter(is_reward), stats, source)
    if evaluations:
        add_evaluations(rewards, present.to_pylist(), evaluations, stats)
    if cfg.recipe is not None and cfg.recipe.terms:  # the terms' columns only: no id lists
        unit = spans.select(list(cfg.recipe.columns)).filter(rows)
        add_recipe(rewards, cfg.recipe.apply(unit.append_column(
            EPISODE_KEY, arr(episodes.filter(rows))), evaluations), stats)
    # for key baselines: attribute -> episode key -> value
    keys = episode_attributes(spans.filter(rows), arr(episodes.filter(rows)),
                              cfg.key_attributes) if cfg.key_attributes else {}
    lists = SpanLists.of(spans)
    calls = select_calls(spans, episodes, lists, stats, select)
    if calls is None:
        return TRANSITION_SCHEMA.empty_table(), stats
    turn = assign_turns(calls.episode, calls.table, stats.notes)
    joined = join_rewards(calls, turn, rewards, cfg, stats)
    if joined is None:
        return TRANSITION_SCHEMA.empty_table(), stats
    turn, ep_codes, ep_rewards = joined
    order = order_calls(calls, turn, ep_codes, cfg)
    turns = split_turns(order, lists, stats)
    tokens = token_lists(calls, order, turns, lists)
    first = order.order[turns.first]  # each transition's first call, in Calls positions
    credit = assign_credit(calls, first, turn, ep_codes, ep_rewards, cfg, stats, keys)
    return assemble(calls, first, turn, tokens, credit), stats


# -- 1. the calls -----------------------------------------------------------------------------
def select_calls(spans: pa.Table, episodes: pa.Array, lists: SpanLists, stats: ConversionStats,
                 select: np.ndarray | None) -> Calls | None:
    """LLM rows, deduplicated, without those that cannot become a transition."""
    holey = lists.prompt.holey | lists.completion.holey | lists.logprobs.holey
    if holey.any():
        per_list = (lists.prompt.holey.astype(np.int64) + lists.completion.holey
                    + lists.logprobs.holey)
        note(stats.notes, reasons.HOLEY_LIST,
             per_list[select].sum() if select is not None else per_list.sum())
    is_llm = to_numpy(arr(pc.fill_null(pc.equal(spans["operation_name"], lit(sc.OP_CHAT)),
                                       lit(False))))
    if select is not None:
        is_llm = is_llm & select
    li = np.flatnonzero(is_llm)
    n = len(li)
    stats.llm_spans = n
    if n == 0:
        return None
    retok = (to_numpy(arr(spans[RETOKENIZED]))[li] if RETOKENIZED in spans.column_names
             else np.zeros(n, bool))
    calls = Calls(spans.select(list(_SMALL)).take(np_array(li)),
                  arr(arr(episodes).take(np_array(li))), li, np.ones(n, bool), retok)
    P, C, L = lists.prompt, lists.completion, lists.logprobs
    ident = arr(pc.binary_join_element_wise(calls.table["trace_id"], calls.table["span_id"],
                                            lit("\x00")))
    _, first_idx = np.unique(codes(ident), return_index=True)
    first = np.zeros(n, bool)
    first[first_idx] = True
    note(stats.notes, reasons.DUPLICATE_SPAN, n - len(first_idx))
    clen = np.where(C.valid[li], C.lengths[li], -1)
    no_ids = first & (~P.valid[li] | (clen < 0))
    empty = first & ~no_ids & (clen == 0)
    note(stats.skipped, reasons.NO_TOKEN_IDS, no_ids.sum())
    note(stats.skipped, reasons.EMPTY_COMPLETION, empty.sum())
    keep = first & ~no_ids & ~empty
    lp_valid = L.valid[li]
    bad_lp = keep & lp_valid & (L.lengths[li] != clen)
    note(stats.notes, reasons.BAD_LOGPROBS, bad_lp.sum())
    skew = to_numpy(arr(pc.fill_null(pc.less(calls.table["end_time_unix_nano"],
                                             calls.table["start_time_unix_nano"]), lit(False))))
    note(stats.notes, reasons.CLOCK_SKEW, (keep & skew).sum())
    calls.logprobs_ok = lp_valid & ~bad_lp
    if not keep.all():
        calls.narrow(np.flatnonzero(keep))
    return calls if len(calls) else None


# -- 3. rewards -------------------------------------------------------------------------------
def join_rewards(calls: Calls, turn: pa.Array, rewards: dict[str, EpisodeRewards],
                 cfg: ConvertConfig, stats: ConversionStats
                 ) -> tuple[pa.Array, np.ndarray, list[EpisodeRewards]] | None:
    """(turns, episode code per call, rewards per episode code) for the calls whose episode has
    a reward; the others are dropped (or given ``cfg.missing_reward``)."""
    enc = pc.dictionary_encode(calls.episode, null_encoding="encode")
    ep_codes = to_numpy(enc.indices).astype(np.int64)
    ep_rewards: list[EpisodeRewards | None] = []
    for e in enc.dictionary.to_pylist():
        r = rewards.get(e)
        if r is None or r.empty:
            if cfg.missing_reward == "drop":
                r = None
            else:
                r = rewards.setdefault(e, EpisodeRewards())
                r.fill(float(cfg.missing_reward))
        ep_rewards.append(r)
    has_reward = np.array([r is not None for r in ep_rewards], bool)[ep_codes]
    if not has_reward.all():
        note(stats.skipped, reasons.NO_REWARD, (~has_reward).sum())
        keep = np.flatnonzero(has_reward)
        ep_codes = ep_codes[keep]
        turn = arr(turn.take(np_array(keep)))
        calls.narrow(keep)
        if not len(calls):
            return None
    # every code still in use has its rewards; the others are never read
    return turn, ep_codes, [r if r is not None else EpisodeRewards() for r in ep_rewards]


# -- 4. order -----------------------------------------------------------------------------------
def order_calls(calls: Calls, turn: pa.Array, ep_codes: np.ndarray, cfg: ConvertConfig
                ) -> Order:
    n = len(calls)
    group = combine(ep_codes, codes(calls.table["agent_name"]), codes(turn),
                    codes(calls.table["candidate_index"]))
    n_groups = int(group.max()) + 1
    row = np.arange(n, dtype=np.int64)
    group_first = np.full(n_groups, n, np.int64)
    np.minimum.at(group_first, group, row)
    gfirst = group_first[group]
    if not cfg.merge_turn_calls:
        order = np.lexsort((row, gfirst))
        return Order(order, n, calls.rows[order], group[order])
    multi = np.bincount(group, minlength=n_groups)[group] > 1
    order = np.lexsort((row, gfirst, multi))  # singles first, by their row
    singles = int((~multi).sum())
    if singles < n:  # inside a multi-call group: (start or 0, span id)
        sub = order[singles:]
        start0 = pc.fill_null(calls.table["start_time_unix_nano"], lit(0))
        keys = pa.table({"g": np_array(gfirst[sub]), "s": arr(start0).take(np_array(sub)),
                         "id": arr(calls.table["span_id"]).take(np_array(sub)),
                         "r": np_array(sub)})
        idx = pc.sort_indices(keys, sort_keys=[("g", "ascending"), ("s", "ascending"),
                                                ("id", "ascending"), ("r", "ascending")])
        order[singles:] = sub[to_numpy(idx)]
    return Order(order, singles, calls.rows[order], group[order])


# -- 5. turns: which calls merge --------------------------------------------------------------
def split_turns(order: Order, lists: SpanLists, stats: ConversionStats) -> Turns:
    n = len(order.order)
    new = np.ones(n, bool)
    if order.singles < n:
        # multi-call groups are contiguous: a call continues the group of the call before it
        g = order.groups
        new[order.singles + 1:] = g[order.singles + 1:] != g[order.singles:-1]
        pairs = np.flatnonzero(~new)  # call j continues the group of call j - 1
        if len(pairs):
            ok = _extends(lists, order.rows[pairs], order.rows[pairs - 1])
            new[pairs[~ok]] = True
            note(stats.notes, reasons.NOT_EXTENDING, (~ok).sum())
    return Turns(new, np.flatnonzero(new))


def _extends(lists: SpanLists, cur: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """Per pair: is prompt[prev] + completion[prev] a prefix of prompt[cur]? Both sides are
    gathered into one flat array each and compared at once."""
    P, C = lists.prompt, lists.completion
    ok = np.zeros(len(cur), bool)
    pn, cn = P.lengths[prev], C.lengths[prev]
    fits = np.flatnonzero(P.lengths[cur] >= pn + cn)
    if not len(fits):
        return ok
    cur, prev, pn, cn = cur[fits], prev[fits], pn[fits], cn[fits]
    ctx = pn + cn
    was = interleave(segments(P.values, P.starts[prev], pn),
                     segments(C.values, C.starts[prev], cn, P.values.dtype),
                     second_mask(pn, cn).view(bool), P.values.dtype)
    differ = np.flatnonzero(was != segments(P.values, P.starts[cur], ctx))
    good = np.ones(len(fits), bool)
    if len(differ):
        good[np.searchsorted(np.cumsum(ctx), differ, side="right")] = False
    ok[fits] = good
    return ok


# -- 6. token lists ---------------------------------------------------------------------------
@dataclass
class TokenLists:
    prompt: pa.ChunkedArray
    completion: pa.ChunkedArray
    mask: pa.ChunkedArray
    logprobs: pa.ChunkedArray
    merged_calls: np.ndarray  # int32 per transition
    retokenized: np.ndarray  # bool per transition: any of its calls was rebuilt


def token_lists(calls: Calls, order: Order, turns: Turns, lists: SpanLists) -> TokenLists:
    """Each transition's lists. Groups of one call keep their lists as they are; a merged
    turn's completion is, per call, the observation its prompt added (mask 0) and its
    completion (mask 1). A transition whose call lacks usable logprobs has none."""
    P, C, L = lists.prompt, lists.completion, lists.logprobs
    n, n_tr = len(order.order), turns.count
    tr_of_call = np.cumsum(turns.new) - 1
    lp_ok = calls.logprobs_ok[order.order]
    tr_lp_ok = np.bincount(tr_of_call, weights=~lp_ok, minlength=n_tr) == 0
    retok = np.bincount(tr_of_call, weights=calls.retokenized[order.order], minlength=n_tr) > 0
    prompt = take_lists(P, order.rows[turns.first])
    # transitions of single calls (groups of one come first) take their lists as they are
    n_a = int(np.searchsorted(turns.first, order.singles)) if order.singles < n else n_tr
    rows_a = order.rows[:order.singles]
    comps = [take_lists(C, rows_a)]
    masks = [list_array(C.lengths[rows_a], np_array(
        np.ones(int(C.lengths[rows_a].sum()), np.int8)))]
    lps = [take_lists(L, rows_a, valid=tr_lp_ok[:n_a], dtype=np.dtype(np.float32))]
    if order.singles < n:
        comp, mask, lp = _merged_lists(order, turns, lists, tr_of_call, n_a, lp_ok,
                                       tr_lp_ok[n_a:])
        comps.append(comp)
        masks.append(mask)
        lps.append(lp)
    merged_calls = np.diff(np.append(turns.first, n)).astype(np.int32)

    def chunks(parts: list[pa.ChunkedArray], typ: pa.DataType) -> pa.ChunkedArray:
        return pa.chunked_array([c for p in parts for c in p.chunks], typ)

    return TokenLists(prompt, chunks(comps, values_list(pa.int32())),
                      chunks(masks, values_list(pa.int8())),
                      chunks(lps, values_list(pa.float32())), merged_calls, retok)


def _merged_lists(order: Order, turns: Turns, lists: SpanLists, tr_of_call: np.ndarray,
                  n_a: int, lp_ok: np.ndarray, tr_lp_ok: np.ndarray
                  ) -> tuple[pa.ChunkedArray, pa.ChunkedArray, pa.ChunkedArray]:
    """Completion, mask and logprob lists of the transitions of multi-call groups."""
    P, C, L = lists.prompt, lists.completion, lists.logprobs
    n = len(order.order)
    calls = np.arange(order.singles, n)
    rows = order.rows[calls]
    cont = ~turns.new[calls]
    prev_rows = order.rows[calls - 1]
    ctx = np.where(cont, P.lengths[prev_rows] + C.lengths[prev_rows], 0)
    obs_len = np.where(cont, P.lengths[rows] - ctx, 0)
    comp_len = C.lengths[rows]
    mask_values = second_mask(obs_len, comp_len)  # the completion_mask values
    is_comp = mask_values.view(bool)
    values = interleave(segments(P.values, P.starts[rows] + ctx, obs_len),
                        segments(C.values, C.starts[rows], comp_len), is_comp, np.dtype(np.int32))
    tr = tr_of_call[calls] - n_a
    n_b = turns.count - n_a
    lengths = np.bincount(tr, weights=obs_len + comp_len, minlength=n_b).astype(np.int64)
    comp = list_array(lengths, np_array(values))
    mask = list_array(lengths, np_array(mask_values))
    if not tr_lp_ok.any():
        return comp, mask, pa.chunked_array([pa.nulls(n_b, values_list(pa.float32()))])
    has = lp_ok[calls] & tr_lp_ok[tr]
    comp_lp = np.zeros(int(comp_len.sum()), np.float32)  # 0.0 where a call sent none
    comp_lp[np.repeat(has, comp_len)] = segments(L.values, L.starts[rows][has], comp_len[has],
                                                 np.dtype(np.float32))
    lp_values = np.zeros(len(mask_values), np.float32)  # 0.0 at observations
    lp_values[is_comp] = comp_lp
    return comp, mask, list_array(lengths, np_array(lp_values), mask=~tr_lp_ok)


# -- 7. credit ----------------------------------------------------------------------------------
@dataclass
class Credit:
    reward: np.ndarray
    group_id: pa.Array
    advantage: np.ndarray
    keep: np.ndarray | None  # transitions kept (None: all): a reward that overflowed is not


def _groups(task: pa.Array, episode: pa.Array, agent: pa.Array, turn: pa.Array,
            keys: Mapping[str, Mapping[str, str]], cfg: ConvertConfig, stats: ConversionStats
            ) -> tuple[pa.Array, np.ndarray]:
    """(group id, whether its statistics span the whole output) per transition: the first of
    the configured baselines that applies (``rewards.baselines``); counted per baseline."""
    task_ids = arr(task_group_ids(task, episode, agent, turn, cfg.algorithm,
                                  per_agent=cfg.per_agent_advantages))
    n = len(task_ids)
    if cfg.baselines == (GROUP,):  # the default: no choice to make
        stats.baselines[GROUP] += n
        return task_ids, np.zeros(n, bool)
    candidates, applies = [], []
    for b in cfg.baselines:
        if b == GROUP:
            candidates.append(task_ids)
            applies.append(to_numpy(pc.is_valid(task)) if task.null_count else np.ones(n, bool))
        elif b == BATCH:
            candidates.append(arr(batch_group_ids(agent, turn,
                                                  per_agent=cfg.per_agent_advantages)))
            applies.append(np.ones(n, bool))
        else:
            attribute = key_attribute(b)
            by_episode = keys.get(attribute, {})
            values = pa.array([by_episode.get(e) for e in episode.to_pylist()], pa.string())
            candidates.append(arr(key_group_ids(attribute, values, agent, turn, cfg.algorithm,
                                                per_agent=cfg.per_agent_advantages)))
            applies.append(to_numpy(pc.is_valid(values)) if values.null_count
                           else np.ones(n, bool))
    task_codes = codes(task_ids)
    sizes = np.bincount(task_codes)[task_codes]
    group_id, chosen = choose(cfg.baselines, candidates, applies, sizes, task_ids)
    for i, b in enumerate(cfg.baselines):
        note(stats.baselines, b, np.count_nonzero(chosen == i))
    note(stats.baselines, "none", np.count_nonzero(chosen < 0))
    is_global = np.isin(chosen, [i for i, b in enumerate(cfg.baselines) if b != GROUP])
    return arr(group_id), is_global


def assign_credit(calls: Calls, first: np.ndarray, turn: pa.Array, ep_codes: np.ndarray,
                  ep_rewards: list[EpisodeRewards], cfg: ConvertConfig,
                  stats: ConversionStats, keys: Mapping[str, Mapping[str, str]]) -> Credit:
    """Per transition (``first``: its first call): reward, group id, advantage; the group,
    transition and reward statistics."""
    take = np_array(first)
    t_ep = calls.episode.take(take)
    t_task = arr(calls.table["task_id"]).take(take)
    agent = arr(calls.table["agent_name"])
    t_agent = agent.take(take)
    t_turn = turn.take(take)
    t_ep_codes = ep_codes[first]
    n_tr = len(first)
    t_turn_np = to_numpy(pc.fill_null(t_turn, lit(0, pa.int32()))).astype(np.int64)
    t_turn_valid = (to_numpy(pc.is_valid(t_turn)) if t_turn.null_count
                    else np.ones(n_tr, bool))
    team = np.array([r.team for r in ep_rewards], np.float64)[t_ep_codes]
    last = None
    if cfg.algorithm == "ppo":  # rewards at the end of their turn; GAE discounts
        last = last_turns(t_turn_np, t_turn_valid, combine(t_ep_codes, codes(agent)[first]))
        team = np.where(last, team, 0.0)
    elif cfg.gamma != 1.0:
        agent_episode = combine(t_ep_codes, codes(agent)[first])
        team = discounted(team, t_turn_np, t_turn_valid, agent_episode, cfg.gamma)
    local = np.zeros(n_tr, np.float64)
    if cfg.algorithm != "lightning_rl":
        with_local = [i for i, r in enumerate(ep_rewards) if r.has_local]
        if with_local:
            sel = np.flatnonzero(np.isin(t_ep_codes, with_local))
            agents_l = t_agent.take(np_array(sel)).to_pylist()
            turns_l = t_turn.take(np_array(sel)).to_pylist()
            cands_l = arr(calls.table["candidate_index"]).take(take).take(
                np_array(sel)).to_pylist()
            for k, i in enumerate(sel.tolist()):
                local[i] = ep_rewards[t_ep_codes[i]].local(
                    agents_l[k], turns_l[k], cands_l[k],
                    with_agent=last is None or bool(last[i]), turn_scores=cfg.use_turn_scores)
    with np.errstate(over="ignore", invalid="ignore"):
        reward = transition_rewards(team, local, algorithm=cfg.algorithm, alpha=cfg.alpha)
    keep = None
    finite = np.isfinite(reward)
    if not finite.all():  # finite rewards whose sum left the float range
        note(stats.skipped, reasons.REWARD_OVERFLOW, (~finite).sum())
        keep = np.flatnonzero(finite)
        t_ep, t_task, t_agent, t_turn = (a.take(np_array(keep)) for a in
                                         (t_ep, t_task, t_agent, t_turn))
        reward, t_ep_codes = reward[keep], t_ep_codes[keep]
    group_id, is_global = _groups(t_task, t_ep, t_agent, t_turn, keys, cfg, stats)
    local = ~is_global  # batch and key groups span the output: the engine's last pass
    advantage = np.zeros(len(reward), np.float64)
    sel = np.flatnonzero(local)
    if len(sel) == len(reward):
        advantage, n_groups, zero_var = group_advantages(
            reward, codes(group_id), t_ep_codes, unit=cfg.advantage_unit,
            scale=cfg.scale_advantages)
    else:
        advantage[sel], n_groups, zero_var = group_advantages(
            reward[sel], codes(group_id.take(np_array(sel))), t_ep_codes[sel],
            unit=cfg.advantage_unit, scale=cfg.scale_advantages)
    note(stats.notes, reasons.NO_TASK, t_task.null_count)
    stats.transitions = len(reward)
    stats.rewards = reward.tolist()
    stats.groups, stats.zero_variance_groups = n_groups, zero_var
    at = combine(codes(t_agent), codes(t_turn))
    _, at_first, at_count = np.unique(at, return_index=True, return_counts=True)
    pick = np_array(at_first)
    stats.per_agent_turn.update(dict(zip(zip(t_agent.take(pick).to_pylist(),
                                             t_turn.take(pick).to_pylist()),
                                         at_count.tolist())))
    return Credit(reward, group_id, advantage, keep)


# -- 8. the table -------------------------------------------------------------------------------
def assemble(calls: Calls, first: np.ndarray, turn: pa.Array, tokens: TokenLists,
             credit: Credit) -> pa.Table:
    take = np_array(first)

    def meta(name: str) -> pa.Array:
        return arr(calls.table[name]).take(take)

    data: dict[str, pa.Array | pa.ChunkedArray] = {
        "episode_id": calls.episode.take(take), "task_id": meta("task_id"),
        "agent_name": meta("agent_name"), "turn_index": turn.take(take),
        "candidate_index": meta("candidate_index"), "trace_id": meta("trace_id"),
        "span_id": meta("span_id"), "merged_calls": np_array(tokens.merged_calls),
        "request_model": meta("request_model"), "policy_version": meta("policy_version"),
        "prompt_ids": tokens.prompt, "completion_ids": tokens.completion,
        "completion_mask": tokens.mask, "behaviour_logprobs": tokens.logprobs,
        "retokenized": np_array(tokens.retokenized),
        "start_time_unix_nano": meta("start_time_unix_nano"),
    }
    if credit.keep is not None:
        kept = np_array(credit.keep)
        data = {k: v.take(kept) for k, v in data.items()}
    data.update(reward=np_array(credit.reward), group_id=credit.group_id,
                advantage=np_array(credit.advantage))
    columns = []
    for f in TRANSITION_SCHEMA:
        a = data[f.name]
        if not isinstance(a, pa.ChunkedArray):
            a = pa.chunked_array([a])
        columns.append(a if a.type == f.type else a.cast(f.type))
    return pa.Table.from_arrays(columns, schema=TRANSITION_SCHEMA)
