"""The exporter's column-wise batch conversion (``otel.span_columns``) against the reference
(``rows.span_to_row`` + ``rows_to_table``): the same rows for every value a span can hold,
hostile ones included, and no pandas import on the way."""

import json
import random
import subprocess
import sys

import pyarrow as pa
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import set_number_lists
from agl_bridge.otel.span_columns import spans_to_tables
from tests.otel.span_columns_reference import (
    DAY,
    assert_same_tables,
    finished_spans,
    reference_tables,
)

# values each promoted key is given across the spans: what fits its column and what does not
HOSTILE = {
    sc.PROMPT_TOKEN_IDS: [(1, 2, 3), (), [4, 5], (1, None, 3), (1, True), (2**31,), (-2**31 - 1,),
                          (1, 2.5), (1.0, 2.0), ("a", "b"), "1,2", 7, (2**31 - 1, -2**31)],
    sc.COMPLETION_LOGPROBS: [(-0.5, -1.25), (), (0, -1.5), (-0.5, None), (2**60, -1.0),
                             (float("nan"),), (float("-inf"), -1.0), (True, -1.0), (1,),
                             ("x",), -0.5],
    sc.TURN_INDEX: [0, 3, -1, 2**31, -2**31 - 1, True, 1.0, "2", (1,)],
    sc.REWARD_VALUE: [1.0, -0.5, 3, 2**53, 2**53 + 1, True, "1", float("inf"), float("nan")],
    sc.EPISODE_ID: ["ep-1", "", "épisode ✓", 7, ("a",), True],
}


def test_every_hostile_value_lands_as_the_reference_puts_it():
    rng = random.Random(3)

    def build(tracer):
        for i in range(300):
            attrs = {key: rng.choice(values) for key, values in HOSTILE.items()
                     if rng.random() < 0.7}
            attrs["plain"] = rng.choice([1, "x", (1.5, 2.5), ("a",), True])
            with tracer.start_as_current_span(f"s{i}", kind=SpanKind.CLIENT) as span:
                span.set_attributes(attrs)
                if i % 7 == 0:
                    span.add_event("e", {"k": (1, 2)})
                if i % 11 == 0:
                    span.set_status(Status(StatusCode.ERROR, "boom"))
                child = tracer.start_span("child", links=[Link(span.get_span_context(),
                                                               {"w": 1})])
                child.end()
    spans = finished_spans(build)
    made = spans_to_tables(spans)
    assert made.bad == []
    assert_same_tables(made.tables, reference_tables(spans))


def test_uniform_batches_take_the_fast_path_and_keep_exact_values():
    ids = tuple(range(150_000 - 200, 150_000))

    def build(tracer):
        for i in range(64):
            span = tracer.start_span("chat m", attributes={
                sc.PROMPT_TOKEN_IDS: ids, sc.COMPLETION_TOKEN_IDS: ids[:5],
                sc.COMPLETION_LOGPROBS: (-0.1 * i, -2.0), sc.TURN_INDEX: i,
                sc.EPISODE_ID: f"ep{i}", sc.REWARD_VALUE: 0.5, "x": "y"})
            span.end()
    spans = finished_spans(build)
    made = spans_to_tables(spans)
    assert_same_tables(made.tables, reference_tables(spans))
    (table,) = made.tables.values()
    assert table["prompt_token_ids"][5].as_py() == list(ids)
    assert table["completion_logprobs"][3].as_py() == [-0.1 * 3, -2.0]
    assert json.loads(table["attributes"][0].as_py()) == {"x": "y"}


def test_partitions_follow_the_span_start_day_and_each_resource_service():
    spans = []
    for service in ("a", "b/../c", None):
        res = Resource.create({"service.name": service} if service else {})
        spans += finished_spans(lambda t: [t.start_span("x", start_time=d * DAY + 5)
                                      .end(end_time=d * DAY + 9) for d in (0, 1, 20_000)], res)
    made = spans_to_tables(spans)
    assert made.bad == []
    assert_same_tables(made.tables, reference_tables(spans))
    assert "date=2024-10-04/service=b_.._c" in made.tables
    assert "date=1970-01-02/service=a" in made.tables


