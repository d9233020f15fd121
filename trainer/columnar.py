"""The converter's fast path: span rows -> transitions with Arrow and numpy, no Python per call.

Same semantics as the reference (``transitions.reference_spans_to_transitions``, which stays the
oracle; ``tests/test_convert_columnar.py`` compares the two on tricky tables), computed column by
column:

* LLM rows are deduplicated by (trace id, span id) with a dictionary encoding; skips and notes
  are counted with masks.
* Turn inference (spans without a turn attribute) runs in Python, only over the episodes that
  need it.
* Calls are grouped by (episode, agent, turn, candidate) through integer codes and sorted by
  (start, span id) inside a group. Whether a call extends the context of the previous call of its
  group (previous prompt + completion is a prefix of its prompt) is a byte comparison of slices
  of the flat token id buffers, pair by pair (only calls in multi-call groups have a pair).
* Merged transitions are built by gathering segments (observation with mask 0, completion with
  mask 1) out of the flat id and logprob buffers, so token ids never become Python objects.
* Rewards, group ids and advantages are arrays; the group statistics use ``math.fsum`` per group
  exactly as ``credit.advantages`` does, so every value is bit-identical to the reference.

Row order is the reference's: single-call transitions in order of their group's first call, then
the transitions of multi-call groups.

Arrow arrays are built from numpy buffers and back (``np_array``, ``to_numpy``, ``lit``), never
through ``pa.array``, ``pa.scalar`` or ``Array.to_numpy``: those import pandas when it is
installed (about 0.4 s and 40 MiB), as ``Table.group_by`` imports Acero.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.schema import SPAN_SCHEMA, TRANSITION_SCHEMA, values_list

# notes shared with the reference (transitions.py), which imports this module
TURN_FROM_ROUND = "turn from the coordination round (no turn attribute)"
TURN_INFERRED = "turn inferred (no turn attribute)"

# the span columns this module reads (others are ignored)
COLUMNS = ("trace_id", "span_id", "start_time_unix_nano", "end_time_unix_nano", "episode_id",
           "task_id", "agent_name", "turn_index", "candidate_index", "coordination_round",
           "operation_name",
           "request_model", "policy_version", "prompt_token_ids", "completion_token_ids",
           "completion_logprobs", "reward_value", "reward_scope")


class Unsupported(Exception):
    """Input the fast path does not handle (null ids inside a list): use the reference."""


def conform(spans: pa.Table) -> pa.Table:
    """The columns this module reads, in SPAN_SCHEMA types; absent optional ones as nulls."""
    cols, fields = [], []
    for name in COLUMNS:
        f = SPAN_SCHEMA.field(name)
        if name in spans.column_names:
            col = spans[name]
            if col.type != f.type:
                col = col.cast(f.type)
        else:
            col = pa.nulls(spans.num_rows, f.type)
        cols.append(col)
        fields.append(pa.field(name, f.type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def episode_keys(table: pa.Table) -> pa.Array:
    """episode id, or ``trace:<trace id>`` without one (one trace = one episode)."""
    ep = table["episode_id"]
    if ep.null_count == 0:
        return _arr(ep)
    trace = pc.fill_null(table["trace_id"], lit("None"))  # as the reference's f"trace:{t}"
    key = pc.coalesce(ep, pc.binary_join_element_wise(lit("trace:"), trace, lit("")))
    return _arr(key)


def to_numpy(arr) -> np.ndarray:
    """An Arrow array (chunked too) as numpy: numbers without nulls zero-copy, booleans
    unpacked (null as False), numbers with nulls refused. (``to_numpy(zero_copy_only=False)``
    would import pandas, 0.5 s, when installed.)"""
    arr = _arr(arr)
    if pa.types.is_boolean(arr.type):
        n, off = len(arr), arr.offset
        bits = np.frombuffer(arr.buffers()[1], np.uint8)
        out = np.unpackbits(bits, bitorder="little", count=off + n)[off:].astype(bool)
        if arr.null_count:
            valid = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little",
                                  count=off + n)[off:].astype(bool)
            out &= valid
        return out
    if arr.null_count:
        raise ValueError("to_numpy: nulls in a number array")
    dtype = _NUMPY_TYPES[str(arr.type)]
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(0, dtype)
    return np.frombuffer(buf, dtype)[arr.offset:arr.offset + len(arr)]


_NUMPY_TYPES = {name: np.dtype(name) for name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
_NUMPY_TYPES.update({"float": np.dtype(np.float32), "double": np.dtype(np.float64)})


def lit(value, typ: pa.DataType | None = None) -> pa.Scalar:
    """A Python value as an Arrow scalar for compute functions (which would otherwise convert
    it with ``pa.scalar``, importing pandas when installed: 0.4 s and 40 MiB)."""
    if isinstance(value, str):
        data = value.encode()
        offsets = np.array([0, len(data)], np.int32)
        return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(data)])[0]
    if isinstance(value, bool):
        return np_array(np.array([value], bool))[0]
    if isinstance(value, int):
        return np_array(np.array([value], typ.to_pandas_dtype() if typ is not None
                                 else np.int64))[0]
    raise TypeError(f"lit: {type(value).__name__}")


def np_array(values, valid=None) -> pa.Array:
    """A numpy array (numbers or bools; ``valid``: optional mask of non-null) as an Arrow
    array, zero-copy for numbers. (``pa.array`` would import pandas, 0.5 s, when installed.)"""
    values = np.ascontiguousarray(values)
    bitmap = None
    if valid is not None:
        valid = np.asarray(valid, bool)
        if not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if values.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(values), [
            bitmap, pa.py_buffer(np.packbits(values, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [bitmap, pa.py_buffer(values)])


def _arr(col) -> pa.Array:
    """One array. (``ChunkedArray.combine_chunks`` copies even a single chunk: 0.7 s for the
    prompt ids of a batch.)"""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _codes(col) -> np.ndarray:
    """Dense int64 codes of a column, null a value of its own; equal values, equal codes."""
    enc = pc.dictionary_encode(_arr(col), null_encoding="encode")
    return to_numpy(enc.indices).astype(np.int64, copy=False)


def _combine(*codes: np.ndarray) -> np.ndarray:
    """One dense code per distinct tuple of codes."""
    out = codes[0]
    for c in codes[1:]:
        out = np.unique(out * (int(c.max(initial=0)) + 1) + c, return_inverse=True)[1]
    return out.astype(np.int64, copy=False).reshape(-1)


def _segments(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
              dtype: np.dtype | None = None) -> np.ndarray:
    """values[starts[i]:starts[i] + lengths[i]] concatenated. Adjacent segments are copied as
    one run; long runs one slice each (Arrow's list ``take`` and numpy fancy indexing build an
    index per value: on token id lists they are 3-5x slower), many short ones (observations,
    follow-up completions) by one fancy index, as a slice each costs a microsecond of Python."""
    nz = lengths > 0
    if not nz.all():
        starts, lengths = starts[nz], lengths[nz]
    if len(starts) == 0:
        return np.zeros(0, dtype or values.dtype)
    ends = starts + lengths
    cut = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    runs = len(cut) + 1
    if runs >= _FEW_RUNS and int(lengths.sum()) < _SHORT_RUN * runs:
        out = values[_ranges(starts, lengths)]
        return out if dtype is None else out.astype(dtype, copy=False)
    first = np.concatenate(([0], cut)).tolist()
    last = (np.concatenate((cut, [len(starts)])) - 1).tolist()
    s, e = starts.tolist(), ends.tolist()
    return np.concatenate([values[s[a]:e[b]] for a, b in zip(first, last)], dtype=dtype)


# _segments: at least this many runs, of fewer values than this on average, go by one index
# (a slice costs about as much as indexing 64 values: 50 ms per 4M int32 either way)
_FEW_RUNS, _SHORT_RUN = 64, 64


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the ranges [starts[i], starts[i] + lengths[i]), concatenated."""
    total = int(lengths.sum())
    shift = starts - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def _second_mask(first_len: np.ndarray, second_len: np.ndarray) -> np.ndarray:
    """int8 per value of pieces laid out first[0], second[0], first[1], ...: 1 in the second
    pieces. For merged turns it is the completion mask itself (observation 0, completion 1)."""
    lengths = np.empty(2 * len(first_len), np.int64)
    lengths[0::2], lengths[1::2] = first_len, second_len
    return np.repeat(np.tile(np.array([0, 1], np.int8), len(first_len)), lengths)


