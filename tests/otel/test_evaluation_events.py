"""OpenTelemetry's standard form of a score: the event ``gen_ai.evaluation.result`` as a log
record, read as a reward whether it arrives over OTLP (``agl-bridge collect``), in Collector
files (``agl-bridge import``) or in-process (``AGL_BRIDGE_AUTO=1``); see
docs/evaluation-events.md. The apps' traces carry no reward: every reward below is an event."""

import base64
import contextlib
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pyarrow.parquet as pq
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry import trace
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from agl_bridge import semconv as sc
from agl_bridge.otel import otlp_logs
from agl_bridge.otel.rows import log_record_to_row
from agl_bridge.trainer.conversion import ConvertConfig, convert, reasons
from agl_bridge.trainer.rewards import evaluations as ev
from tests.factories import llm, table
from tests.feedback_runs import clean_env, rewards_by_response, run_app
from tests.otlp_helpers import free_port, read_quarantine, read_rows, read_until
from tests.paths import AGENTS

EMITTER = AGENTS / "evaluation_emitter.py"
EVALUATING_APP = AGENTS / "evaluating_app.py"
EXE = Path(sys.executable).with_name("agl-bridge")


# -- helpers -----------------------------------------------------------------------------------
def evaluation(name, score, **extra):
    return {sc.GEN_AI_EVALUATION_NAME: name, sc.GEN_AI_EVALUATION_SCORE_VALUE: score, **extra}


def in_context_of(trace_id, span_id):
    """The context of a span known only by its ids (another process's span)."""
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED))))


def sdk_records(emit):
    """Log records as the SDK hands them to exporters, from a private provider."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create({"service.name": "evaluator"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    emit(provider.get_logger("evaluator", "1.0"))
    return list(memory.get_finished_logs())


def logs_json(records):
    """OTLP/JSON of log records as the Collector's file exporter writes it (hex ids)."""
    obj = json_format.MessageToDict(encode_logs(records), use_integers_for_enums=True)
    for rl in obj["resourceLogs"]:
        for sl in rl["scopeLogs"]:
            for record in sl["logRecords"]:
                for key in ("traceId", "spanId"):
                    if key in record:
                        record[key] = base64.b64decode(record[key]).hex()
    return obj


def post(url, body, content_type="application/x-protobuf", headers=None):
    """(status, body) of a raw POST."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def chat_spans(tmp_path):
    return {r["response_id"]: r for r in read_rows(tmp_path / "traces")
            if r["operation_name"] == "chat"}


def evaluation_rows(directory):
    return [r for r in read_rows(directory) if r["name"] == sc.GEN_AI_EVALUATION_RESULT]


@contextlib.contextmanager
def collect(out, report):
    """``agl-bridge collect`` in its own process; ``report`` gets its last words at SIGTERM."""
    http_port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([str(EXE), "collect", "--out", str(out), "--http-port",
                             str(http_port), "--grpc-port", str(grpc_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    try:
        banner = read_until(proc, "SIGTERM")
        logs = f"http://127.0.0.1:{http_port}/v1/logs"
        assert logs in banner
        yield {"http": logs, "grpc": f"127.0.0.1:{grpc_port}"}
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        report.append(stdout)
    finally:
        proc.kill()


# -- (a) a plain OpenTelemetry program sends scores over OTLP -----------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_evaluation_events_sent_over_otlp_by_a_plain_sdk_program_are_the_rewards(tmp_path,
                                                                                 protocol):
    ids = run_app(tmp_path, n=3)  # the app is gone before any score exists
    evaluated = chat_spans(tmp_path)[ids[1]]
    scores = [{"name": "helpful", "score": 0.75, "response_id": ids[0]},
              {"name": "helpful", "score": -0.5, "trace_id": evaluated["trace_id"],
               "span_id": evaluated["span_id"]}]
    report: list[str] = []
    with collect(tmp_path / "traces", report) as endpoints:
        sent = subprocess.run([sys.executable, str(EMITTER), endpoints[protocol], protocol,
                               json.dumps(scores), "--twice"], capture_output=True, text=True,
                              env=clean_env(), timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip() == "sent 2"
    assert "log records: 4 written, 0 quarantined, 0 ignored" in report[0]

    rows = evaluation_rows(tmp_path / "traces")
    assert len(rows) == 4 and len({(r["trace_id"], r["span_id"]) for r in rows}) == 2  # resent
    parented = next(r for r in rows if r["evaluation_score"] == -0.5)
    assert (parented["trace_id"], parented["parent_span_id"], parented["kind"]) == (
        evaluated["trace_id"], evaluated["span_id"], "EVENT")
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: 0.75, ids[1]: -0.5}  # exactly the scores, each once
    assert stats.skipped[reasons.NO_REWARD] == 1  # the third request was not scored
    assert stats.notes[ev.JOINED] == 2 and stats.notes[ev.SUPERSEDED] == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_evaluator_scoring_on_its_own_span_scores_the_responses_it_names(tmp_path, protocol):
    """An evaluator traced with the SDK alone emits its scores inside its own span, as a span
    event and as a log record: both go to the calls their gen_ai.response.id names, none to
    the evaluator's trace (the span event used to be joined there, and lost)."""
    ids = run_app(tmp_path, n=3)
    scores = [{"name": "helpful", "score": 0.75, "response_id": ids[0], "form": "span_event"},
              {"name": "helpful", "score": -0.5, "response_id": ids[1]}]
    report: list[str] = []
    with collect(tmp_path / "traces", report) as endpoints:
        sent = subprocess.run([sys.executable, str(EMITTER), endpoints[protocol], protocol,
                               json.dumps(scores), "--own-span"], capture_output=True,
                              text=True, env=clean_env(), timeout=60)
        assert sent.returncode == 0, sent.stderr
    assert "log records: 1 written" in report[0]
    rows = read_rows(tmp_path / "traces")
    evaluator = next(r for r in rows if r["name"] == "evaluate")
    assert sc.GEN_AI_EVALUATION_RESULT in evaluator["events"]
    record = next(r for r in evaluation_rows(tmp_path / "traces"))
    assert (record["trace_id"], record["parent_span_id"]) == (evaluator["trace_id"],
                                                              evaluator["span_id"])
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: 0.75, ids[1]: -0.5}
    assert stats.notes[ev.JOINED] == 2 and stats.skipped[reasons.NO_REWARD] == 1


