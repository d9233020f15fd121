import json
import os
import signal
import stat
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from agl_bridge import semconv as sc
from agl_bridge.otel import ParquetSpanExporter, SpanParquetWriter, span_to_row
from agl_bridge.parquet_io import TMP_PREFIX, iter_parquet_files
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
    exporter.shutdown()
    table, _ = read_all(tmp_path)
    assert table.schema.equals(SPAN_SCHEMA, check_metadata=False)
    # ids never null inside the list: one Parquet level fewer per id
    assert table.schema.field("prompt_token_ids").type == pa.list_(
        pa.field("element", pa.int32(), nullable=False))
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
    # encodings (parquet_io.writer_options): ids and logprobs byte-stream-split, strings
    # dictionary-encoded, no statistics on lists
    path = next(iter_parquet_files(tmp_path))
    meta = pq.ParquetFile(path).metadata.row_group(0)
    cols = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    for name in ("prompt_token_ids", "completion_token_ids", "completion_logprobs"):
        col = cols[f"{name}.list.element"]
        assert "BYTE_STREAM_SPLIT" in col.encodings and col.compression == "ZSTD", name
        assert not col.is_stats_set, name
    assert "RLE_DICTIONARY" in cols["episode_id"].encodings
    assert cols["turn_index"].is_stats_set


def test_promoted_attribute_with_wrong_type_stays_in_json(tmp_path, make_spans):
    spans = make_spans(lambda t: t.start_span("x", attributes={
        sc.TURN_INDEX: "3", sc.PROMPT_TOKEN_IDS: [1, 2**40]}).end())
    exporter = ParquetSpanExporter(tmp_path)
    exporter.export(spans)
    exporter.shutdown()
    (row,) = read_all(tmp_path)[0].to_pylist()
    assert row["turn_index"] is None and row["prompt_token_ids"] is None
    assert json.loads(row["attributes"]) == {sc.TURN_INDEX: "3", sc.PROMPT_TOKEN_IDS: [1, 2**40]}


def read_all(directory):
    files = list(iter_parquet_files(directory))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None, files


def test_batches_share_a_partitioned_owner_only_file_and_no_temporaries_remain(
        tmp_path, make_spans):
    exporter = ParquetSpanExporter(tmp_path)
    for _ in range(3):
        exporter.export(make_spans(lambda t: t.start_span("x").end()))
    assert list(iter_parquet_files(tmp_path)) == []  # durable in the log, not yet a file
    exporter.shutdown()
    table, files = read_all(tmp_path)
    assert len(files) == 1 and table.num_rows == 3
    rel = files[0].relative_to(tmp_path).parts
    assert rel[0].startswith("date=20") and rel[1] == "service=unknown_service_python"
    assert stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    assert not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.rglob("*"))
    assert list((tmp_path / "_wal").iterdir()) == []
    assert exporter.spans_written == 3


def test_files_rotate_by_rows_and_by_age(tmp_path, make_spans):
    writer_dir = tmp_path / "rows"
    exporter = ParquetSpanExporter(writer_dir, max_file_rows=4, background_rotation=False)
    for _ in range(5):
        exporter.export(make_spans(lambda t: [t.start_span("x").end() for _ in range(2)]))
    assert sorted(pq.read_table(f).num_rows for f in iter_parquet_files(writer_dir)) == [4, 4]
    exporter.shutdown()
    assert sorted(pq.read_table(f).num_rows for f in iter_parquet_files(writer_dir)) == [2, 4, 4]

    aged = ParquetSpanExporter(tmp_path / "age", max_file_age_s=0.2)
    aged.export(make_spans(lambda t: t.start_span("x").end()))
    deadline = time.monotonic() + 10
    while not list(iter_parquet_files(tmp_path / "age")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(iter_parquet_files(tmp_path / "age"))) == 1  # visible with no flush
    aged.shutdown()


def test_hive_partitions_read_back_with_pyarrow_dataset(tmp_path, make_spans):
    import pyarrow.dataset as ds

    exporter = ParquetSpanExporter(tmp_path)
    exporter.export(make_spans(lambda t: t.start_span("x").end()))
    exporter.shutdown()
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 1 and table["service"].to_pylist() == ["unknown_service_python"]


def test_failed_rotation_keeps_the_log_for_recovery(tmp_path, make_spans, monkeypatch):
    exporter = ParquetSpanExporter(tmp_path, background_rotation=False)
    exporter.export(make_spans(lambda t: t.start_span("x").end()))

    def broken(self, table, row_group_size=None):  # the rotation writes row group by group
        raise OSError("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        exporter.force_flush()
    monkeypatch.undo()
    assert list(iter_parquet_files(tmp_path)) == []  # nothing half-written is visible
    assert not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.rglob("*"))
    (_log,) = list((tmp_path / "_wal").iterdir())
    assert SpanParquetWriter.recover(tmp_path, include_live=True) == 1
    assert read_all(tmp_path)[0].num_rows == 1


