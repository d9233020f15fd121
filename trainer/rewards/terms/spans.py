"""Reading span rows for terms: rows by name, attributes from the JSON column, token counts.

Attributes that are not promoted to columns live in the ``attributes`` JSON. Parsing JSON is
the expensive part of a term, so terms first pick the few rows they need by a column (span
name, operation) and parse only those; token counts, wanted on every LLM call, are taken from
the JSON text with one vectorised regular expression instead of a parse per row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc

TOKENS = ("input+output", "input", "output")  # which tokens a term counts


def named(spans: pa.Table, *names: str) -> pa.Table:
    """The rows whose span name is one of ``names``."""
    if spans.num_rows == 0:
        return spans
    mask = pc.is_in(spans["name"], value_set=pa.array(names, pa.string()))
    return spans.filter(pc.fill_null(mask, False))


def chats(spans: pa.Table) -> pa.Table:
    """The LLM call rows (``gen_ai.operation.name = chat``)."""
    if spans.num_rows == 0:
        return spans
    return spans.filter(pc.fill_null(pc.equal(spans["operation_name"], sc.OP_CHAT), False))


def attributes(rows: pa.Table, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per row, ``keys`` from its attributes JSON (missing keys absent; unreadable JSON: {})."""
    out = []
    for raw in rows["attributes"].to_pylist():
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        out.append({k: parsed[k] for k in keys if k in parsed})
    return out


def _json_int(text: pa.ChunkedArray | pa.Array, key: str) -> np.ndarray:
    """The integer value of top-level ``key`` in each JSON object of ``text`` (-1 where
    absent). A key spelled inside a string value is escaped there, so it never matches."""
    pattern = r'[{,]\s*"' + key.replace(".", r"\.") + r'"\s*:\s*(?P<n>\d+)[,}\s]'
    found = pc.extract_regex(text, pattern)
    digits = pc.if_else(pc.is_valid(found), pc.struct_field(found, [0]), pa.scalar("-1"))
    return np.asarray(pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False))


def call_tokens(calls: pa.Table, which: str) -> np.ndarray:
    """Tokens of each LLM call: ``gen_ai.usage.input_tokens`` / ``output_tokens`` from its
    attributes, or, where a call has no usage attribute, the length of its prompt /
    completion token id lists (the same numbers for a call vLLM served with ids)."""
    total = np.zeros(calls.num_rows, np.int64)
    for part, key, ids in (("input", sc.GEN_AI_USAGE_INPUT_TOKENS, "prompt_token_ids"),
                           ("output", sc.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_token_ids")):
        if part not in which.split("+"):
            continue
        usage = _json_int(calls["attributes"], key) if "attributes" in calls.column_names \
            else np.full(calls.num_rows, -1, np.int64)
        lengths = np.asarray(pc.fill_null(pc.list_value_length(calls[ids]), 0).to_numpy(
            zero_copy_only=False), np.int64) if ids in calls.column_names \
            else np.zeros(calls.num_rows, np.int64)
        total += np.where(usage >= 0, usage, lengths)
    return total


def column(rows: pa.Table, name: str) -> list[Any]:
    return rows[name].to_pylist() if name in rows.column_names else [None] * rows.num_rows
