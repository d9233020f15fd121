"""An evaluation tool that knows nothing of agl-bridge: it scores answers with the standard
OpenTelemetry event ``gen_ai.evaluation.result``, emitted as log records through the
OpenTelemetry SDK and sent over OTLP. Nothing here imports agl_bridge.

Usage: evaluation_emitter.py ENDPOINT http|grpc SCORES_JSON [--twice]

SCORES_JSON is a list of {"name", "score"} with either "response_id" (the gen_ai.response.id of
the evaluated call) or "trace_id" and "span_id" (the evaluated span, as hex). ``--twice`` sends
every record twice, as an exporter does when it retries after a lost answer.
"""

import json
import sys

from opentelemetry import trace
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

endpoint, protocol, scores = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if protocol == "grpc":
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    def exporter():
        return OTLPLogExporter(endpoint=endpoint, insecure=True)
else:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    def exporter():
        return OTLPLogExporter(endpoint=endpoint)

provider = LoggerProvider(resource=Resource.create({"service.name": "evaluator"}))
for _ in range(2 if "--twice" in sys.argv else 1):
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter()))
logger = provider.get_logger("evaluator", "1.0")

for s in scores:
    attributes = {"gen_ai.evaluation.name": s["name"], "gen_ai.evaluation.score.value": s["score"]}
    context = None
    if "response_id" in s:
        attributes["gen_ai.response.id"] = s["response_id"]
    else:  # the evaluated span's context: the record is parented to it
        span = SpanContext(int(s["trace_id"], 16), int(s["span_id"], 16), is_remote=True,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED))
        context = trace.set_span_in_context(NonRecordingSpan(span))
    logger.emit(LogRecord(event_name="gen_ai.evaluation.result", attributes=attributes,
                          context=context))
provider.shutdown()
assert not [m for m in sys.modules if m.startswith("agl_bridge")], "agl_bridge was imported"
print("sent", len(scores), flush=True)
