"""``agl-bridge collect``: the real OpenTelemetry OTLP exporters against our receiver.

The receiver must write exactly the rows the in-process exporter writes for the same SDK spans
(``span_to_row``), and answer every bad request the way OTLP says, without going down.
"""

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExportResult

from agl_bridge.otel.receiver import TOKEN_ENV
from tests.otlp_helpers import (
    EXPORT_PATH,
    agent_team,
    by_span,
    expected_rows,
    free_port,
    make_spans,
    otlp_json,
    read_quarantine,
    read_rows,
    read_until,
)


# -- fixtures ----------------------------------------------------------------------------------
def post(rx, body, content_type="application/x-protobuf", headers=None):
    """(status, headers, body) of a raw POST to the receiver's OTLP/HTTP endpoint."""
    req = urllib.request.Request(rx.http_endpoint, data=body, method="POST",
                                 headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def grpc_call(rx, request, metadata=None):
    with grpc.insecure_channel(rx.grpc_endpoint) as channel:
        return trace_service_pb2_grpc.TraceServiceStub(channel).Export(
            request, metadata=metadata, timeout=10)


def grpc_error(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


# -- tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["grpc", "http", "http-gzip", "http-json"])
def test_received_rows_equal_the_in_process_rows(start, tmp_path, protocol):
    spans = make_spans(agent_team)
    rx = start()
    if protocol == "http-json":  # no OTLP/JSON exporter in Python: what the JS and Go ones send
        status, headers, body = post(rx, json.dumps(otlp_json(spans)).encode(), "application/json")
        assert (status, headers["Content-Type"], json.loads(body)) == (200, "application/json", {})
    else:
        exporter = GrpcExporter(endpoint=rx.grpc_endpoint, insecure=True) if protocol == "grpc" \
            else HttpExporter(endpoint=rx.http_endpoint, compression=Compression.Gzip
                              if protocol == "http-gzip" else Compression.NoCompression)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        exporter.shutdown()
    rx.stop()

    got, want = by_span(read_rows(tmp_path / "out")), by_span(expected_rows(spans))
    assert len(got) == len(spans) == 8
    assert got == want  # every column, JSON strings byte for byte
    chat = next(r for r in got if r["name"] == "chat tiny")
    assert chat["prompt_token_ids"] == [1, 2, 3, 50_000] and chat["kind"] == "CLIENT"
    assert (chat["status_code"], chat["status_message"]) == ("ERROR", "upstream 503")
    assert json.loads(chat["attributes"])["app.big"] == 2**62
    assert rx.stats.spans_written == 8 and rx.stats.spans_rejected == 0


def test_bearer_token_is_required_when_set(start, tmp_path):
    spans = make_spans(lambda t: t.start_span("one").end())
    rx = start(token="s3cret")
    body = encode_spans(spans).SerializeToString()

    status, headers, raw = post(rx, body)
    assert (status, headers["WWW-Authenticate"]) == (401, "Bearer")
    assert status_pb2.Status.FromString(raw).code == code_pb2.UNAUTHENTICATED
    assert post(rx, body, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert HttpExporter(endpoint=rx.http_endpoint).export(spans) == SpanExportResult.FAILURE
    assert grpc_error(lambda: grpc_call(rx, encode_spans(spans))) == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_error(lambda: grpc_call(rx, encode_spans(spans), [("authorization", "Bearer x")])
                      ) == grpc.StatusCode.UNAUTHENTICATED
    assert GrpcExporter(endpoint=rx.grpc_endpoint, insecure=True).export(spans) \
        == SpanExportResult.FAILURE

    ok_http = HttpExporter(endpoint=rx.http_endpoint, headers={"Authorization": "Bearer s3cret"})
    ok_grpc = GrpcExporter(endpoint=rx.grpc_endpoint, insecure=True,
                           headers={"authorization": "Bearer s3cret"})
    assert ok_http.export(spans) == ok_grpc.export(spans) == SpanExportResult.SUCCESS
    rx.stop()
    assert len(read_rows(tmp_path / "out")) == 2  # only the two authorized exports
    assert rx.stats.requests_unauthorized == 6 and rx.stats.requests == 2


def test_requests_over_the_size_limit_are_refused(start, tmp_path):
    big = make_spans(lambda t: t.start_span("big", attributes={"app.text": "x" * 5000}).end())
    small = make_spans(lambda t: t.start_span("small").end())
    rx = start(max_request_bytes=2048)
    body = encode_spans(big).SerializeToString()
    assert len(body) > 2048

    status, _, raw = post(rx, body)
    assert status == 413
    assert status_pb2.Status.FromString(raw).code == code_pb2.RESOURCE_EXHAUSTED
    # small on the wire, too large once inflated: refused without inflating it all
    status, _, _ = post(rx, gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert status == 413 and len(gzip.compress(body)) < 2048
    assert grpc_error(lambda: grpc_call(rx, encode_spans(big))) \
        == grpc.StatusCode.RESOURCE_EXHAUSTED

    assert HttpExporter(endpoint=rx.http_endpoint).export(small) == SpanExportResult.SUCCESS
    assert grpc_call(rx, encode_spans(small)) == trace_service_pb2.ExportTraceServiceResponse()
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["small", "small"]
    assert rx.stats.requests_too_large == 2


def test_malformed_payloads_get_otlp_errors_and_the_server_keeps_serving(start, tmp_path):
    spans = make_spans(lambda t: t.start_span("after").end())
    rx = start()

    status, headers, raw = post(rx, b"this is not protobuf")
    assert (status, headers["Content-Type"]) == (400, "application/x-protobuf")
    error = status_pb2.Status.FromString(raw)
    assert error.code == code_pb2.INVALID_ARGUMENT and "ExportTraceServiceRequest" in error.message
    status, headers, raw = post(rx, b"{not json", "application/json")
    assert (status, headers["Content-Type"]) == (400, "application/json")
    assert json.loads(raw)["code"] == code_pb2.INVALID_ARGUMENT
    assert post(rx, b'{"resourceSpans": 5}', "application/json")[0] == 400
    assert post(rx, b"\x1f\x8b not gzip", headers={"Content-Encoding": "gzip"})[0] == 400
    assert post(rx, b"x", "text/plain")[0] == 415
    with grpc.insecure_channel(rx.grpc_endpoint) as channel:
        raw_export = channel.unary_unary(EXPORT_PATH)  # bytes in, bytes out
        assert grpc_error(lambda: raw_export(b"this is not protobuf", timeout=10)) \
            == grpc.StatusCode.INVALID_ARGUMENT

    assert HttpExporter(endpoint=rx.http_endpoint).export(spans) == SpanExportResult.SUCCESS
    assert GrpcExporter(endpoint=rx.grpc_endpoint, insecure=True).export(spans) \
        == SpanExportResult.SUCCESS
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["after", "after"]
    assert rx.stats.requests_malformed == 5  # the 415 is refused before decoding


def test_a_bug_is_answered_500_or_internal_and_the_server_keeps_serving(start, tmp_path,
                                                                        monkeypatch, caplog):
    """An exception no one expected still gets an answer (it used to close the connection
    unanswered, or reach gRPC clients as a bare UNKNOWN)."""
    from agl_bridge.otel import otlp

    spans = make_spans(lambda t: t.start_span("after").end())
    rx = start()
    real = otlp.decode_protobuf

    def broken(body):
        raise KeyError("a bug")
    monkeypatch.setattr(otlp, "decode_protobuf", broken)
    status, headers, raw = post(rx, encode_spans(spans).SerializeToString())
    assert (status, headers["Connection"]) == (500, "close")
    assert status_pb2.Status.FromString(raw).code == code_pb2.INTERNAL
    assert grpc_error(lambda: grpc_call(rx, encode_spans(spans))) == grpc.StatusCode.INTERNAL
    assert caplog.text.count("KeyError: 'a bug'") == 2  # logged with its traceback

    monkeypatch.setattr(otlp, "decode_protobuf", real)
    assert HttpExporter(endpoint=rx.http_endpoint).export(spans) == SpanExportResult.SUCCESS
    assert GrpcExporter(endpoint=rx.grpc_endpoint, insecure=True).export(spans) \
        == SpanExportResult.SUCCESS
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["after", "after"]


def test_a_bad_span_is_quarantined_and_the_rest_written(start, tmp_path):
    spans = make_spans(lambda t: (t.start_span("good").end(), t.start_span("short-id").end()))
    request = encode_spans(spans)
    bad = request.resource_spans[0].scope_spans[0].spans[1]
    bad.trace_id = bad.trace_id[:8]
    rx = start()

    status, _, raw = post(rx, request.SerializeToString())
    answer = trace_service_pb2.ExportTraceServiceResponse.FromString(raw)
    assert status == 200 and answer.partial_success.rejected_spans == 1
    assert "invalid trace id" in answer.partial_success.error_message
    answer = grpc_call(rx, request)
    assert answer.partial_success.rejected_spans == 1
    obj = otlp_json(spans)
    obj["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["traceId"] = bad.trace_id.hex()
    status, _, raw = post(rx, json.dumps(obj).encode(), "application/json")
    assert status == 200 and json.loads(raw)["partialSuccess"]["rejectedSpans"] == "1"
    rx.stop()

    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["good"] * 3
    records = read_quarantine(tmp_path / "out")
    assert len(records) == rx.writer.rows_quarantined == rx.stats.spans_rejected == 3
    assert {r["span"]["name"] for r in records} == {"short-id"}
    assert records[0]["span"]["traceId"] == bad.trace_id.hex()  # OTLP/JSON: hex, re-importable
    assert records[0]["resource"]["attributes"]


def test_collect_cli_writes_parquet_and_stops_on_sigterm(tmp_path):
    spans = make_spans(agent_team)
    http_port, grpc_port = free_port(), free_port()
    exe = Path(sys.executable).with_name("agl-bridge")
    proc = subprocess.Popen(
        [str(exe), "collect", "--out", str(tmp_path / "out"), "--http-port", str(http_port),
         "--grpc-port", str(grpc_port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, TOKEN_ENV: "tok"})
    try:
        banner = read_until(proc, "SIGTERM")
        assert f"http://127.0.0.1:{http_port}/v1/traces" in banner
        assert f"127.0.0.1:{grpc_port}" in banner and "Bearer" in banner
        auth = {"authorization": "Bearer tok"}
        assert HttpExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces", headers=auth
                            ).export(spans[:4]) == SpanExportResult.SUCCESS
        assert GrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, headers=auth
                            ).export(spans[4:]) == SpanExportResult.SUCCESS
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "8 span(s) written" in out and "Traceback" not in err
    assert by_span(read_rows(tmp_path / "out")) == by_span(expected_rows(spans))
    assert not list((tmp_path / "out" / "_wal").iterdir())  # every log became Parquet


def test_collect_cli_refuses_a_port_in_use_in_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        exe = Path(sys.executable).with_name("agl-bridge")
        out = subprocess.run([str(exe), "collect", "--out", str(tmp_path), "--grpc-port", "0",
                              "--http-port", str(port)], capture_output=True, text=True,
                             timeout=30)
    assert out.returncode == 2
    assert out.stderr.startswith("agl-bridge collect: error: cannot listen for OTLP/HTTP")
    assert "Traceback" not in out.stderr


