"""OTLP value mapping (``otel/otlp.py``), ``agl-bridge import`` of Collector files, ``recover``."""

import base64
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from agl_bridge import semconv as sc
from agl_bridge.otel import SpanParquetWriter, otlp
from agl_bridge.otel.collector_files import import_otlp_json
from agl_bridge.otel.rows import rows_to_table, span_to_row
from tests.otlp_helpers import (
    agent_team,
    by_span,
    expected_rows,
    make_spans,
    otlp_json,
    read_quarantine,
    read_rows,
)

TRACE, SPAN = bytes(range(1, 17)), bytes(range(1, 9))


def agl(*args):
    exe = Path(sys.executable).with_name("agl-bridge")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=60)


def one_span_request(**fields):
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    ss = rs.scope_spans.add()
    ss.scope.name = "scope"
    ss.spans.add(**{"trace_id": TRACE, "span_id": SPAN, "name": "s", **fields})
    return request


# -- value mapping -----------------------------------------------------------------------------
def test_any_values_map_to_json_able_python_values():
    kv = KeyValueList(values=[KeyValue(key="a", value=AnyValue(int_value=1)),
                              KeyValue(key="b", value=AnyValue(string_value="x"))])
    cases = [
        (AnyValue(string_value="s"), "s"), (AnyValue(bool_value=True), True),
        (AnyValue(int_value=-(2**63)), -(2**63)), (AnyValue(double_value=2.0), 2.0),
        (AnyValue(), None), (AnyValue(array_value=ArrayValue()), []),
        (AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=3), AnyValue()])), [3, None]),
        (AnyValue(array_value=ArrayValue(values=[AnyValue(array_value=ArrayValue(
            values=[AnyValue(double_value=0.5)]))])), [[0.5]]),
        (AnyValue(kvlist_value=kv), {"a": 1, "b": "x"}),
        (AnyValue(bytes_value=b"\x00\xff"), base64.b64encode(b"\x00\xff").decode()),
    ]
    for value, want in cases:
        got = otlp.any_value(value)
        assert got == want and type(got) is type(want), value
    assert type(otlp.any_value(AnyValue(double_value=2.0))) is float  # never an int


def test_span_fields_map_to_the_sdk_names():
    for kind, name in [(0, "INTERNAL"), (1, "INTERNAL"), (2, "SERVER"), (3, "CLIENT"),
                       (4, "PRODUCER"), (5, "CONSUMER")]:
        (row,) = otlp.request_to_rows(one_span_request(kind=kind)).rows
        assert row["kind"] == name
    for code, name in [(0, "UNSET"), (1, "OK"), (2, "ERROR")]:
        (row,) = otlp.request_to_rows(one_span_request(status={"code": code})).rows
        assert row["status_code"] == name
    (row,) = otlp.request_to_rows(one_span_request(parent_span_id=b"\0" * 8)).rows
    assert row["parent_span_id"] is None and row["start_time_unix_nano"] is None
    (row,) = otlp.request_to_rows(one_span_request(
        parent_span_id=bytes.fromhex("00000000000000AB"), start_time_unix_nano=5)).rows
    assert (row["parent_span_id"], row["trace_id"]) == ("00000000000000ab", TRACE.hex())
    assert (row["service_name"], row["scope_name"], row["start_time_unix_nano"]) == \
        ("svc", "scope", 5)
    assert json.loads(row["resource"]) == {"service.name": "svc"}


@pytest.mark.parametrize("fields, why", [
    ({"trace_id": TRACE[:8]}, "invalid trace id"),
    ({"span_id": b""}, "invalid span id"),
    ({"trace_id": b"\0" * 16}, "invalid trace id"),
    ({"parent_span_id": b"\1\2\3\4"}, "invalid parent span id"),
    ({"name": ""}, "has no name"),
    ({"start_time_unix_nano": 2**64 - 1}, "does not fit int64"),
])
def test_spans_no_row_can_hold_are_rejected_with_a_reason(fields, why):
    request = one_span_request(**fields)
    request.resource_spans[0].scope_spans[0].spans.add(trace_id=TRACE, span_id=SPAN, name="ok")
    out = otlp.request_to_rows(request)
    assert [r["name"] for r in out.rows] == ["ok"]
    (record,) = out.rejected
    assert why in record["error"] and why in out.error_message
    assert record["resource"] == {"attributes": [{"key": "service.name",
                                                  "value": {"stringValue": "svc"}}]}
    assert record["scope"] == {"name": "scope"}
    assert out.response().partial_success.rejected_spans == 1


