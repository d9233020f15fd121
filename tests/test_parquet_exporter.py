import json
import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from agl_bridge import semconv as sc
from agl_bridge.otel import ParquetSpanExporter
from agl_bridge.parquet_io import TMP_PREFIX
from agl_bridge.schema import SPAN_SCHEMA


@pytest.fixture
def make_spans():
    """Finished ReadableSpans from a private provider (the global one belongs to conftest)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def make(build):
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        build(provider.get_tracer("test"))
        return list(memory.get_finished_spans())
    return make


def test_rows_roundtrip_with_typed_token_ids_and_lossless_attributes(tmp_path, make_spans):
    def build(tracer):
        with tracer.start_as_current_span("agl_bridge.episode"):
            with tracer.start_as_current_span("chat m", attributes={
                sc.EPISODE_ID: "e1", sc.TURN_INDEX: 3, sc.GEN_AI_OPERATION_NAME: "chat",
                sc.PROMPT_TOKEN_IDS: [1, 2, 3], sc.COMPLETION_TOKEN_IDS: [4, 5],
                sc.COMPLETION_LOGPROBS: [-0.1, -0.123456789012345],
                "custom.int": 7, "custom.float": 7.0, "custom.bool": False,
                "custom.list": ["a", "b"], "custom.floats": [0.5, 1.5],
            }) as span:
                span.add_event("retry", {"attempt": 2})

    exporter = ParquetSpanExporter(tmp_path)
    assert exporter.export(make_spans(build)) == SpanExportResult.SUCCESS
    (path,) = list(tmp_path.glob("*.parquet"))
    table = pq.read_table(path)
    assert table.schema.equals(SPAN_SCHEMA, check_metadata=False)
    assert table.schema.field("prompt_token_ids").type == pa.list_(pa.int32())
    rows = {r["name"]: r for r in table.to_pylist()}
    chat, episode = rows["chat m"], rows["agl_bridge.episode"]
    assert chat["parent_span_id"] == episode["span_id"] and episode["parent_span_id"] is None
    assert chat["trace_id"] == episode["trace_id"] and len(chat["trace_id"]) == 32
    assert (chat["episode_id"], chat["turn_index"], chat["operation_name"]) == ("e1", 3, "chat")
    assert chat["prompt_token_ids"] == [1, 2, 3] and chat["completion_token_ids"] == [4, 5]
    assert chat["completion_logprobs"] == [-0.1, -0.123456789012345]  # float64: exact
    attrs = json.loads(chat["attributes"])
    assert attrs == {"custom.int": 7, "custom.float": 7.0, "custom.bool": False,
                     "custom.list": ["a", "b"], "custom.floats": [0.5, 1.5]}
    assert type(attrs["custom.int"]) is int and type(attrs["custom.float"]) is float
    assert json.loads(chat["events"])[0]["attributes"] == {"attempt": 2}
    assert chat["end_time_unix_nano"] >= chat["start_time_unix_nano"] > 0


def test_promoted_attribute_with_wrong_type_stays_in_json(tmp_path, make_spans):
    spans = make_spans(lambda t: t.start_span("x", attributes={
        sc.TURN_INDEX: "3", sc.PROMPT_TOKEN_IDS: [1, 2**40]}).end())
    ParquetSpanExporter(tmp_path).export(spans)
    (row,) = pq.read_table(tmp_path).to_pylist()
    assert row["turn_index"] is None and row["prompt_token_ids"] is None
    assert json.loads(row["attributes"]) == {sc.TURN_INDEX: "3", sc.PROMPT_TOKEN_IDS: [1, 2**40]}


def test_files_are_owner_only_and_no_temporaries_remain(tmp_path, make_spans):
    exporter = ParquetSpanExporter(tmp_path)
    for _ in range(3):
        exporter.export(make_spans(lambda t: t.start_span("x").end()))
    files = sorted(tmp_path.iterdir())
    assert len(files) == 3 and not any(f.name.startswith(TMP_PREFIX) for f in files)
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
    assert exporter.files_written == 3 and exporter.spans_written == 3


def test_failed_write_leaves_no_file_at_all(tmp_path, make_spans, monkeypatch):
    def broken(table, where, **kw):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    exporter = ParquetSpanExporter(tmp_path)
    result = exporter.export(make_spans(lambda t: t.start_span("x").end()))
    assert result == SpanExportResult.FAILURE
    assert list(tmp_path.iterdir()) == []


def test_malformed_span_is_quarantined_and_the_batch_survives(tmp_path, make_spans):
    good = make_spans(lambda t: (t.start_span("good").end(), t.start_span("bad").end()))
    bad = good[1]
    bad._name = None  # a span whose row cannot be built: name is required
    exporter = ParquetSpanExporter(tmp_path)
    assert exporter.export(good) == SpanExportResult.SUCCESS
    assert [r["name"] for r in pq.read_table(tmp_path / next(
        p.name for p in tmp_path.glob("*.parquet"))).to_pylist()] == ["good"]
    (qfile,) = list((tmp_path / "_quarantine").glob("*.jsonl"))
    record = json.loads(qfile.read_text())
    assert record["error"] == "ValueError: span name must be a string, got NoneType"
    assert exporter.spans_quarantined == 1 and exporter.spans_written == 1
