"""An evaluation tool that knows nothing of agl-bridge: it scores answers with the standard
OpenTelemetry event ``gen_ai.evaluation.result``, emitted as log records through the
OpenTelemetry SDK and sent over OTLP. Nothing here imports agl_bridge.

Usage: evaluation_emitter.py ENDPOINT http|grpc SCORES_JSON [--twice] [--own-span]

SCORES_JSON is a list of {"name", "score"} with either "response_id" (the gen_ai.response.id of
the evaluated call) or "trace_id" and "span_id" (the evaluated span, as hex). ``--twice`` sends
every record twice, as an exporter does when it retries after a lost answer.

``--own-span``: the evaluator works inside a span of its own (``evaluate``, its own trace, sent
over OTLP to the same receiver) and emits every score there: as a log record emitted in that
span, or, for a score with ``"form": "span_event"``, as an event added to that span, which is
how an evaluator already traced with the SDK records a score most simply. The response id it
names, not the evaluator's trace, says what was evaluated.
"""

import json
import sys

from opentelemetry import trace
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

endpoint, protocol, scores = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if protocol == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    def exporter():
        return OTLPLogExporter(endpoint=endpoint, insecure=True)

    def span_exporter():
        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
else:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    def exporter():
        return OTLPLogExporter(endpoint=endpoint)

    def span_exporter():
        return OTLPSpanExporter(endpoint=endpoint.replace("/v1/logs", "/v1/traces"))

resource = Resource.create({"service.name": "evaluator"})
provider = LoggerProvider(resource=resource)
for _ in range(2 if "--twice" in sys.argv else 1):
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter()))
logger = provider.get_logger("evaluator", "1.0")
own_span = None
tracer_provider = TracerProvider(resource=resource)
if "--own-span" in sys.argv:
    tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter()))
    own_span = tracer_provider.get_tracer("evaluator", "1.0").start_span("evaluate")

for s in scores:
    attributes = {"gen_ai.evaluation.name": s["name"], "gen_ai.evaluation.score.value": s["score"]}
    context = None
    if "response_id" in s:
        attributes["gen_ai.response.id"] = s["response_id"]
    else:  # the evaluated span's context: the record is parented to it
        span = SpanContext(int(s["trace_id"], 16), int(s["span_id"], 16), is_remote=True,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED))
        context = trace.set_span_in_context(NonRecordingSpan(span))
    if own_span is not None:
        if s.get("form") == "span_event":
            own_span.add_event("gen_ai.evaluation.result", attributes)
            continue
        context = context or trace.set_span_in_context(own_span)
    logger.emit(LogRecord(event_name="gen_ai.evaluation.result", attributes=attributes,
                          context=context))
if own_span is not None:
    own_span.end()
tracer_provider.shutdown()
provider.shutdown()
assert not [m for m in sys.modules if m.startswith("agl_bridge")], "agl_bridge was imported"
print("sent", len(scores), flush=True)