def test_spans_no_row_can_hold_are_returned_with_the_reference_reason():
    spans = finished_spans(lambda t: [t.start_span(n).end()
                                      for n in ("ok", "noname", "late", "\ud800")])
    spans[1]._name = None
    spans[2]._end_time = 2**64
    made = spans_to_tables(spans)
    why = {s.name if isinstance(s.name, str) else None: reason for s, reason in made.bad}
    assert why[None] == "ValueError: span name must be a string, got NoneType"
    assert "end time 18446744073709551616 is not an int64" in why["late"]
    assert "surrogates not allowed" in why["\ud800"]  # no column can hold it: quarantined
    (table,) = made.tables.values()
    assert table["name"].to_pylist() == ["ok"]


def test_no_pandas_import_on_the_export_path(tmp_path):
    code = f"""
import sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from agl_bridge.otel.parquet_exporter import ParquetSpanExporter
from agl_bridge import semconv as sc
exporter = ParquetSpanExporter({str(tmp_path)!r})
p = TracerProvider(); p.add_span_processor(SimpleSpanProcessor(exporter))
t = p.get_tracer("x")
for i in range(3):
    t.start_span("chat", attributes={{sc.PROMPT_TOKEN_IDS: (1, 2), sc.EPISODE_ID: "e",
                                       sc.COMPLETION_LOGPROBS: (-0.5,)}}).end()
p.shutdown()
print("pandas" in sys.modules, exporter.spans_written)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "3"]


GOOD = {sc.PROMPT_TOKEN_IDS: (5, 6), sc.COMPLETION_LOGPROBS: (-0.5,), sc.TURN_INDEX: 2,
        sc.REWARD_VALUE: 0.5, sc.EPISODE_ID: "ep"}


@pytest.mark.parametrize("via", ["set_attribute", "set_number_lists"])
@pytest.mark.parametrize("key,value", [(k, v) for k, vs in HOSTILE.items() for v in vs])
def test_one_odd_value_among_good_ones_lands_as_the_reference_puts_it(key, value, via):
    """The fast checks are per column: one value that does not fit must be caught there,
    whether it was stored by the SDK or by capture's checked path (IntList, FloatList)."""
    def build(tracer):
        for i in range(4):
            span = tracer.start_span("s", attributes=GOOD)
            if i == 2 and via == "set_number_lists" and isinstance(value, (list, tuple)):
                set_number_lists(span, {key: list(value)})
            elif i == 2:
                span.set_attribute(key, value)
            span.end()
    spans = finished_spans(build)
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


@pytest.mark.parametrize("n", [1, 513])
def test_batch_sizes(n):
    spans = finished_spans(lambda t: [t.start_span("s", attributes={sc.TURN_INDEX: i % 3 or None})
                                 .end() for i in range(n)])
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


def test_numbers_read_back_from_buffers_longer_than_their_values():
    """``pa.nulls`` gives an empty list column's values a buffer of odd length; readers that take
    numbers straight from Arrow buffers (``trainer.arrow.to_numpy``) must read only the values."""
    from agl_bridge.trainer.arrow import to_numpy

    spans = finished_spans(lambda t: t.start_span("s", attributes={sc.EPISODE_ID: "e"}).end())
    (table,) = spans_to_tables(spans).tables.values()
    values = table["completion_logprobs"].combine_chunks().values
    assert to_numpy(values).tolist() == []
    padded = pa.Array.from_buffers(pa.float64(), 2, [None, pa.py_buffer(b"\0" * 8 * 2 + b"xyz")])
    assert to_numpy(padded).tolist() == [0.0, 0.0]