def _interleave(first: np.ndarray, second: np.ndarray, second_mask: np.ndarray,
                dtype: np.dtype) -> np.ndarray:
    """Values of ``first`` where ``second_mask`` is False and of ``second`` where it is True,
    each in order: two gathered piece streams zipped back into their pieces' order."""
    out = np.empty(len(second_mask), dtype)
    out[~second_mask] = first
    out[second_mask] = second
    return out


def _take_lists(lists: _Lists, rows: np.ndarray, *, valid: np.ndarray | None = None,
                dtype: np.dtype | None = None) -> pa.Array:
    """The lists at ``rows`` (null where ``valid`` is False), values cast to ``dtype``."""
    lengths = lists.lengths[rows]
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    values = _segments(lists.values, lists.starts[rows], lengths, dtype)
    return _list_array(lengths, np_array(values),
                       mask=None if valid is None or valid.all() else ~valid)


def _extends(P: _Lists, C: _Lists, cur: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """Per pair: is prompt[prev] + completion[prev] a prefix of prompt[cur]? Both sides are
    gathered into one flat array each and compared at once."""
    pv, cv = P.values, C.values
    if pv.dtype != cv.dtype:
        raise Unsupported("prompt and completion ids of different types")
    ok = np.ones(len(cur), bool)
    if len(cur) == 0:
        return ok
    pn, cn = P.lengths[prev], C.lengths[prev]
    ctx = pn + cn
    was = _interleave(_segments(pv, P.starts[prev], pn), _segments(cv, C.starts[prev], cn),
                      _second_mask(pn, cn).view(bool), pv.dtype)
    differ = np.flatnonzero(was != _segments(pv, P.starts[cur], ctx))
    if len(differ):
        ok[np.searchsorted(np.cumsum(ctx), differ, side="right")] = False
    return ok


def _note(counter: Counter, reason: str, n: int) -> None:
    if n:
        counter[reason] += int(n)


_SMALL = ("trace_id", "span_id", "start_time_unix_nano", "end_time_unix_nano", "task_id",
          "agent_name", "turn_index", "candidate_index", "coordination_round", "request_model",
          "policy_version")


class _Lists:
    """A list column as flat numpy values, per-row start and length, and validity."""

    def __init__(self, col) -> None:
        self.array = _arr(col)
        offsets = to_numpy(self.array.offsets)
        self.starts = offsets[:-1].astype(np.int64)
        self.lengths = np.diff(offsets).astype(np.int64)
        self.valid = (to_numpy(self.array.is_valid()) if self.array.null_count
                      else np.ones(len(self.array), bool))
        self._values = None

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            values = self.array.values
            if values.null_count:
                raise Unsupported("null inside a list")
            self._values = to_numpy(values)
        return self._values


def _list_array(lengths: np.ndarray, values: pa.Array, mask: np.ndarray | None = None
                ) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise Unsupported("more than 2**31 list values in one chunk")
    return pa.ListArray.from_arrays(np_array(offsets.astype(np.int32)), values,
                                    type=values_list(values.type),
                                    mask=None if mask is None else np_array(mask))


def convert_table(spans: pa.Table, cfg, stats, rewards: dict, *, episodes: pa.Array,
                  select: np.ndarray | None = None) -> pa.Table:
    """Transitions of ``spans`` (conformed, one chunk per column), of the rows ``select``
    (a boolean mask; all without). ``rewards``: episode -> EpisodeRewards, read by the
    reference's reward reader; ``stats`` is filled in. Id lists are read where they lie."""
    from agl_bridge.trainer.credit import EpisodeRewards

    is_llm = pc.fill_null(pc.equal(spans["operation_name"], lit(sc.OP_CHAT)), lit(False))
    is_llm = to_numpy(_arr(is_llm))
    if select is not None:
        is_llm = is_llm & select
    li = np.flatnonzero(is_llm)
    n = len(li)
    stats.llm_spans = n
    if n == 0:
        return TRANSITION_SCHEMA.empty_table()
    llm = spans.select(list(_SMALL)).take(np_array(li))
    ep = _arr(_arr(episodes).take(np_array(li)))
    P = _Lists(spans["prompt_token_ids"])
    C = _Lists(spans["completion_token_ids"])
    L = _Lists(spans["completion_logprobs"])

    # -- dedup, skips, notes (the reference's per-row checks, as masks) ------------------------
    ident = _arr(pc.binary_join_element_wise(llm["trace_id"], llm["span_id"], lit("\x00")))
    _, first_idx = np.unique(_codes(ident), return_index=True)
    first = np.zeros(n, bool)
    first[first_idx] = True
    _note(stats.notes, "duplicate span id (later copy ignored)", n - len(first_idx))
    has_prompt = P.valid[li]
    clen = np.where(C.valid[li], C.lengths[li], -1)
    no_ids = first & (~has_prompt | (clen < 0))
    empty = first & ~no_ids & (clen == 0)
    _note(stats.skipped, "no token ids on the LLM span", no_ids.sum())
    _note(stats.skipped, "empty completion", empty.sum())
    keep = first & ~no_ids & ~empty
    lp_valid = L.valid[li]
    bad_lp = keep & lp_valid & (L.lengths[li] != clen)
    _note(stats.notes, "logprobs length differs from completion (logprobs dropped)", bad_lp.sum())
    skew = pc.fill_null(pc.less(llm["end_time_unix_nano"], llm["start_time_unix_nano"]),
                        lit(False))
    skew = to_numpy(_arr(skew))
    _note(stats.notes, "span ends before it starts (clock skew; kept)", (keep & skew).sum())
    lp_ok = lp_valid & ~bad_lp

    def narrow(sel: np.ndarray) -> None:
        nonlocal llm, ep, li, lp_ok, n
        t = np_array(sel)
        llm, ep = llm.take(t), _arr(ep.take(t))
        li, lp_ok, n = li[sel], lp_ok[sel], len(sel)

    if not keep.all():
        narrow(np.flatnonzero(keep))
        if n == 0:
            return TRANSITION_SCHEMA.empty_table()

    turn = _arr(llm["turn_index"])
    if turn.null_count:
        rnd = _arr(llm["coordination_round"])
        if rnd.null_count < len(rnd):
            _note(stats.notes, TURN_FROM_ROUND,
                  to_numpy(pc.and_(pc.is_null(turn), pc.is_valid(rnd))).sum())
            turn = _arr(pc.coalesce(turn, rnd))
    if turn.null_count:
        turn = _infer_turns(ep, llm, turn, stats)

    # -- rewards: episodes without one are dropped or filled -----------------------------------
    enc = pc.dictionary_encode(ep, null_encoding="encode")
    ep_codes = to_numpy(enc.indices).astype(np.int64)
    ep_rewards = []
    for e in enc.dictionary.to_pylist():
        r = rewards.get(e)
        if r is None or r.empty:
            if cfg.missing_reward == "drop":
                r = None
            else:
                r = rewards.setdefault(e, EpisodeRewards())
                r.team, r.has_team = float(cfg.missing_reward), True
        ep_rewards.append(r)
    has_reward = np.array([r is not None for r in ep_rewards], bool)[ep_codes]
    if not has_reward.all():
        _note(stats.skipped, "episode has no reward", (~has_reward).sum())
        sel = np.flatnonzero(has_reward)
        ep_codes = ep_codes[sel]
        turn = _arr(turn.take(np_array(sel)))
        narrow(sel)
        if n == 0:
            return TRANSITION_SCHEMA.empty_table()

    # -- groups (episode, agent, turn, candidate) and the order of the output -------------------
    agent = _arr(llm["agent_name"])
    agent_codes = _codes(agent)
    group = _combine(ep_codes, agent_codes, _codes(turn), _codes(llm["candidate_index"]))
    n_groups = int(group.max()) + 1
    row = np.arange(n, dtype=np.int64)
    group_first = np.full(n_groups, n, np.int64)
    np.minimum.at(group_first, group, row)
    group_size = np.bincount(group, minlength=n_groups)
    gfirst = group_first[group]
    if cfg.merge_turn_calls:
        multi = group_size[group] > 1
        order = np.lexsort((row, gfirst, multi))  # singles first, by their row
        n_single = int((~multi).sum())
        if n_single < n:
            # inside a multi-call group: (start or 0, span id), as the reference sorts
            sub = order[n_single:]
            start0 = pc.fill_null(llm["start_time_unix_nano"], lit(0))
            keys = pa.table({"g": np_array(gfirst[sub]), "s": _arr(start0).take(np_array(sub)),
                             "id": _arr(llm["span_id"]).take(np_array(sub)),
                             "r": np_array(sub)})
            idx = pc.sort_indices(keys, sort_keys=[("g", "ascending"), ("s", "ascending"),
                                                    ("id", "ascending"), ("r", "ascending")])
            order[n_single:] = sub[to_numpy(idx)]
    else:
        order = np.lexsort((row, gfirst))
        n_single = n
    g_rows = li[order]  # the calls' rows in ``spans``, in output order

    # -- multi-call groups: does each call extend the previous call's context? ---------------
    new = np.ones(n, bool)
    if n_single < n:
        o_group = group[order]
        new[n_single + 1:] = o_group[n_single + 1:] != o_group[n_single:-1]
        pairs = np.flatnonzero(~new)  # call j continues the group of call j - 1
        if len(pairs):
            cur, prev = g_rows[pairs], g_rows[pairs - 1]
            plen, ctx_p, ctx_c = P.lengths[cur], P.lengths[prev], C.lengths[prev]
            fits = np.flatnonzero(plen >= ctx_p + ctx_c)
            ok = np.zeros(len(pairs), bool)
            if len(fits):
                ok[fits] = _extends(P, C, cur[fits], prev[fits])
            new[pairs[~ok]] = True
            _note(stats.notes, "call does not extend its turn's context (kept separate)",
                  (~ok).sum())

    # -- transitions ----------------------------------------------------------------------------
    first_pos = np.flatnonzero(new)
    n_tr = len(first_pos)
    tr_of_call = np.cumsum(new) - 1
    merged_calls = np.diff(np.append(first_pos, n)).astype(np.int32)
    first_local = order[first_pos]
    first_rows = li[first_local]
    lp_ok_o = lp_ok[order]
    tr_lp_ok = np.bincount(tr_of_call, weights=~lp_ok_o, minlength=n_tr) == 0

    prompt_ids = _take_lists(P, first_rows)
    # single calls (the groups of one call come first): their lists as they are
    n_a = int(np.searchsorted(first_pos, n_single)) if n_single < n else n_tr
    rows_a = g_rows[:n_single]
    comp_a = _take_lists(C, rows_a)
    mask_a = pa.ListArray.from_arrays(comp_a.offsets, np_array(
        np.ones(len(comp_a.values), np.int8)), type=values_list(pa.int8()))
    lp_a = _take_lists(L, rows_a, valid=tr_lp_ok[:n_a], dtype=np.dtype(np.float32))
    comps, masks, lps = [comp_a], [mask_a], [lp_a]
    if n_single < n:  # calls of multi-call groups: observation (mask 0) + completion (mask 1)
        calls = np.arange(n_single, n)
        rows_b = g_rows[calls]
        cont = ~new[calls]
        prev_rows = g_rows[calls - 1]
        ctx = np.where(cont, P.lengths[prev_rows] + C.lengths[prev_rows], 0)
        obs_len = np.where(cont, P.lengths[rows_b] - ctx, 0)
        comp_len = C.lengths[rows_b]
        seg_mask = _second_mask(obs_len, comp_len)  # the completion_mask values
        is_comp = seg_mask.view(bool)
        values = _interleave(_segments(P.values, P.starts[rows_b] + ctx, obs_len),
                             _segments(C.values, C.starts[rows_b], comp_len), is_comp, np.int32)
        tr_b = tr_of_call[calls] - n_a
        n_b = n_tr - n_a
        lengths = np.bincount(tr_b, weights=obs_len + comp_len, minlength=n_b).astype(np.int64)
        comps.append(_list_array(lengths, np_array(values)))
        masks.append(_list_array(lengths, np_array(seg_mask)))
        ok_b = tr_lp_ok[n_a:]
        if ok_b.any():
            has = lp_ok_o[calls] & ok_b[tr_b]
            comp_lp = np.zeros(int(comp_len.sum()), np.float32)  # 0.0 where a call sent none
            comp_lp[np.repeat(has, comp_len)] = _segments(L.values, L.starts[rows_b][has],
                                                          comp_len[has], np.dtype(np.float32))
            lp_vals = np.zeros(len(seg_mask), np.float32)  # 0.0 at observations
            lp_vals[is_comp] = comp_lp
            lps.append(_list_array(lengths, np_array(lp_vals), mask=~ok_b))
        else:
            lps.append(pa.nulls(n_b, values_list(pa.float32())))

    # -- keys, rewards, groups, advantages ----------------------------------------------------
    take_first = np_array(first_local)
    t_ep = ep.take(take_first)
    t_task = _arr(llm["task_id"]).take(take_first)
    t_agent = agent.take(take_first)
    t_turn = turn.take(take_first)
    t_ep_codes = ep_codes[first_local]
    t_turn_np = to_numpy(pc.fill_null(t_turn, lit(0, pa.int32()))).astype(np.int64)
    t_turn_valid = (to_numpy(pc.is_valid(t_turn)) if t_turn.null_count
                    else np.ones(n_tr, bool))

    team = np.array([r.team if r is not None else 0.0 for r in ep_rewards], np.float64)
    team_t = team[t_ep_codes]
    if cfg.gamma != 1.0:
        ea = _combine(t_ep_codes, agent_codes[first_local])
        low = np.iinfo(np.int64).min
        last = np.full(int(ea.max()) + 1, low, np.int64)
        np.maximum.at(last, ea[t_turn_valid], t_turn_np[t_turn_valid])
        last_t = last[ea]
        has_disc = t_turn_valid & (last_t != low)
        exps = np.where(has_disc, last_t - t_turn_np, 0)
        uniq, inv = np.unique(exps, return_inverse=True)
        disc = np.array([cfg.gamma ** int(e) for e in uniq], np.float64)[inv.reshape(-1)]
        team_t = team_t * np.where(has_disc, disc, 1.0)
    if cfg.algorithm == "lightning_rl":
        reward = team_t
    else:
        local = np.zeros(n_tr, np.float64)
        with_local = [i for i, r in enumerate(ep_rewards) if r is not None and (r.agent or r.turn)]
        if with_local:
            sel = np.flatnonzero(np.isin(t_ep_codes, with_local))
            agents_l = t_agent.take(np_array(sel)).to_pylist()
            turns_l = t_turn.take(np_array(sel)).to_pylist()
            for k, i in enumerate(sel.tolist()):
                r = ep_rewards[t_ep_codes[i]]
                local[i] = r.agent.get(agents_l[k], 0.0) + r.turn.get((agents_l[k], turns_l[k]),
                                                                      0.0)
        reward = cfg.alpha * team_t + local

    task_part = pc.if_else(pc.is_valid(t_task),
                           pc.binary_join_element_wise(lit("task:"), t_task, lit("")),
                           pc.binary_join_element_wise(lit("episode:"), t_ep, lit("")))
    if cfg.algorithm == "lightning_rl":
        group_id = task_part
    else:
        group_id = pc.binary_join_element_wise(
            task_part, lit("|agent:"), pc.fill_null(t_agent, lit("None")), lit("|turn:"),
            pc.fill_null(pc.cast(t_turn, pa.string()), lit("None")), lit(""))
    group_id = _arr(group_id)
    advantage, n_groups_out, zero_var = _advantages(
        reward, _codes(group_id), t_ep_codes, unit=cfg.advantage_unit,
        scale=cfg.scale_advantages)

    _note(stats.notes, "transition without task id (its own group: no GRPO signal)",
          t_task.null_count)
    stats.transitions = n_tr
    stats.rewards = reward.tolist()
    stats.groups, stats.zero_variance_groups = n_groups_out, zero_var
    at = _combine(agent_codes[first_local], _codes(t_turn))
    _, at_first, at_count = np.unique(at, return_index=True, return_counts=True)
    at_first = np_array(at_first)
    stats.per_agent_turn.update(dict(zip(zip(t_agent.take(at_first).to_pylist(),
                                             t_turn.take(at_first).to_pylist()),
                                         at_count.tolist())))

    def meta(name: str) -> pa.Array:
        return _arr(llm[name]).take(take_first)

    data = {
        "episode_id": t_ep, "task_id": t_task, "agent_name": t_agent, "turn_index": t_turn,
        "candidate_index": meta("candidate_index"), "trace_id": meta("trace_id"),
        "span_id": meta("span_id"), "merged_calls": np_array(merged_calls),
        "request_model": meta("request_model"), "policy_version": meta("policy_version"),
        "prompt_ids": prompt_ids, "completion_ids": pa.chunked_array(comps),
        "completion_mask": pa.chunked_array(masks),
        "behaviour_logprobs": pa.chunked_array(lps, values_list(pa.float32())),
        "reward": np_array(reward), "group_id": group_id, "advantage": np_array(advantage),
        "retokenized": np_array(np.zeros(n_tr, bool)),
        "start_time_unix_nano": meta("start_time_unix_nano"),
    }
    columns = []
    for f in TRANSITION_SCHEMA:
        a = data[f.name]
        if not isinstance(a, pa.ChunkedArray):
            a = pa.chunked_array([a])
        columns.append(a if a.type == f.type else a.cast(f.type))
    return pa.Table.from_arrays(columns, schema=TRANSITION_SCHEMA)


def _advantages(reward: np.ndarray, group: np.ndarray, episode: np.ndarray, *, unit: str,
                scale: bool, eps: float = 1e-4) -> tuple[np.ndarray, int, int]:
    """``credit.advantages`` on arrays: same sums (math.fsum per group), same results."""
    from agl_bridge.trainer.credit import mean_of

    n = len(reward)
    out = np.zeros(n, np.float64)
    if n == 0:
        return out, 0, 0
    order = np.argsort(group, kind="stable")
    g_sorted = group[order]
    bounds = np.flatnonzero(np.diff(g_sorted)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [n]))
    n_groups = len(starts)
    r_sorted = reward[order].tolist()
    e_sorted = episode[order].tolist() if unit == "rollout" else None
    mean = np.zeros(n_groups)
    std = np.zeros(n_groups)
    use = np.zeros(n_groups, bool)
    zero_var = 0
    fsum, sqrt = math.fsum, math.sqrt
    for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        if unit == "rollout":
            per: dict = {}
            for v, e in zip(r_sorted[a:b], e_sorted[a:b]):
                per.setdefault(e, []).append(v)
            values = [mean_of(v) for v in per.values()]
        else:
            if b - a < 2:
                continue
            values = r_sorted[a:b]
        m = len(values)
        if m < 2:
            continue
        if min(values) == max(values):
            zero_var += 1
            continue
        mu = fsum(values) / m
        sd = sqrt(fsum((v - mu) ** 2 for v in values) / (m - 1))
        if sd == 0.0:
            zero_var += 1
            continue
        mean[k], std[k], use[k] = mu, sd, True
    gk = np.repeat(np.arange(n_groups), ends - starts)
    centred = np.asarray(r_sorted) - mean[gk]
    adv_sorted = np.where(use[gk], centred / (std[gk] + eps) if scale else centred, 0.0)
    out[order] = adv_sorted
    return out, n_groups, zero_var


