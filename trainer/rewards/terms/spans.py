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
from agl_bridge.trainer.arrow import lit, to_numpy

TOKENS = ("input+output", "input", "output")  # which tokens a term counts


def named(spans: pa.Table, names: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """``columns`` of the rows whose span name is one of ``names`` (only those columns are
    copied: a unit's token id lists and attributes are large)."""
    mask = pc.fill_null(pc.is_in(spans["name"], value_set=pa.array(names, pa.string())), False)
    return spans.select(list(columns)).filter(mask)


def is_chat(spans: pa.Table) -> pa.Array:
    """Which rows are LLM calls (``gen_ai.operation.name = chat``)."""
    return pc.fill_null(pc.equal(spans["operation_name"], sc.OP_CHAT), False)


def chats(spans: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the LLM call rows."""
    return spans.select(list(columns)).filter(is_chat(spans))


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
    digits = pc.if_else(pc.is_valid(found), pc.struct_field(found, [0]), lit("-1"))
    return to_numpy(pc.cast(digits, pa.int64()))  # not .to_numpy(): it imports pandas


def call_tokens(spans: pa.Table, which: str, mask: pa.Array | None = None) -> np.ndarray:
    """Tokens of each row in ``mask`` (all rows without): ``gen_ai.usage.input_tokens`` /
    ``output_tokens`` from its attributes, or, where it has no usage attribute, the length of
    its prompt / completion token id lists (the same numbers for a call vLLM served with ids).
    Computed over whole columns, then masked: that reads list offsets and scans the JSON text
    once, with no copy of either."""
    total = np.zeros(spans.num_rows, np.int64)
    for part, key, ids in (("input", sc.GEN_AI_USAGE_INPUT_TOKENS, "prompt_token_ids"),
                           ("output", sc.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_token_ids")):
        if part not in which.split("+"):
            continue
        usage = _json_int(spans["attributes"], key)
        lengths = np.asarray(pc.fill_null(pc.list_value_length(spans[ids]), 0).to_numpy(
            zero_copy_only=False), np.int64)
        total += np.where(usage >= 0, usage, lengths)
    if mask is None:
        return total
    return total[np.asarray(mask.to_numpy(zero_copy_only=False), bool)]

