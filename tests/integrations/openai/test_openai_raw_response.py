"""``client.chat.completions.with_raw_response.create``: how langchain-openai calls the SDK."""

import openai

from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.scripted_server import ScriptedServer


def test_raw_responses_are_recorded_and_restored(spans):
    OpenAIInstrumentor().instrument()
    try:
        with ScriptedServer(vllm=True, completion_ids=[8, 9]) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="k")
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            parsed = raw.parse()
    finally:
        OpenAIInstrumentor().uninstrument()
    assert raw.headers["content-type"] == "application/json"
    assert parsed is raw.parse()  # the same cached object the instrumentor restored
    assert parsed.prompt_token_ids is None and parsed.choices[0].token_ids is None
    assert parsed.choices[0].logprobs is None and parsed.choices[0].message.content == "hello"
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    assert list(span.attributes[sc.COMPLETION_TOKEN_IDS]) == [8, 9]
    assert span.attributes[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-scripted"


def test_a_raw_response_client_bound_while_on_stops_tracing_after_uninstrument(spans):
    """openai binds ``create`` into ``with_raw_response`` on first use (langchain-openai keeps
    that object): after ``uninstrument()`` such a client must not go on making spans."""
    with ScriptedServer(vllm=True, completion_ids=[8, 9]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        OpenAIInstrumentor().instrument()
        try:
            raw_api = client.chat.completions.with_raw_response  # binds the wrapped create
            raw_api.create(model="m", messages=[{"role": "user", "content": "on"}]).parse()
        finally:
            OpenAIInstrumentor().uninstrument()
        after = raw_api.create(model="m", messages=[{"role": "user", "content": "off"}])
    assert after.parse().choices[0].message.content == "hello"
    assert len([s for s in spans.get_finished_spans() if s.name == "chat m"]) == 1
