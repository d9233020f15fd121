"""The span columns the converter reads, in the span schema's types, and episode keys.

Only these columns are read from span files (the JSON blobs only when retokenizing): the span
name is required of a file (the contract) but never read, since the operation column says what
a span is.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.schema import REQUIRED_SPAN_COLUMNS, SPAN_SCHEMA
from agl_bridge.trainer.arrow import arr, lit

COLUMNS = ("trace_id", "span_id", "start_time_unix_nano", "end_time_unix_nano", "episode_id",
           "task_id", "agent_name", "turn_index", "candidate_index", "coordination_round",
           "operation_name", "request_model", "policy_version", "prompt_token_ids",
           "completion_token_ids", "completion_logprobs", "reward_value", "reward_scope",
           "evaluation_name", "evaluation_target")

# read besides when retokenizing: the messages, and where other instrumentors keep them and the
# agent of a call (``foreign.py``: events, the enclosing span)
RETOKENIZE_COLUMNS = ("attributes", "events", "parent_span_id")

# not in the span schema: set by retokenization on rows whose ids it rebuilt
RETOKENIZED = "retokenized"


def columns_to_read(retokenize: bool, extra: Sequence[str] = ()) -> list[str]:
    """The span file columns conversion reads, in schema order (``extra``: those a reward
    recipe reads besides)."""
    wanted = set(COLUMNS) | set(REQUIRED_SPAN_COLUMNS) | set(extra) | (
        set(RETOKENIZE_COLUMNS) if retokenize else set())
    return [c for c in SPAN_SCHEMA.names if (c != "name" or c in extra) and c in wanted]


def conform(spans: pa.Table, extra: Sequence[str] = ()) -> pa.Table:
    """``COLUMNS`` and ``extra`` in SPAN_SCHEMA types (absent ones as nulls), plus the
    ``retokenized`` flag when retokenization set it."""
    cols, fields = [], []
    for name in (*COLUMNS, *(c for c in extra if c not in COLUMNS)):
        f = SPAN_SCHEMA.field(name)
        if name in spans.column_names:
            col = spans[name]
            if col.type != f.type:
                col = col.cast(f.type)
        else:
            col = pa.nulls(spans.num_rows, f.type)
        cols.append(col)
        fields.append(pa.field(name, f.type))
    if RETOKENIZED in spans.column_names:
        cols.append(spans[RETOKENIZED])
        fields.append(pa.field(RETOKENIZED, pa.bool_()))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def episode_keys(table: pa.Table) -> pa.Array:
    """episode id, or ``trace:<trace id>`` without one (one trace = one episode: the best guess
    that never mixes two)."""
    ep = table["episode_id"]
    if ep.null_count == 0:
        return arr(ep)
    trace = pc.fill_null(table["trace_id"], lit("None"))
    key = pc.coalesce(ep, pc.binary_join_element_wise(lit("trace:"), trace, lit("")))
    return arr(key)


def episode_attributes(spans: pa.Table, episodes: pa.Array, attributes: Sequence[str]
                       ) -> dict[str, dict[str, str]]:
    """attribute -> episode key -> its value (as text): the first value found on the
    episode's spans, in time order. A span column by that name is read directly; any other
    attribute from the ``attributes`` JSON of the rows that mention it."""
    import json

    out: dict[str, dict[str, str]] = {}
    order = pc.sort_indices(spans, sort_keys=[("start_time_unix_nano", "ascending")]) \
        if "start_time_unix_nano" in spans.column_names else None
    if order is not None:
        spans, episodes = spans.take(order), episodes.take(order)
    for attribute in attributes:
        found: dict[str, str] = {}
        if attribute in spans.column_names:
            values = spans[attribute].to_pylist()
            for episode, value in zip(episodes.to_pylist(), values):
                if value is not None and episode not in found:
                    found[episode] = str(value)
        elif "attributes" in spans.column_names:
            mask = pc.fill_null(pc.match_substring(spans["attributes"], json.dumps(attribute)),
                                False)
            rows = spans["attributes"].filter(mask).to_pylist()
            for episode, raw in zip(episodes.filter(mask).to_pylist(), rows):
                if episode in found:
                    continue
                try:
                    value = json.loads(raw).get(attribute)
                except (ValueError, AttributeError):
                    continue
                if value is not None:
                    found[episode] = value if isinstance(value, str) else json.dumps(value)
        out[attribute] = found
    return out
