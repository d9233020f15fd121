"""A production-style app that scores its own answers with the standard OpenTelemetry event,
through the OpenTelemetry logs API only (no agl-bridge code). A guardrail runs as an HTTP
response hook of its OpenAI client, so inside the client call, in the chat span's context when
capture is on; it emits ``gen_ai.evaluation.result`` with the score this request deserves.
It prints one JSON line per request (response id, score).

Usage: evaluating_app.py BASE_URL N none|provider-first|provider-late
  provider-first: the app sets its own LoggerProvider before anything else;
  provider-late: it sets it after its first request.
With a provider of its own, it last prints how many records its own exporter received.
"""

import json
import sys

import openai
from opentelemetry import _logs
from opentelemetry._logs import LogRecord

SCORES = [0.5, -1.0, 0.25, 2.0]
base_url, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
logger = _logs.get_logger("support.guardrail")
received = None


def own_provider():
    global received
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    received = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(received))
    _logs.set_logger_provider(provider)


score = None


def guardrail(response):
    if response.request.url.path.endswith("/chat/completions"):
        logger.emit(LogRecord(event_name="gen_ai.evaluation.result", attributes={
            "gen_ai.evaluation.name": "guardrail", "gen_ai.evaluation.score.value": score}))


if mode == "provider-first":
    own_provider()
client = openai.OpenAI(base_url=base_url, api_key="k",
                       http_client=openai.DefaultHttpxClient(event_hooks={"response": [guardrail]}))
for i in range(n):
    score = SCORES[i % len(SCORES)]
    reply = client.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": f"request {i}"}])
    print(json.dumps({"request": i, "response_id": reply.id, "score": score}), flush=True)
    if mode == "provider-late" and i == 0:
        own_provider()
if received is not None:
    print(json.dumps({"own_exporter": len(received.get_finished_logs())}), flush=True)