def test_values_no_column_can_hold_are_kept_in_json_not_rejected():
    request = one_span_request(attributes=[
        KeyValue(key=sc.REWARD_VALUE, value=AnyValue(int_value=2**60))])
    request.resource_spans[0].resource.attributes[0].value.int_value = 5
    out = otlp.request_to_rows(request)
    assert out.rejected == []
    (row,) = out.rows
    rows_to_table(out.rows)  # Arrow accepts the batch
    assert row["service_name"] is None and json.loads(row["resource"])["service.name"] == 5
    assert row["reward_value"] is None
    assert json.loads(row["attributes"])[sc.REWARD_VALUE] == 2**60


def test_otlp_json_quirks_hex_ids_int_enums_and_string_int64s():
    spans = make_spans(agent_team)
    obj = otlp_json(spans)
    chat = next(s for s in obj["resourceSpans"][0]["scopeSpans"][0]["spans"]
                if s["name"] == "chat tiny")
    assert isinstance(chat["kind"], int) and isinstance(chat["startTimeUnixNano"], str)
    chat["traceId"] = chat["traceId"].upper()  # hex is case-insensitive
    chat["unknownField"] = {"ignored": True}  # OTLP/JSON receivers ignore unknown fields
    out = otlp.json_to_rows(obj)
    assert out.rejected == []
    assert by_span(otlp.request_to_rows(encode_spans(spans)).rows) == by_span(out.rows)
    assert by_span(out.rows) == by_span([span_to_row(s) for s in spans])

    # files from Collectors older than InstrumentationScope
    for rs in obj["resourceSpans"]:
        rs["instrumentationLibrarySpans"] = rs.pop("scopeSpans")
        for ss in rs["instrumentationLibrarySpans"]:
            ss["instrumentationLibrary"] = ss.pop("scope")
    assert by_span(otlp.json_to_rows(obj).rows) == by_span(out.rows)


def test_a_json_span_with_unparsable_ids_is_rejected_alone():
    obj = otlp_json(make_spans(lambda t: (t.start_span("a").end(), t.start_span("b").end())))
    obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "not hex!"
    out = otlp.json_to_rows(obj)
    assert [r["name"] for r in out.rows] == ["b"]
    assert out.rejected[0]["span"]["name"] == "a" and "not a hex string" in out.rejected[0]["error"]
    with pytest.raises(otlp.MalformedRequest):
        otlp.json_to_rows({"resourceSpans": [{"scopeSpans": {"spans": []}}]})


# -- agl-bridge import ------------------------------------------------------------------------
def collector_lines(spans, per_line):
    return [json.dumps(otlp_json(spans[i:i + per_line])) for i in range(0, len(spans), per_line)]


def test_import_cli_writes_the_same_rows_and_reports_bad_lines(tmp_path):
    first = make_spans(agent_team, service="team-a")
    second = make_spans(agent_team, service="team-b")
    src = tmp_path / "collector"
    src.mkdir()
    (src / "traces.jsonl").write_text("\n".join(collector_lines(first, 3)) + "\n\n")
    broken = collector_lines(second, 4)
    broken.insert(1, '{"resourceSpans": [{"scopeSpans": [{"spans": [')  # cut mid-write
    (src / "later.json.gz").write_bytes(gzip.compress("\n".join(broken).encode()))

    out = agl("import", src, "--out", tmp_path / "spans")
    assert out.returncode == 1, out.stderr  # 1: something was quarantined
    bad_line = f"{src / 'later.json.gz'}:2: not JSON: Expecting value: line 1 column 47 (char 46)"
    assert bad_line in out.stderr.splitlines() and "Traceback" not in out.stderr
    assert "imported 16 span(s) from 6 line(s) in 2 file(s); 1 bad line(s)" in out.stdout
    assert by_span(read_rows(tmp_path / "spans")) == by_span(expected_rows(first + second))
    (record,) = read_quarantine(tmp_path / "spans")
    assert record["source"] == f"{src / 'later.json.gz'}:2" and record["line"] == broken[1]

    # importing again from the same tree skips the output's own quarantine files
    again = agl("import", src, tmp_path / "spans", "--out", tmp_path / "spans")
    assert again.returncode == 2 and "agl-bridge import: error: no .json" in again.stderr


