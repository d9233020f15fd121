"""A two-agent team traced by another project's OpenAI instrumentor, exporting over OTLP as a
team that already sends GenAI traces to a collector does. Nothing here imports agl_bridge.

Usage: foreign_team.py openai-v2|openinference|openllmetry BASE_URL OTLP_TRACES_URL N [SESSION]

Each of N tasks is one trace: a ``team`` span holding a solver's and a checker's agent span,
each around one chat call. The agent is named as the instrumentor's project names it (GenAI
``gen_ai.agent.name`` on an ``invoke_agent`` span; OpenInference's ``agent.name`` on an AGENT
span; OpenLLMetry's ``@agent`` entity), and the task's score is a ``gen_ai.evaluation.result``
event on the team span. Prints one JSON line per task: its trace id and the checker's answer.

With SESSION, the N tasks are one conversation, named as each project names a session:
OpenInference's ``using_session`` (its instrumentor puts ``session.id`` on every span), the
GenAI ``gen_ai.conversation.id``, OpenLLMetry's ``session_id`` association property.
"""

import json
import os
import sys

which, base_url, endpoint, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
session = sys.argv[5] if len(sys.argv) > 5 else None
if which == "openai-v2":  # messages as span attributes (the other modes: log records)
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
elif which == "openinference":
    from openinference.instrumentation.openai import OpenAIInstrumentor
elif which == "openllmetry":
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
else:
    sys.exit(f"unknown instrumentor {which!r}")

import openai  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

provider = TracerProvider(resource=Resource.create({"service.name": f"team-{which}"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
trace.set_tracer_provider(provider)
OpenAIInstrumentor().instrument()
tracer = trace.get_tracer("foreign-team")
client = openai.OpenAI(base_url=base_url, api_key="k")


def agent_attributes(name):
    if which == "openinference":
        return {"openinference.span.kind": "AGENT", "agent.name": name}
    if which == "openllmetry":
        return {"traceloop.span.kind": "agent", "traceloop.entity.name": name}
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}


def ask(agent, messages):
    with tracer.start_as_current_span(f"invoke_agent {agent}",
                                      attributes=agent_attributes(agent)):
        reply = client.chat.completions.create(model="base", messages=messages)
    return reply.choices[0].message.content


def session_attributes():
    if session is None or which == "openinference":  # there: using_session, below
        return {}
    if which == "openllmetry":
        return {"traceloop.association.properties.session_id": session}
    return {"gen_ai.conversation.id": session}


if session is not None and which == "openinference":
    from openinference.instrumentation import using_session

    using_session(session).__enter__()  # for the rest of the program

for task in range(n):
    with tracer.start_as_current_span("team", attributes=session_attributes()) as team:
        question = f"What is {task} + 2?"
        answer = ask("solver", [{"role": "system", "content": "You solve sums."},
                                {"role": "user", "content": question}])
        verdict = ask("checker", [{"role": "user", "content": f"{question} Answer: {answer}"}])
        team.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "correct",
                                                    "gen_ai.evaluation.score.value": float(task)})
        trace_id = format(team.get_span_context().trace_id, "032x")
    print(json.dumps({"trace_id": trace_id, "verdict": verdict}), flush=True)
provider.shutdown()
assert not [m for m in sys.modules if m.startswith("agl_bridge")], "agl_bridge was imported"
