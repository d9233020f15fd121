"""Streaming ``chat.completions.create(stream=True)``: the span ends exactly once, however the
stream ends, and carries the ids vLLM streamed; the caller sees the chunks it would have seen."""

import asyncio
import gc
import json
import logging

import openai
import pytest
from opentelemetry.trace import StatusCode

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.integrations.openai.openai_spans import chat_spans
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "add two ints",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
CALLS = [{"id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
         {"id": "call_2", "name": "mul", "arguments": '{"a": 3}'}]


def one_span(spans):
    (span,) = chat_spans(spans)
    return span, span.attributes


def dumps(chunks):
    return [c.model_dump() for c in chunks]


# -- what a stream records -------------------------------------------------------------------
def test_exhausted_stream_records_ids_and_gives_the_caller_the_uninstrumented_chunks(spans):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        plain = dumps(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        inst = OpenAIInstrumentor()
        inst.instrument()
        try:
            with agl_bridge.episode("e1", task_id="t1"), agl_bridge.agent("solver"):
                stream = client.chat.completions.create(model="m", messages=MESSAGES,
                                                        stream=True, temperature=0.5)
            assert chat_spans(spans) == []  # open until the stream ends
            traced = dumps(stream)
        finally:
            inst.uninstrument()
    assert traced == plain
    assert all(c["choices"] == [] or c["choices"][0].get("token_ids") is None for c in traced)
    assert traced[0]["prompt_token_ids"] is None  # vLLM's null, as when nobody asks
    body = server.requests[1]
    assert body["return_token_ids"] is True and body["logprobs"] is True
    assert "stream_options" not in body  # no usage chunk the caller did not ask for
    span, a = one_span(spans)
    assert span.name == "chat m" and span.status.status_code == StatusCode.UNSET
    assert a[sc.LLM_STREAM] is True
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [7, 8, 9]
    assert list(a[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75, -1.0]
    assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED and a[sc.SERVER_KIND] == "vllm"
    assert a[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-scripted-stream"
    assert a[sc.GEN_AI_RESPONSE_MODEL] == "m" and a[sc.POLICY_VERSION] == "m"
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)
    assert (a[sc.EPISODE_ID], a[sc.TASK_ID], a[sc.GEN_AI_AGENT_NAME]) == ("e1", "t1", "solver")
    assert a[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert sc.GEN_AI_USAGE_INPUT_TOKENS not in a  # not asked for by the caller
    assert sc.GEN_AI_INPUT_MESSAGES not in a and sc.GEN_AI_OUTPUT_MESSAGES not in a


def test_usage_is_recorded_when_the_caller_asks_for_it(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        chunks = list(client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 3 and chunks[-1].choices == []
    _, a = one_span(spans)
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (4, 3)


def test_caller_asking_for_ids_and_logprobs_keeps_them_in_the_chunks(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        chunks = list(client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, logprobs=True,
            extra_body={"return_token_ids": True}))
    assert chunks[0].prompt_token_ids == [1, 2, 3, 1]
    assert [t for c in chunks[1:] for t in c.choices[0].token_ids] == [11, 12, 13]
    assert [lp.logprob for c in chunks[1:] for lp in c.choices[0].logprobs.content] == [
        -0.5, -0.75, -1.0]
    _, a = one_span(spans)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]


def test_other_servers_stream_exactly_the_callers_request(spans, instrumented):
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="x", messages=MESSAGES, stream=True))
    assert text == "hello"
    (body,) = server.requests
    assert "return_token_ids" not in body and "logprobs" not in body
    _, a = one_span(spans)
    assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_NOT_REQUESTED and a[sc.SERVER_KIND] == "other"
    assert sc.PROMPT_TOKEN_IDS not in a and tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (
        "stop",)


def test_proxy_passes_the_stream_through(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as s:
            assert isinstance(s, openai.Stream)
            assert s.response.status_code == 200
            assert s.response.headers["content-type"] == "text/event-stream"
            n = sum(1 for _ in s)
    assert n == 4
    _, a = one_span(spans)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]


def test_n_choices_record_choice_0_ids_and_every_finish_reason(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[5, 6]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                     n=3))
    assert {c.choices[0].index for c in chunks} == {0, 1, 2}  # interleaved
    _, a = one_span(spans)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [5, 6]  # choice 0 only
    assert list(a[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75]
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop", "stop", "stop")
    assert a[sc.GEN_AI_REQUEST_CHOICE_COUNT] == 3


# -- how a stream ends -----------------------------------------------------------------------
def test_break_then_close_ends_the_span_with_what_was_read(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9, 10]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:  # the role chunk, then two tokens
                break
        assert chat_spans(spans) == []
        stream.close()
    span, a = one_span(spans)
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [7, 8]
    assert list(a[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75]
    assert sc.GEN_AI_RESPONSE_FINISH_REASONS not in a  # cut before the end
    assert span.status.status_code == StatusCode.UNSET


def test_break_on_the_first_chunk_then_close(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        for _ in stream:
            break
        stream.close()
    _, a = one_span(spans)
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == []


def test_leaving_the_with_block_early_ends_the_span(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as s:
            next(s)
            next(s)
        assert len(chat_spans(spans)) == 1
        assert s.response.is_closed
    _, a = one_span(spans)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11]


def test_garbage_collection_ends_the_span(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        next(stream)
        next(stream)
        assert chat_spans(spans) == []
        del stream
        gc.collect()
        span, a = one_span(spans)
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11]
    assert span.end_time is not None


def test_error_while_iterating_ends_the_span_with_error_type(spans, instrumented):
    # role chunk + 2 token chunks, then vLLM's in-stream error event
    with ScriptedServer(vllm=True, stream_error_after=3) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        got = []
        with pytest.raises(openai.APIError, match="scripted stream failure"):
            for chunk in client.chat.completions.create(model="m", messages=MESSAGES,
                                                        stream=True):
                got.append(chunk)
    assert len(got) == 3
    span, a = one_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert a[sc.ERROR_TYPE] == "APIError"
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12]
    assert any(e.name == "exception" for e in span.events)


def test_error_before_the_stream_starts(spans, instrumented):
    with ScriptedServer(vllm=True, status=503) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    span, a = one_span(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert a[sc.ERROR_TYPE] == "InternalServerError" and a[sc.LLM_STREAM] is True


def test_span_ends_once_however_many_ways_the_stream_ends(spans, instrumented, caplog):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with caplog.at_level(logging.WARNING):
            with client.chat.completions.create(model="m", messages=MESSAGES,
                                                stream=True) as stream:
                list(stream)
                with pytest.raises(StopIteration):
                    next(stream)
            stream.close()
            del stream
            gc.collect()
    assert len(chat_spans(spans)) == 1
    assert not [r for r in caplog.records if "ended span" in r.getMessage()]


def test_stream_helper_of_the_sdk_is_traced(spans, instrumented):
    with ScriptedServer(vllm=True, reply="abc") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with client.chat.completions.stream(model="m", messages=MESSAGES) as s:
            for _ in s:
                pass
            final = s.get_final_completion()
    assert final.choices[0].message.content == "abc"
    _, a = one_span(spans)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]


# -- async -----------------------------------------------------------------------------------
def test_async_stream_exhaustion_early_close_and_gc(spans, instrumented):
    async def main(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        with agl_bridge.episode("full"):
            stream = await client.chat.completions.create(model="m", messages=MESSAGES,
                                                          stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        with agl_bridge.episode("closed"):
            stream = await client.chat.completions.create(model="m", messages=MESSAGES,
                                                          stream=True)
        async with stream as s:
            assert isinstance(s, openai.AsyncStream)
            async for _ in s:
                break
        with agl_bridge.episode("collected"):
            stream = await client.chat.completions.create(model="m", messages=MESSAGES,
                                                          stream=True)
        await stream.__anext__()
        await stream.__anext__()
        del stream
        gc.collect()
        ended = len(chat_spans(spans))
        await client.close()
        return text, ended

    with ScriptedServer(vllm=True) as server:
        text, ended = asyncio.run(main(server.base_url))
    assert text == "hello" and ended == 3
    by_episode = {s.attributes[sc.EPISODE_ID]: s.attributes for s in chat_spans(spans)}
    assert list(by_episode["full"][sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]
    assert tuple(by_episode["full"][sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)
    assert list(by_episode["closed"][sc.COMPLETION_TOKEN_IDS]) == []
    assert list(by_episode["collected"][sc.COMPLETION_TOKEN_IDS]) == [11]
    for a in by_episode.values():
        assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1] and a[sc.LLM_STREAM] is True


def test_async_stream_errors(spans, instrumented):
    async def main(url, fail_url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass
        failing = openai.AsyncOpenAI(base_url=fail_url, api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError):
            await failing.chat.completions.create(model="m", messages=MESSAGES, stream=True)

    with ScriptedServer(vllm=True, stream_error_after=2) as server, \
            ScriptedServer(vllm=True, status=400) as failing:
        asyncio.run(main(server.base_url, failing.base_url))
    got = {s.attributes[sc.ERROR_TYPE]: s for s in chat_spans(spans)}
    assert set(got) == {"APIError", "BadRequestError"}
    assert all(s.status.status_code == StatusCode.ERROR for s in got.values())
    assert list(got["APIError"].attributes[sc.COMPLETION_TOKEN_IDS]) == [11]


def test_async_client_under_heavy_concurrency_keeps_each_span_in_its_episode(
        spans, instrumented):
    """240 concurrent calls, streamed and not, each in its own episode, on one AsyncOpenAI."""
    calls = 240

    def ids_for(body):
        i = int(body["messages"][-1]["content"].split()[-1])
        return [1000 + i, 1, 2], [i, i + 1, i + 2, i + 3]

    async def rollout(client, i):
        with agl_bridge.episode(f"e{i}", task_id=f"t{i % 7}"):
            await asyncio.sleep(0.0005 * (i % 5))
            kwargs = dict(model="m", messages=[{"role": "user", "content": f"episode {i}"}])
            if i % 2 == 0:
                response = await client.chat.completions.create(**kwargs)
                return i, response.choices[0].message.content, 4
            stream = await client.chat.completions.create(stream=True, **kwargs)
            if i % 4 == 3:  # leave early, then close
                text = ""
                async for chunk in stream:
                    text += chunk.choices[0].delta.content or ""
                    if chunk.choices[0].delta.role is None:
                        break
                await stream.close()
                return i, text, 1
            chunks = [c async for c in stream]
            assert all(getattr(c.choices[0], "token_ids", None) is None for c in chunks)
            return i, "".join(c.choices[0].delta.content or "" for c in chunks), 4

    async def main(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        try:
            return await asyncio.gather(*(rollout(client, i) for i in range(calls)))
        finally:
            await client.close()

    with ScriptedServer(vllm=True, ids_for=ids_for, chunk_delay_s=0.001) as server:
        results = asyncio.run(main(server.base_url))
    assert server.version_hits == 1  # concurrent first calls share one probe
    read = {i: n for i, _, n in results}
    assert all(text == "hello" for i, text, n in results if n == 4)
    got = chat_spans(spans)
    assert len(got) == calls
    seen = set()
    for span in got:
        a = span.attributes
        i = int(a[sc.EPISODE_ID][1:])
        seen.add(i)
        assert a[sc.TASK_ID] == f"t{i % 7}"
        assert a[sc.LLM_STREAM] is (i % 2 == 1)
        assert list(a[sc.PROMPT_TOKEN_IDS]) == [1000 + i, 1, 2]
        assert list(a[sc.COMPLETION_TOKEN_IDS]) == [i, i + 1, i + 2, i + 3][:read[i]]
        assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED
    assert seen == set(range(calls))


# -- tools and capture levels ----------------------------------------------------------------
def test_streamed_tool_calls_record_names_and_ids_but_no_text_by_default(spans, instrumented):
    with ScriptedServer(vllm=True, reply="", tool_calls=CALLS,
                        completion_ids=[1, 2, 3, 4, 5, 6, 7]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                     tools=TOOLS))
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    _, a = one_span(spans)
    assert tuple(a[sc.LLM_TOOL_NAMES]) == ("add",)
    assert tuple(a[sc.LLM_TOOL_CALL_NAMES]) == ("add", "mul")
    assert tuple(a[sc.LLM_TOOL_CALL_IDS]) == ("call_1", "call_2")
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [1, 2, 3, 4, 5, 6, 7]
    for name in (sc.GEN_AI_TOOL_DEFINITIONS, sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES):
        assert name not in a
    assert '"a": 1' not in json.dumps({k: str(v) for k, v in a.items()})  # no arguments


def test_messages_level_records_text_definitions_and_arguments_of_a_stream(
        spans, instrumented, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")
    with ScriptedServer(vllm=True, reply="let me add", tool_calls=CALLS[:1],
                        completion_ids=[1, 2, 3, 4]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        list(client.chat.completions.create(
            model="m", stream=True, tools=(t for t in TOOLS),  # a one-shot iterable
            messages=[{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "1+2?"}]}]))
    assert server.requests[0]["tools"] == TOOLS  # the SDK still got the whole generator
    _, a = one_span(spans)
    assert json.loads(a[sc.GEN_AI_TOOL_DEFINITIONS]) == TOOLS
    assert json.loads(a[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "1+2?"}]}]
    assert json.loads(a[sc.GEN_AI_OUTPUT_MESSAGES]) == [{
        "role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "text", "content": "let me add"},
            {"type": "tool_call", "id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        ]}]
    assert tuple(a[sc.LLM_TOOL_CALL_NAMES]) == ("add",)


def test_capture_none_asks_for_nothing_and_records_no_payload(spans, instrumented, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "none")
    with ScriptedServer(vllm=True, tool_calls=CALLS[:1]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                            tools=TOOLS))
        # even ids the caller asks for itself stay off the span
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                            logprobs=True, extra_body={"return_token_ids": True}))
    assert "return_token_ids" not in server.requests[0] and "logprobs" not in server.requests[0]
    assert server.version_hits == 0
    got = chat_spans(spans)
    assert len(got) == 2
    for span in got:
        a = span.attributes
        assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_NOT_CAPTURED
        for name in (sc.PROMPT_TOKEN_IDS, sc.COMPLETION_TOKEN_IDS, sc.COMPLETION_LOGPROBS,
                     sc.LLM_TOOL_NAMES, sc.LLM_TOOL_CALL_NAMES, sc.LLM_TOOL_CALL_IDS,
                     sc.GEN_AI_TOOL_DEFINITIONS, sc.GEN_AI_INPUT_MESSAGES,
                     sc.GEN_AI_OUTPUT_MESSAGES):
            assert name not in a
        assert a[sc.GEN_AI_RESPONSE_MODEL] == "m"  # structure stays


def test_stream_helper_left_early_ends_the_span_when_collected(spans, instrumented):
    # the SDK's ChatCompletionStream closes the HTTP response itself, not our proxy: the span
    # then ends when the helper's objects are collected
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with client.chat.completions.stream(model="m", messages=MESSAGES) as s:
            next(iter(s))
        del s
        gc.collect()
    _, a = one_span(spans)
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]


def test_a_request_we_cannot_read_still_goes_through(spans, instrumented, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        chunks = list(client.chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": 5}]))
    assert server.requests[0]["messages"] == [{"role": "user", "content": 5}]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello"
    _, a = one_span(spans)
    assert sc.GEN_AI_INPUT_MESSAGES not in a
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]


def test_raw_response_streams_are_traced_once_parsed(spans, instrumented):
    async def from_async(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        with agl_bridge.episode("async"):
            async with client.chat.completions.with_streaming_response.create(
                    model="m", messages=MESSAGES, stream=True) as response:
                stream = await response.parse()
                chunks = [c async for c in stream]
        await client.close()
        return chunks

    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.episode("sync"):
            raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES,
                                                                   stream=True)
        sync_chunks = list(raw.parse())
        async_chunks = asyncio.run(from_async(server.base_url))
    for chunks in (sync_chunks, async_chunks):
        assert [getattr(c.choices[0], "token_ids", None) for c in chunks] == [None] * 4
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello"
    got = {s.attributes[sc.EPISODE_ID]: s.attributes for s in chat_spans(spans)}
    assert set(got) == {"sync", "async"}
    for a in got.values():
        assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13] and a[sc.LLM_STREAM] is True


def test_async_stream_without_a_take_ends_its_span_on_exhaustion_and_close(
        spans, instrumented, monkeypatch):
    # capture "none" reads no ids, so the proxies iterate without activating a take
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "none")

    async def main(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async with stream as s:
            async for _ in s:
                break
        ended = len(chat_spans(spans))
        await client.close()
        return text, ended

    with ScriptedServer(vllm=True) as server:
        text, ended = asyncio.run(main(server.base_url))
    assert text == "hello" and ended == 2
    assert "return_token_ids" not in server.requests[0]
    for span in chat_spans(spans):
        assert sc.COMPLETION_TOKEN_IDS not in span.attributes
        assert span.attributes[sc.GEN_AI_RESPONSE_MODEL] == "m"


def test_stream_reasoning_deltas_are_recorded_and_deltas_without_extras_add_none(
        spans, provider, monkeypatch):
    from openai.types.chat import ChatCompletionChunk

    from agl_bridge.capture import CaptureLevel
    from agl_bridge.integrations.openai.request import Call
    from agl_bridge.integrations.openai.streams import StreamRecorder

    def chunk(delta, finish=None):
        return ChatCompletionChunk.model_validate({
            "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    call = Call({"model": "m", "messages": MESSAGES, "stream": True}, CaptureLevel.MESSAGES,
                "vllm", want_ids=False)
    recorder = StreamRecorder(provider.get_tracer("t").start_span("chat m"), call)
    for c in (chunk({"role": "assistant", "reasoning_content": "think "}),
              chunk({"reasoning": "more", "content": None}),
              chunk({"content": "42"}),
              chunk({"content": "", "reasoning_content": None}, finish="stop")):
        recorder.process(c)
    recorder.end()
    (span,) = spans.get_finished_spans()
    assert json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [{
        "role": "assistant", "finish_reason": "stop", "parts": [
            {"type": "reasoning", "content": "think more"}, {"type": "text", "content": "42"}]}]