def test_import_quarantines_a_bad_span_inside_a_good_line(tmp_path):
    spans = make_spans(lambda t: (t.start_span("a").end(), t.start_span("b").end()))
    obj = otlp_json(spans)
    obj["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["traceId"] = "abcd"
    (tmp_path / "in.json").write_text(json.dumps(obj) + "\n")
    writer = SpanParquetWriter(tmp_path / "out", background_rotation=False)
    summary = import_otlp_json([tmp_path / "in.json"], writer)
    writer.close()
    assert (summary.spans_written, summary.spans_rejected, summary.lines_bad) == (1, 1, 0)
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["a"]
    (record,) = read_quarantine(tmp_path / "out")
    assert record["source"] == f"{tmp_path / 'in.json'}:1" and "invalid trace id" in record["error"]


def test_import_reports_names_it_cannot_read_instead_of_skipping_them(tmp_path):
    """Issue 14: a ``.json`` symlink loop was skipped without a word; now it is a bad entry."""
    src = tmp_path / "collector"
    src.mkdir()
    (src / "good.jsonl").write_text("\n".join(collector_lines(make_spans(agent_team), 8)) + "\n")
    (src / "loop-a.json").symlink_to("loop-b.json")
    (src / "loop-b.json").symlink_to("loop-a.json")
    (src / "dangling.jsonl").symlink_to("nowhere.jsonl")
    os.mkfifo(src / "pipe.json")  # opening it would block: reported, never opened
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to("..")  # a directory loop is not followed

    out = agl("import", src, "--out", tmp_path / "spans")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert sorted(line for line in out.stderr.splitlines() if line.startswith(str(src))) == [
        f"{src / 'dangling.jsonl'}:1: cannot read: a dangling symlink to nowhere.jsonl",
        f"{src / 'loop-a.json'}:1: cannot read: a symlink loop",
        f"{src / 'loop-b.json'}:1: cannot read: a symlink loop",
        f"{src / 'pipe.json'}:1: cannot read: not a regular file"]
    assert "imported 8 span(s) from 1 line(s) in 5 file(s); 4 bad line(s)" in out.stdout
    assert len(read_rows(tmp_path / "spans")) == 8
    assert sorted(r["source"] for r in read_quarantine(tmp_path / "spans")) == [
        f"{src / name}:1" for name in ("dangling.jsonl", "loop-a.json", "loop-b.json",
                                        "pipe.json")]

    given = agl("import", src / "loop-a.json", "--out", tmp_path / "again")
    assert given.returncode == 1
    assert f"{src / 'loop-a.json'}:1: cannot read: a symlink loop" in given.stderr.splitlines()


def test_import_cli_refuses_missing_inputs_in_one_line(tmp_path):
    out = agl("import", tmp_path / "nope.jsonl", "--out", tmp_path / "spans")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("agl-bridge import: error: no such file or directory")
    assert not (tmp_path / "spans").exists()


# -- agl-bridge recover ------------------------------------------------------------------------
def test_recover_cli_turns_a_dead_writers_log_into_parquet(tmp_path):
    spans = make_spans(lambda t: [t.start_span(f"s{i}").end() for i in range(3)])
    writer = SpanParquetWriter(tmp_path / "src", background_rotation=False)
    writer.write_rows([span_to_row(s) for s in spans])
    (log,) = (tmp_path / "src" / "_wal").iterdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "dst" / "_wal").mkdir(parents=True)
    (tmp_path / "dst" / "_wal" / f"{dead}-x.arrows").write_bytes(log.read_bytes())
    writer.close()

    out = agl("recover", tmp_path / "dst")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("recovered 3 row(s)")
    assert sorted(r["name"] for r in read_rows(tmp_path / "dst")) == ["s0", "s1", "s2"]
    assert agl("recover", tmp_path / "dst").stdout.startswith("recovered 0 row(s)")
    missing = agl("recover", tmp_path / "nope")
    assert missing.returncode == 2 and missing.stderr.startswith("agl-bridge recover: error:")
