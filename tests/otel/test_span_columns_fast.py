"""The batch-wide fast paths of ``otel.span_columns`` (checks over whole columns, one partition
per batch, ids hexed in one call, enum names looked up, the C JSON encoder called directly)
and their fall-backs, each against the reference (``rows.span_to_row`` + ``rows_to_table``)."""

import enum

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from agl_bridge import semconv as sc
from agl_bridge.otel.span_columns import spans_to_tables
from tests.otel.span_columns_reference import (
    DAY,
    assert_same_tables,
    finished_spans,
    reference_tables,
)


def _spans(n=6, **attrs):
    return finished_spans(lambda t: [t.start_span(f"s{i}", attributes={"i": i, **attrs}).end()
                                for i in range(n)])


def _ctx(trace_id, span_id):
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))


@pytest.mark.parametrize("trace_id,span_id", [
    (2**128 - 1, 2**64 - 1), (1, 1), (2**64, 2**63), (True, 5)])
def test_ids_at_the_edges_of_their_width(trace_id, span_id):
    spans = _spans()
    spans[2]._context = _ctx(trace_id, span_id)
    spans[3]._parent = _ctx(trace_id, span_id)
    spans[4]._parent = _ctx(7, 0)  # a parent span id of 0 is written as it is
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


@pytest.mark.parametrize("parent_id", [-1, 2**64, 1.5])
def test_parent_ids_no_fixed_width_can_hold_take_the_reference_path(parent_id):
    spans = _spans()
    spans[1]._parent = _ctx(3, parent_id)
    try:
        want = reference_tables(spans)
    except ValueError:  # the reference cannot format it: the span is quarantined
        made = spans_to_tables(spans)
        assert [s for s, _ in made.bad] == [spans[1]]
        return
    assert_same_tables(spans_to_tables(spans).tables, want)


def test_start_of_zero_goes_where_now_puts_it():
    spans = finished_spans(lambda t: [t.start_span("x", start_time=s).end(end_time=s + 9)
                                 for s in (5, 0, 7)])
    made = spans_to_tables(spans)
    assert len(made.tables) == 2
    assert_same_tables(made.tables, reference_tables(spans))


def test_spans_without_start_or_end_times():
    spans = _spans()
    spans[1]._start_time = None
    spans[2]._end_time = None
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


def test_one_batch_over_two_days_and_two_resource_objects_with_one_service():
    spans = finished_spans(lambda t: [t.start_span("x", start_time=d * DAY + 1).end(
        end_time=d * DAY + 2) for d in (3, 3, 4)])
    spans += finished_spans(lambda t: t.start_span("y", start_time=3 * DAY + 4).end(),
                       Resource.create({"service.name": "team"}))
    made = spans_to_tables(spans)
    assert len(made.tables) == 2
    assert_same_tables(made.tables, reference_tables(spans))


def test_a_bool_start_time_is_checked_span_by_span():
    spans = _spans()
    spans[0]._start_time = True
    made = spans_to_tables(spans)
    assert [s for s, _ in made.bad] == [spans[0]]
    assert_same_tables(made.tables, reference_tables(spans[1:]))


class OddKind(enum.Enum):
    CLIENT = 3  # the name of a SpanKind member, another enum


def test_kinds_and_status_codes_not_from_the_sdk_are_named_as_they_are():
    spans = _spans()
    spans[1]._kind = OddKind.CLIENT
    spans[2]._kind = SpanKind.SERVER
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


@pytest.mark.parametrize("value", [
    "épisode ✓", "\u2028", 2**70, -(2**64), float("nan"), float("-inf"), 1e308, -0.0,
    ("a", "é"), (2**70, 1), (True, False), (), "", 'quote " and \\ back'])
def test_attribute_json_of_odd_values(value):
    spans = _spans(odd=value, **{sc.EPISODE_ID: "ep"})
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


def test_a_promoted_key_given_as_none_stays_in_the_json():
    spans = _spans(**{sc.EPISODE_ID: "ep", sc.TURN_INDEX: 2})
    spans[1]._attributes._dict[sc.EPISODE_ID] = None
    spans[2]._attributes._dict[sc.TURN_INDEX] = None
    made = spans_to_tables(spans)
    assert_same_tables(made.tables, reference_tables(spans))
    (table,) = made.tables.values()
    assert '"agl_bridge.episode.id":null' in table["attributes"][1].as_py()


def test_resource_json_of_odd_values():
    res = Resource.create({"service.name": "tëam", "n": 2**70, "f": float("nan"),
                           "l": ("x", "ÿ")})
    spans = finished_spans(lambda t: [t.start_span("x").end() for _ in range(3)], res)
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


def test_a_usual_batch_takes_no_span_by_span_path(monkeypatch):
    from agl_bridge.otel import span_columns

    spans = _spans(**{sc.EPISODE_ID: "ep", sc.PROMPT_TOKEN_IDS: (1, 2), sc.TURN_INDEX: 1})
    spans[3]._parent = _ctx(9, 9)
    want = reference_tables(spans)
    for name in ("_groups", "_reference", "_invalid"):
        monkeypatch.setattr(span_columns, name, lambda *a, n=name: pytest.fail(f"{n} called"))
    assert_same_tables(spans_to_tables(spans).tables, want)


@pytest.mark.parametrize("value", ["", "é✓", "team@v3", None])
def test_a_column_of_one_repeated_value(value):
    spans = _spans(**({sc.EPISODE_ID: value, sc.AGENT_ROLE: value} if value is not None else {}))
    for s in spans:
        s._status = s._status.__class__(s._status.status_code, value)
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))


def test_one_repeated_value_no_column_can_hold_is_quarantined():
    spans = _spans(**{sc.EPISODE_ID: "\ud800"})
    made = spans_to_tables(spans)
    assert len(made.bad) == len(spans) and "surrogates not allowed" in made.bad[0][1]


def test_one_resource_object_and_equal_resource_objects():
    res = Resource.create({"service.name": "team", "k": "v"})
    spans = finished_spans(lambda t: [t.start_span("x").end() for _ in range(3)], res)
    spans += finished_spans(lambda t: [t.start_span("y").end() for _ in range(2)],
                       Resource.create({"service.name": "team", "k": "v"}))
    assert_same_tables(spans_to_tables(spans).tables, reference_tables(spans))