# -- (b) Collector files ------------------------------------------------------------------------
def test_import_reads_evaluation_events_from_collector_log_lines(tmp_path):
    ids = run_app(tmp_path, n=3)
    evaluated = chat_spans(tmp_path)[ids[2]]

    def emit(logger):
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT, attributes=evaluation(
            "thumbs", 1.0, **{sc.GEN_AI_RESPONSE_ID: ids[0]})))
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT,
                              attributes=evaluation("thumbs", 0.25),
                              context=in_context_of(evaluated["trace_id"],
                                                    evaluated["span_id"])))
        logger.emit(LogRecord(body="user opened the settings page"))  # a plain log line
        logger.emit(LogRecord(event_name="gen_ai.client.inference.operation.details",
                              attributes={sc.GEN_AI_INPUT_MESSAGES: "[...]"}))
    good = logs_json(sdk_records(emit))
    bad = logs_json(sdk_records(lambda logger: [logger.emit(LogRecord(
        event_name=sc.GEN_AI_EVALUATION_RESULT, attributes=attrs)) for attrs in (
        evaluation("thumbs", 9.0), {sc.GEN_AI_EVALUATION_SCORE_VALUE: 9.0})]))
    bad["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["traceId"] = "xyz"
    src = tmp_path / "collector.jsonl"
    # the same export twice (a Collector retry), one line with two bad records, one cut short
    src.write_text("\n".join([json.dumps(good), json.dumps(good), json.dumps(bad),
                              '{"resourceLogs": [{"scopeLogs": [']) + "\n")

    out = subprocess.run([str(EXE), "import", str(src), "--out", str(tmp_path / "traces")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr  # something was quarantined
    assert f"{src}:4: not JSON" in out.stderr
    assert ("4 evaluation event(s) imported, 2 quarantined, 4 other log record(s) skipped"
            in out.stdout)
    errors = sorted(r["error"] for r in read_quarantine(tmp_path / "traces") if "log_record" in r)
    assert len(errors) == 2
    assert "has no gen_ai.evaluation.name" in errors[0] and "not parsable" in errors[1]
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: 1.0, ids[2]: 0.25}
    assert stats.skipped[reasons.NO_REWARD] == 1
    assert stats.notes[ev.JOINED] == 2 and stats.notes[ev.SUPERSEDED] == 2


# -- (c) in-process: an app under AGL_BRIDGE_AUTO=1 ---------------------------------------------
@pytest.mark.parametrize("mode", ["none", "provider-first", "provider-late"])
def test_an_app_under_auto_capture_emitting_evaluation_events_gets_them_as_rewards(tmp_path,
                                                                                  mode):
    from tests.scripted_server import ScriptedServer

    with ScriptedServer(vllm=True, unique_ids=True, completion_ids=[5, 6]) as server:
        done = subprocess.run([sys.executable, str(EVALUATING_APP), server.base_url, "3", mode],
                              env=clean_env(AGL_BRIDGE_AUTO="1",
                                            AGL_BRIDGE_PARQUET_DIR=str(tmp_path / "traces")),
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    scores = {line["response_id"]: line["score"] for line in lines if "response_id" in line}
    assert len(scores) == 3
    if mode != "none":  # the app's own exporter still gets what it emits after it is set
        assert lines[-1] == {"own_exporter": 3 if mode == "provider-first" else 2}

    chats = chat_spans(tmp_path)
    rows = evaluation_rows(tmp_path / "traces")
    # each emitted inside its chat span: parented to it, nothing else says what it scores
    assert sorted((r["trace_id"], r["parent_span_id"], r["evaluation_score"]) for r in rows) \
        == sorted((chats[i]["trace_id"], chats[i]["span_id"], s) for i, s in scores.items())
    assert all(r["response_id"] is None and r["evaluation_target"] is None for r in rows)
    got, stats = rewards_by_response(tmp_path)
    assert got == scores and stats.notes[ev.JOINED] == 3


def test_configure_tracing_captures_evaluation_events_emitted_in_its_spans(tmp_path):
    code = """if True:
        import sys
        from opentelemetry import trace
        from opentelemetry._logs import LogRecord, get_logger
        from agl_bridge.otel import configure_tracing
        provider = configure_tracing(parquet_dir=sys.argv[1], batch=False)
        with trace.get_tracer("app").start_as_current_span("answer") as span:
            get_logger("app").emit(LogRecord(event_name="gen_ai.evaluation.result", attributes={
                "gen_ai.evaluation.name": "judge", "gen_ai.evaluation.score.value": 0.5}))
            print(format(span.get_span_context().span_id, "016x"))
        get_logger("app").emit(LogRecord(body="not an evaluation"))
        provider.shutdown()
    """
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "traces")],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    rows = read_rows(tmp_path / "traces")
    (answer,) = [r for r in rows if r["name"] == "answer"]
    (event,) = evaluation_rows(tmp_path / "traces")
    assert len(rows) == 2 and answer["span_id"] == done.stdout.strip()
    assert (event["trace_id"], event["parent_span_id"], event["evaluation_score"]) == (
        answer["trace_id"], answer["span_id"], 0.5)


# -- (d) bad payloads, and the same record twice ------------------------------------------------
def logs_request(records):
    """A request with the records emitted by ``records(logger)``."""
    return encode_logs(sdk_records(records))


def test_bad_log_payloads_get_clear_errors_and_quarantine_the_rest_is_kept(start, tmp_path):
    def mixed(logger):
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT, attributes=evaluation(
            "judge", 0.5, **{sc.GEN_AI_RESPONSE_ID: "r1"}), timestamp=123))
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT,
                              attributes=evaluation("judge", 1.0)))  # its trace id cut below
        logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT,
                              attributes={sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}))
        logger.emit(LogRecord(body="GET /health 200"))
    request = logs_request(mixed)
    request.resource_logs[0].scope_logs[0].log_records[1].trace_id = b"\x01" * 5
    rx = start()

    status, raw = post(rx.logs_endpoint, b"not protobuf")
    error = status_pb2.Status.FromString(raw)
    assert (status, error.code) == (400, code_pb2.INVALID_ARGUMENT)
    assert "ExportLogsServiceRequest" in error.message
    status, raw = post(rx.logs_endpoint, b'{"resourceLogs": 5}', "application/json")
    assert status == 400 and "'resourceLogs' must be a list" in json.loads(raw)["message"]
    with grpc.insecure_channel(rx.grpc_endpoint) as channel:
        raw_export = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/"
                                         "Export")
        with pytest.raises(grpc.RpcError) as err:
            raw_export(b"not protobuf", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        answer = logs_service_pb2_grpc.LogsServiceStub(channel).Export(request, timeout=10)
    assert answer.partial_success.rejected_log_records == 2
    assert "invalid trace id" in answer.partial_success.error_message
    assert "has no gen_ai.evaluation.name" in answer.partial_success.error_message
    status, raw = post(rx.logs_endpoint, request.SerializeToString())
    assert status == 200
    assert logs_service_pb2.ExportLogsServiceResponse.FromString(
        raw).partial_success.rejected_log_records == 2
    rx.stop()
    assert (rx.stats.requests_malformed, rx.stats.log_records_written,
            rx.stats.log_records_rejected, rx.stats.log_records_ignored) == (3, 2, 4, 2)

    rows = evaluation_rows(tmp_path / "out")
    assert len(rows) == 2 and rows[0] == rows[1]  # the same record sent twice: the same row
    records = [r for r in read_quarantine(tmp_path / "out") if "log_record" in r]
    assert len(records) == 4
    assert {r["log_record"].get("traceId") for r in records} >= {"01" * 5}  # hex, re-sendable

    # conversion counts the record once
    pq.write_table(table([dict(llm("e1", 1), response_id="r1")]),
                   tmp_path / "out" / "calls.parquet")
    stats = convert(tmp_path / "out", tmp_path / "t.parquet", ConvertConfig())
    (t,) = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert t["reward"] == 0.5 and stats.notes[ev.JOINED] == 1


def test_logs_path_keeps_the_receivers_auth_size_limit_and_404(start, tmp_path):
    request = logs_request(lambda logger: logger.emit(LogRecord(
        event_name=sc.GEN_AI_EVALUATION_RESULT,
        attributes=evaluation("judge", 0.5, note="x" * 3000))))
    rx = start(token="s3cret", max_request_bytes=2048)
    body, auth = request.SerializeToString(), {"Authorization": "Bearer s3cret"}
    assert len(body) > 2048
    assert post(rx.logs_endpoint, body)[0] == 401
    assert post(rx.logs_endpoint, body, headers=auth)[0] == 413
    status, raw = post(rx.logs_endpoint.replace("/v1/logs", "/v1/metrics"), b"", headers=auth)
    assert status == 404 and "/v1/logs" in status_pb2.Status.FromString(raw).message
    rx.stop()
    assert evaluation_rows(tmp_path / "out") == []
    assert (rx.stats.requests_unauthorized, rx.stats.requests_too_large) == (1, 1)


# -- the mapping -------------------------------------------------------------------------------
def test_a_record_is_the_same_row_in_process_and_over_otlp(monkeypatch):
    context = in_context_of("ab" * 16, "cd" * 8)

    def emit(logger):
        for score in (1.0, 1.0, 2.0):
            logger.emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT, timestamp=5,
                                  context=context, body={"why": b"\x00"}, attributes=evaluation(
                                      "judge", score, **{"app.ids": (1, 2),
                                                         sc.GEN_AI_EVALUATION_EXPLANATION:
                                                         "too long"})))
        # an SDK before LogRecord.event_name: the name is an attribute; no time, no trace
        logger.emit(LogRecord(attributes={sc.EVENT_NAME: sc.GEN_AI_EVALUATION_RESULT,
                                          **evaluation("judge", 0.0)}))
    records = sdk_records(emit)
    for level, text in (("token_ids", False), ("messages", True)):
        monkeypatch.setenv("AGL_BRIDGE_CAPTURE", level)
        received = otlp_logs.request_to_rows(encode_logs(records)).rows
        captured = [log_record_to_row(r, keep_text=text) for r in records]
        assert received == captured
        attributes = json.loads(captured[0]["attributes"])
        assert (sc.GEN_AI_EVALUATION_EXPLANATION in attributes) is text
        assert attributes.get(sc.LOG_BODY) == ({"why": "AA=="} if text else None)
        assert attributes["app.ids"] == [1, 2]
    first, again, other, legacy = captured
    assert first == again and first["span_id"] != other["span_id"]  # ids follow the content
    assert (first["trace_id"], first["parent_span_id"], first["start_time_unix_nano"],
            first["kind"], first["service_name"]) == ("ab" * 16, "cd" * 8, 5, "EVENT", "evaluator")
    assert legacy["parent_span_id"] is None and legacy["trace_id"] != first["trace_id"]
    assert legacy["start_time_unix_nano"] == records[3].log_record.observed_timestamp


def test_an_evaluation_naming_its_response_is_joined_to_that_call():
    lookup = ev.Lookup(episodes={"e1", "e2"}, responses={"r9": ev.Place("e1", "b", 1)},
                       spans={("t1", "s1"): ev.Place("e2", "c", 0)})
    by_response = ev.Evaluation("n", 1.0, None, 1, "x", response="r9", parent=("t1", "s1"))
    unknown = ev.Evaluation("n", 1.0, None, 1, "y", response="nope", parent=("t1", "s1"))
    lost = ev.Evaluation("n", 1.0, None, 1, "z", response="nope", trace="f" * 32)
    out = ev.resolve([by_response, unknown, lost], lookup)
    places = sorted((r.episode, r.agent, r.turn) for rs in out.rewards.values() for r in rs)
    assert places == [("e1", "b", 1), ("e2", "c", 0)]
    assert out.unknown == ["n: response:nope"]
