"""End to end on a real vLLM (the tiny model): a streamed call, traced, records exactly the ids
vLLM returns for the same request when ``return_token_ids`` is asked explicitly; the caller's
chunks carry vLLM's nulls for the fields it did not ask for. Sync and async; one server."""

import asyncio

import openai
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

import agl_bridge
from agl_bridge import semconv as sc

pytestmark = pytest.mark.e2e

REQUEST = dict(model="tiny", temperature=0.0, max_tokens=12, seed=0)
PROMPTS = ["add 17 and 25", "what is 3 times 4?", "name a prime", "say hi"]


@pytest.fixture(scope="module")
def vllm(tiny_vllm):
    return tiny_vllm  # the suite's shared server (tests/conftest.py)


def messages(prompt):
    return [{"role": "user", "content": prompt}]


def explicit(base_url, prompt):
    """What vLLM returns for the request when the ids are asked for explicitly (no tracing),
    non-streamed and streamed."""
    with suppress_instrumentation():
        return _explicit(base_url, prompt)


def _explicit(base_url, prompt):
    client = openai.OpenAI(base_url=base_url, api_key="k")
    kwargs = dict(REQUEST, messages=messages(prompt), logprobs=True,
                  extra_body={"return_token_ids": True})
    response = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed_ids = [t for c in chunks for ch in c.choices
                    for t in (getattr(ch, "token_ids", None) or [])]
    return {
        "prompt": response.prompt_token_ids,
        "completion": response.choices[0].token_ids,
        "logprobs": [t.logprob for t in response.choices[0].logprobs.content],
        "text": response.choices[0].message.content,
        "finish": response.choices[0].finish_reason,
        "streamed_prompt": next(c.prompt_token_ids for c in chunks
                                if getattr(c, "prompt_token_ids", None) is not None),
        "streamed_completion": streamed_ids,
    }


def assert_span_matches(span, want, text, chunks):
    a = span.attributes
    assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED and a[sc.SERVER_KIND] == "vllm"
    assert a[sc.LLM_STREAM] is True
    assert list(a[sc.PROMPT_TOKEN_IDS]) == want["prompt"] == want["streamed_prompt"]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == want["completion"] == want["streamed_completion"]
    assert len(want["completion"]) > 0
    assert list(a[sc.COMPLETION_LOGPROBS]) == pytest.approx(want["logprobs"], abs=1e-3)
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (want["finish"],)
    assert a[sc.GEN_AI_RESPONSE_MODEL] == "tiny" and a[sc.POLICY_VERSION] == "tiny"
    # the caller saw the stream it asked for: text, and vLLM's nulls for ids and logprobs
    assert text == want["text"]
    assert chunks[0].prompt_token_ids is None
    for chunk in chunks:
        for choice in chunk.choices:
            assert getattr(choice, "token_ids", None) is None and choice.logprobs is None


def test_sync_stream_records_the_ids_vllm_returns(vllm, spans, instrumented):
    client = openai.OpenAI(base_url=vllm.base_url, api_key="k")
    with agl_bridge.episode("sync"):
        chunks = list(client.chat.completions.create(stream=True, messages=messages(PROMPTS[0]),
                                                     **REQUEST))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat tiny"]
    assert span.attributes[sc.EPISODE_ID] == "sync"
    assert_span_matches(span, explicit(vllm.base_url, PROMPTS[0]), text, chunks)


def test_async_streams_record_the_ids_vllm_returns(vllm, spans, instrumented):
    async def one(client, i):
        with agl_bridge.episode(f"a{i}"):
            stream = await client.chat.completions.create(
                stream=True, messages=messages(PROMPTS[i]), **REQUEST)
            async with stream:
                chunks = [c async for c in stream]
        return chunks

    async def main():
        client = openai.AsyncOpenAI(base_url=vllm.base_url, api_key="k")
        try:
            return await asyncio.gather(*(one(client, i) for i in range(len(PROMPTS))))
        finally:
            await client.close()

    results = asyncio.run(main())
    got = {s.attributes[sc.EPISODE_ID]: s for s in spans.get_finished_spans()
           if s.name == "chat tiny"}
    assert set(got) == {f"a{i}" for i in range(len(PROMPTS))}
    for i, chunks in enumerate(results):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert_span_matches(got[f"a{i}"], explicit(vllm.base_url, PROMPTS[i]), text, chunks)
    chat = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    assert len(chat) == len(PROMPTS)  # the explicit calls were not traced