def _turns_array(turns: list) -> pa.Array:
    valid = np.array([t is not None for t in turns], bool)
    values = np.array([t if t is not None else 0 for t in turns], np.int32)
    return np_array(values, valid)


def _infer_turns(ep: pa.Array, llm: pa.Table, turn: pa.Array, stats) -> pa.Array:
    """The reference's turn inference, in Python, over the episodes that lack a turn."""
    null_eps = pc.unique(ep.filter(pc.is_null(turn)))
    sel = np.flatnonzero(to_numpy(pc.is_in(ep, value_set=null_eps)))
    sub = llm.select(["agent_name", "start_time_unix_nano", "span_id"]).take(np_array(sel))
    eps = ep.take(np_array(sel)).to_pylist()
    agents = sub["agent_name"].to_pylist()
    starts = sub["start_time_unix_nano"].to_pylist()
    span_ids = sub["span_id"].to_pylist()
    turns = turn.to_pylist()
    by_episode: dict = {}
    for k, e in enumerate(eps):
        by_episode.setdefault(e, []).append(k)
    inferred = 0
    for ks in by_episode.values():
        ks.sort(key=lambda k: (starts[k] or 0, span_ids[k]))
        count: Counter = Counter()
        previous: object = object()
        for k in ks:
            a = agents[k]
            if a is None or a != previous:
                count[a] += 1
            previous = a
            i = int(sel[k])
            if turns[i] is None:
                turns[i] = count[a] - 1
                inferred += 1
    _note(stats.notes, TURN_INFERRED, inferred)
    return _turns_array(turns)
