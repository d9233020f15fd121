"""``client.chat.completions.with_raw_response.create``: how langchain-openai calls the SDK."""

import openai

from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import OpenAIInstrumentor
from scripted_server import ScriptedServer


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
