"""Evaluation records in span files -> rewards per episode, before the stages run.

Evaluations (``agl_bridge.feedback``, ``gen_ai.evaluation.result`` log records and span
events, judges' scores) may lie in any file: another service's partition, another day. So they
are gathered in a pass of their own over a few mostly-null columns, their targets looked up in
a second pass that keeps only the rows they name, and the result
(``rewards.evaluations.resolve``) is handed to every unit the stages convert. With no
evaluation in the input, the cost is reading those few columns.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.trainer.arrow import arr, to_numpy
from agl_bridge.trainer.conversion.columns import episode_keys
from agl_bridge.trainer.rewards.evaluations import (
    ANY,
    Evaluation,
    Lookup,
    Place,
    Resolved,
    resolve,
)

# what marks a row as an evaluation record, and the span events that hold one
_SCAN = ["evaluation_name", "evaluation_target", "events", "reward_value"]
_RECORD = ["trace_id", "span_id", "parent_span_id", "start_time_unix_nano", "episode_id",
           "agent_name", "turn_index", "reward_kind", "reward_scope", "reward_value",
           "evaluation_name", "evaluation_score", "evaluation_label", "evaluation_target",
           "response_id", "events"]
_PLACE = ["trace_id", "span_id", "episode_id", "agent_name", "turn_index", "response_id"]
_MARK = ["evaluation_name", "evaluation_target"]
# (episode ids, trace ids, response ids, parent spans) the evaluations may name
Needs = tuple[set[str], set[str], set[str], set[tuple[str, str]]]


def is_evaluation(table: pa.Table) -> pa.Array:
    """Rows that are evaluation records (not spans of an episode)."""
    out = None
    for name in ("evaluation_name", "evaluation_target"):
        if name in table.column_names:
            valid = pc.is_valid(table[name])
            out = valid if out is None else pc.or_(out, valid)
    return arr(out) if out is not None else pa.array([False] * table.num_rows)


def _candidates(table: pa.Table) -> pa.Array:
    mask = is_evaluation(table)
    if "events" in table.column_names and table["events"].null_count < table.num_rows:
        events = pc.fill_null(pc.match_substring(table["events"], sc.GEN_AI_EVALUATION_RESULT),
                              False)
        if "reward_value" in table.column_names:  # a reward span's own event: the reward counts
            events = pc.and_(events, pc.is_null(table["reward_value"]))
        mask = pc.or_(mask, events)
    return mask


def _records(table: pa.Table) -> list[Evaluation]:
    """The evaluations of rows already filtered to candidates."""
    out: list[Evaluation] = []
    for row in table.to_pylist():
        if row.get("evaluation_name") is not None or row.get("evaluation_target") is not None:
            parent = (row["trace_id"], row["parent_span_id"]) if row.get("parent_span_id") \
                else None
            out.append(Evaluation(
                name=row.get("evaluation_name") or "feedback", score=row.get("evaluation_score"),
                label=row.get("evaluation_label"), time=row.get("start_time_unix_nano") or 0,
                ident=row["span_id"], episode=row.get("episode_id"),
                agent=row.get("agent_name"), turn=row.get("turn_index"),
                scope=row.get("reward_scope"), kind=row.get("reward_kind"),
                target=row.get("evaluation_target"), parent=parent, trace=row["trace_id"],
                response=row.get("response_id")))
            continue
        if row.get("reward_value") is not None:
            continue  # our own reward spans carry the event too: the reward itself counts
        out += _span_events(row)
    return out


def _span_events(row: dict) -> list[Evaluation]:
    """``gen_ai.evaluation.result`` span events, placed as a log record emitted in the span
    that holds them would be: inside an episode (the span carries an episode id), that
    episode; else the call their ``gen_ai.response.id`` names; else the span that holds them.

    An evaluator that is a program of its own (the OpenTelemetry SDK alone) adds the event to
    its own span, which carries no episode: the response id it names decides, never the
    evaluator's trace (joining by the holding span's trace gave the score to the evaluator)."""
    try:
        events = json.loads(row["events"])
    except (TypeError, ValueError):
        return []
    out = []
    for k, event in enumerate(events if isinstance(events, list) else []):
        if not isinstance(event, dict) or event.get("name") != sc.GEN_AI_EVALUATION_RESULT:
            continue
        attributes = event.get("attributes") or {}
        score = attributes.get(sc.GEN_AI_EVALUATION_SCORE_VALUE)
        label = attributes.get(sc.GEN_AI_EVALUATION_SCORE_LABEL)
        name = attributes.get(sc.GEN_AI_EVALUATION_NAME)
        response = attributes.get(sc.GEN_AI_RESPONSE_ID)
        out.append(Evaluation(
            name=name if isinstance(name, str) and name else "evaluation",
            score=float(score) if isinstance(score, (int, float)) and not isinstance(
                score, bool) else None,
            label=label if isinstance(label, str) else None,
            time=event.get("time_unix_nano") or row.get("start_time_unix_nano") or 0,
            ident=f"{row['span_id']}/{k}", episode=row.get("episode_id"),
            agent=row.get("agent_name"), turn=row.get("turn_index"),
            kind=sc.RewardKind.EVALUATION, parent=(row["trace_id"], row["span_id"]),
            trace=row["trace_id"],
            response=response if isinstance(response, str) and response else None))
    return out


def scan_tables(tables: Iterable[pa.Table]) -> list[Evaluation]:
    out: list[Evaluation] = []
    for t in tables:
        mask = _candidates(t)
        if pc.any(mask).as_py():
            kept = t.filter(mask)
            out += _records(kept.select([c for c in _RECORD if c in kept.column_names]))
    return out


def scan_files(files: Iterable[Path]) -> list[Evaluation]:
    """The evaluations in span files: a read of the marker columns, then of the few rows."""
    out: list[Evaluation] = []
    for path in files:
        try:
            pf = pq.ParquetFile(path, memory_map=True)
            names = pf.schema_arrow.names
            scan = [c for c in _SCAN if c in names]
            if not scan:
                continue
            t = pf.read(columns=scan, use_threads=False)
            mask = _candidates(t)
            if not pc.any(mask).as_py():
                continue
            full = pf.read(columns=[c for c in _RECORD if c in names], use_threads=False)
        except (pa.ArrowInvalid, OSError):
            continue  # unreadable files are named when the stages read them
        out += scan_tables([full.filter(mask)])
    return out


def _needs(evaluations: list[Evaluation]) -> Needs:
    episodes, traces, responses, spans = set(), set(), set(), set()
    for e in evaluations:
        if e.episode is not None:
            continue
        if e.target:
            kind, _, ident = e.target.partition(":")
            if kind in (ANY, sc.TARGET_EPISODE):
                episodes.add(ident)
            if kind in (ANY, sc.TARGET_TRACE):
                traces.add(ident.lower())
            if kind in (ANY, sc.TARGET_RESPONSE):
                responses.add(ident)
            continue
        if e.response is not None:
            responses.add(e.response)
        if e.parent is not None:
            spans.add(e.parent)
        elif e.trace is not None:
            traces.add(e.trace)
    return episodes, traces, responses, spans


def _add_places(table: pa.Table, needs: Needs, lookup: Lookup) -> None:
    episodes, traces, responses, spans = needs
    keys = arr(episode_keys(table))
    named = [(keys, episodes), (table["trace_id"], traces),
             (table["span_id"], {s for _, s in spans})]
    if "response_id" in table.column_names:
        named.append((table["response_id"], responses))
    masks = [pc.is_in(column, value_set=pa.array(sorted(ids), pa.string()))
             for column, ids in named if ids]
    if not masks:
        return
    mask = pc.fill_null(functools.reduce(pc.or_, masks), False)
    if not to_numpy(arr(mask)).any():
        return
    sub = table.filter(mask)
    for row, key in zip(sub.to_pylist(), arr(keys.filter(mask)).to_pylist()):
        place = Place(key, row.get("agent_name"), row.get("turn_index"))
        if key in episodes:
            lookup.episodes.add(key)
        if row["trace_id"] in traces:
            lookup.traces.setdefault(row["trace_id"], set()).add(key)
        if row.get("response_id") in responses:
            lookup.responses.setdefault(row["response_id"], place)
        if (row["trace_id"], row["span_id"]) in spans:
            lookup.spans[(row["trace_id"], row["span_id"])] = place


def _evaluation_free(table: pa.Table) -> pa.Table:
    """The rows that are spans, not evaluation records (records never place a target)."""
    mask = is_evaluation(table)
    return table if not pc.any(mask).as_py() else table.filter(pc.invert(mask))


def resolve_tables(evaluations: list[Evaluation], tables: Iterable[pa.Table], *,
                   weights: Mapping[str, float] | None,
                   labels: Mapping[str, float] | None) -> Resolved:
    needs = _needs(evaluations)
    lookup = Lookup()
    if any(needs):
        for t in tables:
            _add_places(_evaluation_free(t.select([c for c in _PLACE + _MARK
                                                   if c in t.column_names])), needs, lookup)
    return resolve(evaluations, lookup, weights=weights, labels=labels)


def resolve_files(evaluations: list[Evaluation], files: Iterable[Path], *,
                  weights: Mapping[str, float] | None,
                  labels: Mapping[str, float] | None) -> Resolved:
    def tables() -> Iterable[pa.Table]:
        for path in files:
            try:
                pf = pq.ParquetFile(path, memory_map=True)
                names = pf.schema_arrow.names
                yield pf.read(columns=[c for c in _PLACE + _MARK if c in names],
                              use_threads=False)
            except (pa.ArrowInvalid, OSError):
                continue

    return resolve_tables(evaluations, tables(), weights=weights, labels=labels)
