import asyncio
import gc
import json

import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import OpenAIInstrumentor, ServerProbe
from tests.integrations.openai.openai_spans import chat_spans
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "user", "content": "hi"}]


def test_vllm_server_gets_token_ids_requested_and_recorded(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.episode("e1", task_id="t1"), agl_bridge.agent("solver"), agl_bridge.turn(1):
            response = client.chat.completions.create(
                model="m", messages=MESSAGES, temperature=0.7, max_tokens=5)
    (body,) = server.requests
    assert body["return_token_ids"] is True and body["logprobs"] is True
    (span,) = chat_spans(spans)
    assert span.name == "chat m" and span.kind == SpanKind.CLIENT
    a = span.attributes
    assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [7, 8, 9]
    assert list(a[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75, -1.0]
    assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED and a[sc.SERVER_KIND] == "vllm"
    assert (a[sc.EPISODE_ID], a[sc.TASK_ID], a[sc.GEN_AI_AGENT_NAME], a[sc.TURN_INDEX]) == (
        "e1", "t1", "solver", 1)
    assert a[sc.GEN_AI_OPERATION_NAME] == "chat" and a[sc.GEN_AI_REQUEST_MODEL] == "m"
    assert a[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.7 and a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 5
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (4, 3)
    assert a[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-scripted"
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)
    # the caller sees what it would have seen without us: vLLM's nulls for fields not asked for
    assert response.prompt_token_ids is None and response.choices[0].token_ids is None
    assert response.choices[0].logprobs is None


def test_response_equals_the_uninstrumented_one(spans):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        plain = client.chat.completions.create(model="m", messages=MESSAGES).model_dump()
        inst = OpenAIInstrumentor()
        inst.instrument()
        try:
            traced = client.chat.completions.create(model="m", messages=MESSAGES).model_dump()
        finally:
            inst.uninstrument()
    assert traced == plain
    assert len(chat_spans(spans)) == 1


def test_caller_asking_for_logprobs_and_ids_keeps_them(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(
            model="m", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True})
    assert response.choices[0].token_ids == [11, 12, 13]
    assert [t.logprob for t in response.choices[0].logprobs.content] == [-0.5, -0.75, -1.0]


def test_other_servers_get_exactly_the_callers_request(spans, instrumented):
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        client.chat.completions.create(model="gpt-x", messages=MESSAGES)
        client.chat.completions.create(model="gpt-x", messages=MESSAGES)
    assert all("return_token_ids" not in b and "logprobs" not in b for b in server.requests)
    assert server.version_hits == 1  # probed once per base URL, remembered
    for span in chat_spans(spans):
        assert span.attributes[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_NOT_REQUESTED
        assert sc.PROMPT_TOKEN_IDS not in span.attributes


def test_async_client_records_ids_in_the_right_episode(spans, instrumented):
    async def rollout(client, i):
        with agl_bridge.episode(f"e{i}"):
            await asyncio.sleep(0.001 * (5 - i))
            await client.chat.completions.create(model="m", messages=MESSAGES * (i + 1))

    async def main(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k")
        await asyncio.gather(*(rollout(client, i) for i in range(5)))

    with ScriptedServer(vllm=True) as server:
        asyncio.run(main(server.base_url))
    got = {s.attributes[sc.EPISODE_ID]: list(s.attributes[sc.PROMPT_TOKEN_IDS])
           for s in chat_spans(spans)}
    # the scripted prompt ids end with the message count, which differs per episode
    assert got == {f"e{i}": [1, 2, 3, i + 1] for i in range(5)}


def test_errors_end_the_span_with_error_type(spans, instrumented):
    with ScriptedServer(vllm=True, status=500) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=MESSAGES)
    (span,) = chat_spans(spans)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "InternalServerError"


def test_token_ids_never_mode_and_bad_mode(spans):
    inst = OpenAIInstrumentor()
    inst.instrument(token_ids="never")
    try:
        with ScriptedServer(vllm=True) as server:
            openai.OpenAI(base_url=server.base_url, api_key="k").chat.completions.create(
                model="m", messages=MESSAGES)
        assert "return_token_ids" not in server.requests[0] and server.version_hits == 0
    finally:
        inst.uninstrument()
    with pytest.raises(ValueError, match="AGL_BRIDGE_TOKEN_IDS"):
        OpenAIInstrumentor().instrument(token_ids="sometimes")
    OpenAIInstrumentor().uninstrument()


def test_uninstrument_restores_the_client(spans):
    inst = OpenAIInstrumentor()
    inst.instrument()
    inst.uninstrument()
    with ScriptedServer(vllm=True) as server:
        openai.OpenAI(base_url=server.base_url, api_key="k").chat.completions.create(
            model="m", messages=MESSAGES)
    assert chat_spans(spans) == [] and "return_token_ids" not in server.requests[0]


def test_probe_url_and_unreachable_server():
    assert ServerProbe.version_url("http://h:1/v1/") == "http://h:1/version"
    assert ServerProbe.version_url("http://h:1/api") == "http://h:1/api/version"
    probe = ServerProbe(timeout_s=0.5)
    assert probe.kind("http://127.0.0.1:9/v1") == "other"


# -- tools, choices, capture levels (non-streaming) -------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]
CALLS = [{"id": "call_1", "name": "add", "arguments": '{"a": 1}'}]


def test_tool_calls_in_a_response_record_names_and_ids(spans, instrumented):
    with ScriptedServer(vllm=True, tool_calls=CALLS) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    assert response.choices[0].message.tool_calls[0].function.name == "add"
    (span,) = chat_spans(spans)
    a = span.attributes
    assert tuple(a[sc.LLM_TOOL_NAMES]) == ("add", "mul")
    assert tuple(a[sc.LLM_TOOL_CALL_NAMES]) == ("add",)
    assert tuple(a[sc.LLM_TOOL_CALL_IDS]) == ("call_1",)
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert a[sc.LLM_STREAM] is False
    for name in (sc.GEN_AI_TOOL_DEFINITIONS, sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES):
        assert name not in a  # text only at the messages level


def test_n_choices_record_every_finish_reason_and_choice_0_ids(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[4, 5]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(model="m", messages=MESSAGES, n=2)
    assert len(response.choices) == 2
    assert all(c.token_ids is None and c.logprobs is None for c in response.choices)
    (span,) = chat_spans(spans)
    a = span.attributes
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop", "stop")
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [4, 5]


def test_messages_level_records_the_conversation(spans, instrumented, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")
    with ScriptedServer(vllm=True, reply="3", tool_calls=CALLS) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        first = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
        # the SDK's own message object goes back into the conversation, as agents do
        history = [*MESSAGES, first.choices[0].message,
                   {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
        client.chat.completions.create(model="m", messages=history)
    first_span, second_span = chat_spans(spans)
    a = first_span.attributes
    assert json.loads(a[sc.GEN_AI_TOOL_DEFINITIONS]) == TOOLS
    assert json.loads(a[sc.GEN_AI_OUTPUT_MESSAGES]) == [{
        "role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "text", "content": "3"},
            {"type": "tool_call", "id": "call_1", "name": "add", "arguments": '{"a": 1}'}]}]
    assert json.loads(second_span.attributes[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
        {"role": "assistant", "parts": [
            {"type": "text", "content": "3"},
            {"type": "tool_call", "id": "call_1", "name": "add", "arguments": '{"a": 1}'}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1",
                                    "response": "3"}]}]
    assert list(a[sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]  # ids too: messages > token_ids


def test_capture_none_asks_the_server_for_nothing(spans, instrumented, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "none")
    with ScriptedServer(vllm=True, tool_calls=CALLS) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        response = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    (body,) = server.requests
    assert "return_token_ids" not in body and "logprobs" not in body
    assert response.choices[0].message.content == "hello"
    (span,) = chat_spans(spans)
    a = span.attributes
    assert a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_NOT_CAPTURED
    for name in (sc.PROMPT_TOKEN_IDS, sc.COMPLETION_TOKEN_IDS, sc.COMPLETION_LOGPROBS,
                 sc.LLM_TOOL_NAMES, sc.LLM_TOOL_CALL_NAMES, sc.LLM_TOOL_CALL_IDS,
                 sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES,
                 sc.GEN_AI_TOOL_DEFINITIONS):
        assert name not in a
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (4, 3)
    assert a[sc.POLICY_VERSION] == "m"


def test_policy_version_of_the_scope_wins_over_the_model(spans, instrumented):
    from agl_bridge.scope import scoped

    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with scoped(policy_version="team@v3"):
            client.chat.completions.create(model="team@v4", messages=MESSAGES)
            stream = client.chat.completions.create(model="team@v4", messages=MESSAGES,
                                                    stream=True)
        list(stream)  # read outside the scope: the span keeps the scope of its call
        client.chat.completions.create(model="team@v4", messages=MESSAGES)
    assert [s.attributes[sc.POLICY_VERSION] for s in chat_spans(spans)] == [
        "team@v3", "team@v3", "team@v4"]


def test_raw_responses_are_recorded_when_parsed(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.episode("raw"):
            raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        assert raw.headers["content-type"] == "application/json" and chat_spans(spans) == []
        parsed = raw.parse()
        assert raw.parse() is parsed  # parse() twice: one object, one record
        assert parsed.prompt_token_ids is None and parsed.choices[0].token_ids is None
        assert parsed.choices[0].logprobs is None
        with agl_bridge.episode("streaming-response"):
            with client.chat.completions.with_streaming_response.create(
                    model="m", messages=MESSAGES) as response:
                assert response.parse().choices[0].message.content == "hello"
        with agl_bridge.episode("never-parsed"):
            raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        del raw
        gc.collect()
    got = {s.attributes[sc.EPISODE_ID]: s.attributes for s in chat_spans(spans)}
    assert set(got) == {"raw", "streaming-response", "never-parsed"}
    for name in ("raw", "streaming-response"):
        assert list(got[name][sc.COMPLETION_TOKEN_IDS]) == [11, 12, 13]
    assert sc.COMPLETION_TOKEN_IDS not in got["never-parsed"]