PRODUCER = """
import sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from agl_bridge.otel import ParquetSpanExporter
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(sys.argv[1])))
tracer = provider.get_tracer("crash")
i = 0
while True:
    tracer.start_span(f"span-{i}").end()   # SimpleSpanProcessor: exported (durable) on end
    print(i, flush=True)
    i += 1
    time.sleep(0.002)
"""


def test_kill_9_loses_at_most_the_batch_being_written(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    acknowledged = -1
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 200:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(iter_parquet_files(tmp_path)) == []  # the dead producer never finished a file
    recovered = SpanParquetWriter.recover(tmp_path)
    names = set(read_all(tmp_path)[0]["name"].to_pylist())
    assert {f"span-{i}" for i in range(acknowledged + 1)} <= names  # every acknowledged span
    assert recovered == len(names) and list((tmp_path / "_wal").iterdir()) == []


def test_a_log_cut_mid_batch_yields_the_batches_before_the_cut(tmp_path, make_spans):
    writer = SpanParquetWriter(tmp_path / "src", background_rotation=False)
    writer.write_rows([span_to_row(s) for s in make_spans(
        lambda t: [t.start_span(f"a{i}").end() for i in range(3)])])
    writer.write_rows([span_to_row(s) for s in make_spans(lambda t: t.start_span("b").end())])
    (log,) = list((tmp_path / "src" / "_wal").iterdir())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "dst" / "_wal").mkdir(parents=True)
    data = log.read_bytes()
    (tmp_path / "dst" / "_wal" / f"{dead}-cut.arrows").write_bytes(data[: len(data) - 40])
    assert SpanParquetWriter.recover(tmp_path / "dst") == 3
    assert sorted(read_all(tmp_path / "dst")[0]["name"].to_pylist()) == ["a0", "a1", "a2"]
    writer.close()


def test_malformed_span_is_quarantined_and_the_batch_survives(tmp_path, make_spans):
    good = make_spans(lambda t: (t.start_span("good").end(), t.start_span("bad").end()))
    good[1]._name = None  # a span whose row cannot be built: name is required
    exporter = ParquetSpanExporter(tmp_path)
    assert exporter.export(good) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert read_all(tmp_path)[0]["name"].to_pylist() == ["good"]
    (qfile,) = list((tmp_path / "_quarantine").glob("*.jsonl"))
    assert stat.S_IMODE(os.stat(qfile).st_mode) == 0o600
    record = json.loads(qfile.read_text())
    assert record["error"] == "ValueError: span name must be a string, got NoneType"
    assert exporter.spans_quarantined == 1 and exporter.spans_written == 1


def test_values_arrow_would_refuse_stay_lossless_instead_of_failing_the_batch(tmp_path):
    from agl_bridge.otel.rows import build_row, rows_to_table

    base = dict(trace_id="1" * 32, span_id="2" * 16, parent_span_id=None, name="s",
                kind="INTERNAL", start_time_unix_nano=1, end_time_unix_nano=2,
                status_code="UNSET", status_message=None)
    row = build_row(**base, attributes={sc.REWARD_VALUE: 2**60, sc.COMPLETION_LOGPROBS: [2**60]},
                    resource={"service.name": 7})
    table = rows_to_table([row])  # would raise if a value did not fit its column
    (got,) = table.to_pylist()
    assert got["reward_value"] is None and got["completion_logprobs"] is None
    assert json.loads(got["attributes"]) == {sc.REWARD_VALUE: 2**60,
                                             sc.COMPLETION_LOGPROBS: [2**60]}
    assert got["service_name"] is None and json.loads(got["resource"]) == {"service.name": 7}
    with pytest.raises(ValueError, match="end time 18446744073709551616 is not an int64"):
        build_row(**{**base, "end_time_unix_nano": 2**64}, attributes={})


def test_pandas_and_duckdb_read_the_partitioned_dataset_unaided(tmp_path, make_spans):
    import duckdb
    import pandas as pd

    exporter = ParquetSpanExporter(tmp_path, max_file_rows=2)
    exporter.export(make_spans(lambda t: [t.start_span(f"s{i}", attributes={
        sc.TURN_INDEX: i, sc.PROMPT_TOKEN_IDS: [i, i + 1]}).end() for i in range(5)]))
    exporter.shutdown()
    frame = pd.read_parquet(tmp_path)  # pyarrow engine, hive partitions discovered
    assert sorted(frame["name"]) == [f"s{i}" for i in range(5)]
    assert set(frame["service"].astype(str)) == {"unknown_service_python"}
    assert list(frame.sort_values("name")["prompt_token_ids"].iloc[4]) == [4, 5]
    rows = duckdb.sql(
        f"SELECT name, turn_index, prompt_token_ids[2] AS second, date, service "
        f"FROM read_parquet('{tmp_path}/*/*/*.parquet', hive_partitioning = true) "
        f"ORDER BY turn_index").fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(f"s{i}", i, i + 1) for i in range(5)]
    assert {r[4] for r in rows} == {"unknown_service_python"}
