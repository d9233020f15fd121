"""Ids and logprobs read from the server's JSON before the openai SDK builds models of it
(``integrations/openai/raw.py``), and number lists set without per-element checks
(``otel/attributes.py``): same spans, same responses, less work per call."""

import openai
import pytest
from openai._base_client import BaseClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext

from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import OpenAIInstrumentor, raw
from agl_bridge.otel.attributes import FloatList, IntList, set_number_lists
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "user", "content": "hi"}]
ORIGINAL = BaseClient.__dict__["_process_response_data"]


def chat_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("chat")]


@pytest.fixture
def seen_bodies(monkeypatch):
    """The bodies the SDK builds its models from (a layer under ours, installed first)."""
    bodies = []

    def spy(self, *, data, cast_to, response):
        bodies.append(data)
        return ORIGINAL(self, data=data, cast_to=cast_to, response=response)

    monkeypatch.setattr(BaseClient, "_process_response_data", spy)
    return bodies


def test_ids_leave_the_body_before_the_sdk_builds_its_models(spans, seen_bodies, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(model="m", messages=MESSAGES)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    body = seen_bodies[0]
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None and body["choices"][0]["logprobs"] is None
    for chunk_body in seen_bodies[1:]:
        for choice in chunk_body["choices"]:
            assert choice.get("token_ids") is None and choice.get("logprobs") is None
    assert len(seen_bodies) == 1 + len(chunks)
    whole, streamed = chat_spans(spans)
    for span in (whole, streamed):
        assert list(span.attributes[sc.COMPLETION_TOKEN_IDS]) == [7, 8, 9]
        assert list(span.attributes[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75, -1.0]
        assert span.attributes[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED
    assert response.prompt_token_ids is None and response.choices[0].logprobs is None


def test_caller_asked_fields_stay_in_the_body(spans, seen_bodies, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(
            model="m", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True})
    assert seen_bodies[0]["choices"][0]["token_ids"] == [11, 12, 13]
    assert [t.logprob for t in response.choices[0].logprobs.content] == [-0.5, -0.75, -1.0]
    (span,) = chat_spans(spans)
    assert list(span.attributes[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]


def test_without_the_sdk_hook_ids_are_read_from_the_models(spans, monkeypatch):
    monkeypatch.setattr(raw, "_owner", lambda: None)  # an openai without the method
    inst = OpenAIInstrumentor()
    inst.instrument()
    try:
        with ScriptedServer(vllm=True, completion_ids=[4, 5]) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="k")
            response = client.chat.completions.create(model="m", messages=MESSAGES)
            chunks = list(client.chat.completions.create(model="m", messages=MESSAGES,
                                                         stream=True))
    finally:
        inst.uninstrument()
    assert BaseClient.__dict__["_process_response_data"] is ORIGINAL
    for span in chat_spans(spans):
        assert list(span.attributes[sc.COMPLETION_TOKEN_IDS]) == [4, 5]
        assert list(span.attributes[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert response.prompt_token_ids is None and response.choices[0].token_ids is None
    assert response.choices[0].logprobs is None
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)


def test_a_body_the_take_cannot_read_is_left_to_the_models():
    call = _call()
    take = raw.Take(call)
    body = {"choices": [{"index": 0, "token_ids": [1], "logprobs": {"content": [{"x": 1}]}}],
            "prompt_token_ids": [5]}
    with pytest.raises(KeyError):
        take.absorb(body)
    assert take.absorbed == 0 and body["prompt_token_ids"] == [5]  # nothing changed
    assert body["choices"][0]["token_ids"] == [1]
    hostile = {"choices": [{"index": 0, "token_ids": "abc"}], "prompt_token_ids": {"a": 1}}
    take.absorb(hostile)
    assert take.absorbed == 1 and take.prompt_ids is None and take.completion_ids is None
    take.absorb({"choices": "not a list"})
    assert take.absorbed == 1


def test_uninstrument_takes_the_hook_off():
    inst = OpenAIInstrumentor()
    inst.instrument()
    try:
        assert BaseClient.__dict__["_process_response_data"] is not ORIGINAL
        inst.uninstrument()
        inst.instrument()  # twice on, once off: one layer only
    finally:
        inst.uninstrument()
    assert BaseClient.__dict__["_process_response_data"] is ORIGINAL


def _call():
    from agl_bridge.capture import CaptureLevel
    from agl_bridge.integrations.openai.request import Call

    return Call({"model": "m"}, CaptureLevel.TOKEN_IDS, "vllm", want_ids=True)


@pytest.fixture
def tracer_and_memory():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer("t"), memory


@pytest.mark.parametrize("values", [
    [1, 2, 3], [], [0.5, -1.0, 2], [2**40, -(2**40)],
    [True, False], [1, "a"], [[1], [2]], [1, None], (1, 2),
])
def test_number_lists_are_stored_as_set_attribute_stores_them(tracer_and_memory, values):
    tracer, memory = tracer_and_memory
    fast = tracer.start_span("fast")
    set_number_lists(fast, {"k": values})
    slow = tracer.start_span("slow")
    slow.set_attribute("k", values)
    fast.end()
    slow.end()
    got, want = (s.attributes.get("k") for s in memory.get_finished_spans())
    # a tuple, or a tuple subclass that records what was checked (IntList, FloatList)
    assert got == want and isinstance(got, type(want))
    assert [type(x) for x in got] == [type(x) for x in want]
    if type(got) is not type(want):
        assert type(got) is (IntList if all(type(x) is int for x in values) else FloatList)


def test_number_lists_respect_ended_spans_limits_and_other_spans(tracer_and_memory):
    tracer, memory = tracer_and_memory
    ended = tracer.start_span("ended")
    ended.end()
    set_number_lists(ended, {"k": [1, 2]})  # the SDK's own warning, nothing stored
    assert "k" not in memory.get_finished_spans()[0].attributes
    from opentelemetry.sdk.trace import SpanLimits

    limited = TracerProvider(span_limits=SpanLimits(max_span_attributes=2))
    limited.add_span_processor(SimpleSpanProcessor(memory))
    span = limited.get_tracer("t").start_span("full", attributes={"a": 1, "b": 2})
    set_number_lists(span, {"ids": [1, 2, 3]})
    span.end()
    attrs = memory.get_finished_spans()[-1].attributes
    assert dict(attrs) == {"b": 2, "ids": (1, 2, 3)}
    assert memory.get_finished_spans()[-1].dropped_attributes == 1
    set_number_lists(NonRecordingSpan(SpanContext(1, 1, False)), {"k": [1]})  # no error
