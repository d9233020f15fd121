"""OTLP helpers several test folders share: SDK spans from a private provider, a team's spans
with every awkward value, the rows the in-process exporter writes for them, OTLP/JSON as the
Collector's file exporter writes it, and reading what a receiver wrote."""

import base64
import json
import queue
import socket
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from agl_bridge import semconv as sc
from agl_bridge.otel.parquet_writer import QUARANTINE_DIR
from agl_bridge.otel.rows import rows_to_table, span_to_row
from agl_bridge.parquet_io import iter_parquet_files

EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def make_spans(build, service="team-test"):
    """Finished SDK spans from a private provider (the global one belongs to conftest)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("agents", "1.2"))
    return list(memory.get_finished_spans())


def agent_team(tracer):
    """Every kind of value the training path cares about, plus the awkward ones."""
    with tracer.start_as_current_span("agl_bridge.episode", attributes={
            sc.EPISODE_ID: "e1", sc.TASK_ID: "add-17"}) as episode:
        with tracer.start_as_current_span("invoke_agent solver", attributes={
                sc.GEN_AI_AGENT_NAME: "solver", sc.AGENT_ROLE: "math", sc.TURN_INDEX: 0}):
            with tracer.start_as_current_span("chat tiny", kind=SpanKind.CLIENT, attributes={
                    sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "tiny",
                    sc.POLICY_VERSION: "team@v2", sc.TURN_INDEX: 1, sc.CANDIDATE_INDEX: 2,
                    sc.PROMPT_TOKEN_IDS: [1, 2, 3, 50_000], sc.COMPLETION_TOKEN_IDS: [7, 0],
                    sc.COMPLETION_LOGPROBS: [-0.5, -0.123456789012345],
                    sc.GEN_AI_REQUEST_TEMPERATURE: 0.7, sc.GEN_AI_USAGE_INPUT_TOKENS: 4,
                    sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
                    "app.float_looking_int": 7.0, "app.flag": False, "app.big": 2**62,
                    "app.with_none": [1, None], "app.empty": [], "app.text": "é ✓",
            }) as chat:
                chat.add_event("retry", {"attempt": 2, "why": "timeout"})
                chat.add_event("bare")
                chat.set_status(Status(StatusCode.ERROR, "upstream 503"))
        tracer.start_span("agl_bridge.reward", attributes={
            sc.REWARD_VALUE: 1, sc.REWARD_KIND: "task", sc.REWARD_SCOPE: "episode"},
            links=[Link(episode.get_span_context(), {"app.why": "scores"})]).end()
        # promoted attributes that do not fit their column stay in the JSON
        tracer.start_span("odd", attributes={sc.TURN_INDEX: "3", sc.PROMPT_TOKEN_IDS: [1, 2**40],
                                             sc.REWARD_VALUE: "high"}).end()
    for kind in (SpanKind.SERVER, SpanKind.PRODUCER, SpanKind.CONSUMER):
        span = tracer.start_span(f"k {kind.name}", kind=kind)
        span.set_status(Status(StatusCode.OK))
        span.end()


def expected_rows(spans):
    """What the in-process exporter writes for these spans, read back as Arrow gives it."""
    return rows_to_table([span_to_row(s) for s in spans]).to_pylist()


def read_rows(directory):
    rows = []
    for f in iter_parquet_files(directory):
        rows.extend(pq.ParquetFile(f).read().to_pylist())
    return rows


def by_span(rows):
    return sorted(rows, key=lambda r: (r["span_id"], r["trace_id"]))


def read_quarantine(directory):
    return [json.loads(line) for f in sorted((Path(directory) / QUARANTINE_DIR).glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def otlp_json(spans):
    """OTLP/JSON as the Collector's file exporter writes it: hex ids, enums as ints."""
    obj = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in obj["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for holder in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()
    return obj


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_until(proc, marker, timeout=30.0):
    """stdout of ``proc`` up to the line holding ``marker`` (fails, not hangs, if it never comes).

    Lines are read on a thread: ``select`` on a buffered pipe misses lines already buffered.
    """
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    text, deadline = "", time.monotonic() + timeout
    while marker not in text:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            line = ""
        if not line:
            proc.kill()
            pytest.fail(f"no {marker!r} from the receiver; stdout {text!r}, "
                        f"stderr {proc.stderr.read()!r}")
        text += line
        if marker not in text:
            threading.Thread(target=lambda: lines.put(proc.stdout.readline()),
                             daemon=True).start()
    return text
