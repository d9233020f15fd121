"""Prometheus metrics of ``agl-bridge collect`` and of our exporters' losses
(``otel/metrics.py``), scraped over HTTP as Prometheus would."""

import errno
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.parser import text_string_to_metric_families

from agl_bridge import semconv as sc
from agl_bridge.otel.metrics import ExportLossCollector, serve
from agl_bridge.otel.processors import BoundedBatchSpanProcessor
from tests.feedback_runs import clean_env
from tests.otlp_helpers import free_port, make_spans, read_until

EXE = Path(sys.executable).with_name("agl-bridge")


def scrape(url):
    """{(name, labels as a sorted tuple): value} of every sample at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def post(url, body):
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def log_records():
    """Two evaluation events and a plain log line, as an SDK exports them."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("evaluator")
    for score in (1.0, 0.0):
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT, attributes={
            sc.GEN_AI_EVALUATION_NAME: "helpful", sc.GEN_AI_EVALUATION_SCORE_VALUE: score,
            sc.GEN_AI_RESPONSE_ID: "chatcmpl-1"}))
    logger.emit(LogRecord(body="an application's log line"))
    return list(memory.get_finished_logs())


def test_collect_serves_what_it_received_wrote_quarantined_and_refused(tmp_path):
    http, grpc, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen([str(EXE), "collect", "--out", str(tmp_path / "out"), "--http-port",
                             str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    try:
        banner = read_until(proc, "SIGTERM")
        url = f"http://127.0.0.1:{metrics}/metrics"
        assert url in banner
        before = scrape(url)
        assert before[("agl_bridge_collect_spans_received_total", ())] == 0

        spans = make_spans(lambda t: [t.start_span(n).end() for n in ("a", "b", "short-id")])
        request = encode_spans(spans)
        bad = request.resource_spans[0].scope_spans[0].spans[2]
        bad.trace_id = bad.trace_id[:8]  # no row can hold it: quarantined
        traces = f"http://127.0.0.1:{http}/v1/traces"
        assert post(traces, request.SerializeToString()) == 200
        assert post(traces, b"not protobuf") == 400
        logs = f"http://127.0.0.1:{http}/v1/logs"
        assert post(logs, encode_logs(log_records()).SerializeToString()) == 200

        got = scrape(url)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
    finally:
        proc.kill()
    expected = {"spans_received": 3, "spans_written": 2, "spans_quarantined": 1,
                "log_records_received": 3, "log_records_written": 2,
                "log_records_quarantined": 0, "log_records_dropped": 1}
    assert {k: got[(f"agl_bridge_collect_{k}_total", ())] for k in expected} == expected
    requests = {dict(labels)["outcome"]: v for (name, labels), v in got.items()
                if name == "agl_bridge_collect_requests_total"}
    assert requests == {"accepted": 2, "malformed": 1, "unauthorized": 0, "too_large": 0,
                        "failed": 0}


class FullDisk(SpanExporter):
    def export(self, spans):
        raise OSError(errno.ENOSPC, "No space left on device")

    def shutdown(self):
        pass


def test_spans_an_exporter_refused_are_scraped_by_exporter_and_reason():
    """A full disk refuses every batch: the spans are counted where a long-running command
    serves its metrics, not only in the warning at exit."""
    from prometheus_client import CollectorRegistry

    processor = BoundedBatchSpanProcessor(FullDisk(), schedule_delay_millis=10)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    for i in range(5):
        provider.get_tracer("t").start_span(f"s{i}").end()
    processor.force_flush(5000)
    registry = CollectorRegistry()
    registry.register(ExportLossCollector())
    port = free_port()
    server = serve(registry, "127.0.0.1", port)
    try:
        got = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        provider.shutdown()
    assert got[("agl_bridge_export_spans_lost_total",
                (("exporter", "FullDisk"), ("reason", "refused by the exporter")))] == 5


def test_a_metrics_port_in_use_is_an_error_naming_it():
    import socket

    import pytest
    from prometheus_client import CollectorRegistry

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve(CollectorRegistry(), "127.0.0.1", port)
