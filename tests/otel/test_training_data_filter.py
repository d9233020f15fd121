"""Token ids and logprobs (what only training reads) stay out of the application's own span
processors, and reach agl-bridge's (issue 29.8)."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agl_bridge import semconv as sc
from agl_bridge.otel.processors import (
    TRAINING_ATTRIBUTES,
    WithoutTrainingData,
    keep_training_data_out,
    ours,
)

CHAT = {sc.GEN_AI_OPERATION_NAME: "chat", sc.PROMPT_TOKEN_IDS: (1, 2, 3),
        sc.COMPLETION_TOKEN_IDS: (4, 5), sc.COMPLETION_LOGPROBS: (-0.1, -0.2)}


def run(monkeypatch, opt_in=None):
    if opt_in:
        monkeypatch.setenv("AGL_BRIDGE_EXPORT_TOKEN_IDS", opt_in)
    provider = TracerProvider()
    before, mine, after = InMemorySpanExporter(), InMemorySpanExporter(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(before))  # the application's, first
    provider.add_span_processor(ours(SimpleSpanProcessor(mine)))
    keep_training_data_out(provider)
    keep_training_data_out(provider)  # once per provider, however often joined
    provider.add_span_processor(SimpleSpanProcessor(after))  # the application's, later
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes=CHAT):
        pass
    with tracer.start_as_current_span("plain", attributes={"x": 1}):
        pass
    provider.shutdown()
    return [[dict(s.attributes) for s in e.get_finished_spans()] for e in (before, mine, after)]


def test_the_applications_processors_get_spans_without_training_data(monkeypatch):
    before, mine, after = run(monkeypatch)
    assert mine[0] == CHAT  # ours: whole
    for seen in (before, after):
        assert seen[0] == {sc.GEN_AI_OPERATION_NAME: "chat"}
        assert seen[1] == {"x": 1}
    multi = [type(p) for p in TracerProvider()._active_span_processor._span_processors]
    assert WithoutTrainingData not in multi  # a provider nobody guarded is untouched


def test_opting_in_sends_them_to_the_application_too(monkeypatch):
    before, mine, after = run(monkeypatch, opt_in="1")
    assert before[0] == mine[0] == after[0] == CHAT
    assert TRAINING_ATTRIBUTES <= set(CHAT)
