"""The reference a batch from ``otel.span_columns`` is checked against: the rows
``rows.span_to_row`` + ``rows_to_table`` give the same spans, partition by partition (NaN equal
to NaN)."""

import json
import math

import pyarrow as pa
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agl_bridge.otel.rows import partition_of, rows_to_table, span_to_row
from agl_bridge.schema import SPAN_SCHEMA

DAY = 86_400 * 10**9


def finished_spans(build, resource=None):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource or Resource.create({"service.name": "team"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("scope.test"))
    return list(memory.get_finished_spans())


def reference_tables(spans):
    rows = [span_to_row(s) for s in spans]
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(partition_of(r["start_time_unix_nano"], r["service_name"]), []).append(r)
    return {p: rows_to_table(rs) for p, rs in by.items()}


def assert_same_tables(got: dict[str, pa.Table], want: dict[str, pa.Table]):
    assert got.keys() == want.keys()
    for p in want:
        assert got[p].schema.equals(SPAN_SCHEMA)
        got[p].validate(full=True)
        g, w = got[p].to_pylist(), want[p].to_pylist()
        for a, b in zip(g, w, strict=True):
            assert nan_equal(a, b), f"{p}: {a} != {b}"


def nan_equal(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(nan_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(nan_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a.startswith(("{", "[")):
        return nan_equal(json.loads(a), json.loads(b))  # NaN in JSON text compares unequal
    return type(a) is type(b) and a == b
