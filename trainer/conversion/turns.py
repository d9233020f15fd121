"""Which turn each LLM call belongs to.

From ``agl_bridge.turn.index`` when the span has it. Otherwise from the orchestrator's
coordination round (``agl_bridge.coordination.round``, which every span inside a
``coordination_round`` scope carries): a round is one turn of each agent in it. Otherwise
inferred from the order of the calls: within an episode, in time order (start, then span id),
an agent's turn is a run of its calls not interrupted by another agent's call (an agent's turn
ends when another agent speaks); calls with no agent are one turn each. The last two are
counted in the notes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.trainer.arrow import arr, note, np_array, to_numpy
from agl_bridge.trainer.conversion import reasons


def assign_turns(episode: pa.Array, calls: pa.Table, notes: Counter[str]) -> pa.Array:
    """The turn of each call (row of ``calls``: ``turn_index``, ``coordination_round``,
    ``agent_name``, ``start_time_unix_nano``, ``span_id``), as int32."""
    turn = arr(calls["turn_index"])
    if turn.null_count:
        rnd = arr(calls["coordination_round"])
        if rnd.null_count < len(rnd):
            note(notes, reasons.TURN_FROM_ROUND,
                 to_numpy(pc.and_(pc.is_null(turn), pc.is_valid(rnd))).sum())
            turn = arr(pc.coalesce(turn, rnd))
    if turn.null_count:
        turn = _infer(episode, calls, turn, notes)
    return turn


def _infer(episode: pa.Array, calls: pa.Table, turn: pa.Array, notes: Counter[str]
           ) -> pa.Array:
    """Turns by order, in Python, over the episodes that lack a turn somewhere."""
    null_eps = pc.unique(episode.filter(pc.is_null(turn)))
    sel = np.flatnonzero(to_numpy(pc.is_in(episode, value_set=null_eps)))
    sub = calls.select(["agent_name", "start_time_unix_nano", "span_id"]).take(np_array(sel))
    eps = episode.take(np_array(sel)).to_pylist()
    agents = sub["agent_name"].to_pylist()
    starts = sub["start_time_unix_nano"].to_pylist()
    span_ids = sub["span_id"].to_pylist()
    turns = turn.to_pylist()
    by_episode: dict[object, list[int]] = {}
    for k, e in enumerate(eps):
        by_episode.setdefault(e, []).append(k)
    inferred = 0
    for ks in by_episode.values():
        ks.sort(key=lambda k: (starts[k] or 0, span_ids[k]))
        count: Counter[object] = Counter()
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
    note(notes, reasons.TURN_INFERRED, inferred)
    valid = np.array([t is not None for t in turns], bool)
    values = np.array([t if t is not None else 0 for t in turns], np.int32)
    return np_array(values, valid)
