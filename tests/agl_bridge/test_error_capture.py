"""Error text follows the capture level (issue 14, item 14): an exception's message can carry the
prompt (a server error body that echoes the request) or a tool's secret arguments, so below
``messages`` no span keeps it: not the status, not an event, not an attribute. At ``messages``
the full text is kept."""

import asyncio
import json
from typing import TypedDict

import httpx
import openai
import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.capture import CAPTURE_ENV, CaptureLevel
from tests.scripted_server import ScriptedServer

PROMPT = "the launch code is 0451-tango"
SECRET = "acct-9f8e7d-hunter2"
LEVELS = ["none", "token_ids", "messages"]


def echo(body):
    """A server error that quotes the request back, as some servers and proxies do."""
    return "cannot serve this request: " + json.dumps(body.get("messages"))


def span_text(span) -> str:
    """Everything a span carries that could hold text."""
    return repr((span.name, span.status.description, dict(span.attributes or {}),
                 [(e.name, dict(e.attributes or {})) for e in span.events],
                 [dict(link.attributes or {}) for link in span.links]))


def exception_event(span):
    (event,) = [e for e in span.events if e.name == "exception"]
    return event.attributes


def assert_scrubbed(finished, text):
    leaks = [s.name for s in finished if text in span_text(s)]
    assert leaks == []


@pytest.fixture(params=LEVELS)
def level(request, monkeypatch):
    monkeypatch.setenv(CAPTURE_ENV, request.param)
    return request.param


# -- the openai instrumentor -------------------------------------------------------------------
def test_a_server_error_that_echoes_the_prompt(level, spans, instrumented):
    with ScriptedServer(vllm=True, status=400, error_message=echo) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as raised:
            with agl_bridge.episode("e1"), agl_bridge.agent("solver"):
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": PROMPT}])
    assert PROMPT in str(raised.value)  # the server did echo it
    finished = spans.get_finished_spans()
    assert sorted(s.name for s in finished) == sorted(
        ["chat m", "invoke_agent solver", sc.SPAN_EPISODE])
    for span in finished:  # the chat span, and the agent and episode spans it left through
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes[sc.ERROR_TYPE] == "BadRequestError"
    (chat,) = [s for s in finished if s.name == "chat m"]
    if level == "messages":
        assert PROMPT in chat.status.description
        assert PROMPT in exception_event(chat)["exception.message"]
        assert PROMPT in exception_event(chat)["exception.stacktrace"]
    else:
        assert_scrubbed(finished, PROMPT)
        assert chat.status.description == "BadRequestError (HTTP 400)"
        event = exception_event(chat)
        assert event["exception.type"] == "openai.BadRequestError"
        assert event["exception.message"] == "BadRequestError (HTTP 400)"
        assert 'File "' in event["exception.stacktrace"]  # where it happened is still kept


def test_an_async_stream_error_that_echoes_the_prompt(level, spans, instrumented):
    async def consume(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], stream=True)
        async for _ in stream:
            pass

    with ScriptedServer(vllm=True, stream_error_after=2, error_message=echo) as server:
        with pytest.raises(openai.APIError) as raised:
            asyncio.run(consume(server.base_url))
    assert PROMPT in str(raised.value)
    (chat,) = spans.get_finished_spans()
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.attributes[sc.ERROR_TYPE] == "APIError"
    if level == "messages":
        assert PROMPT in chat.status.description
    else:
        assert_scrubbed([chat], PROMPT)
        assert chat.status.description == "APIError"


# -- @agl_bridge.tool ----------------------------------------------------------------------------
@agl_bridge.tool
def unlock(account: str) -> str:
    """Unlock an account."""
    raise PermissionError(f"account {account} is locked")


def test_a_tool_exception_that_carries_a_secret(level, spans):
    with pytest.raises(PermissionError), agl_bridge.agent("solver"):
        unlock(SECRET)
    finished = spans.get_finished_spans()
    assert sorted(s.name for s in finished) == ["execute_tool unlock", "invoke_agent solver"]
    for span in finished:
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes[sc.ERROR_TYPE] == "PermissionError"
    (tool,) = [s for s in finished if s.name == "execute_tool unlock"]
    if level == "messages":
        assert SECRET in tool.status.description
        assert SECRET in exception_event(tool)["exception.message"]
    else:
        assert_scrubbed(finished, SECRET)
        assert tool.status.description == "PermissionError"


# -- LangChain / LangGraph -----------------------------------------------------------------------
@pytest.fixture
def langchain_on():
    from agl_bridge.integrations.langchain import LangChainInstrumentor
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(routing=False)
    LangChainInstrumentor().instrument()
    yield
    LangChainInstrumentor().uninstrument()
    OpenAIInstrumentor().uninstrument()


@pytest.mark.parametrize("failing", ["model", "tool"])
def test_langchain_errors_keep_their_text_by_level(failing, level, spans, langchain_on):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        question: str
        answer: str

    @tool
    def lookup(account: str) -> str:
        """Look an account up."""
        raise ValueError(f"account {account} is locked")

    with ScriptedServer(vllm=True, status=400, error_message=echo) as server:
        llm = ChatOpenAI(model="m", base_url=server.base_url, api_key="k", max_retries=0)

        def solver(state):
            if failing == "tool":
                lookup.invoke({"account": state["question"]})
            return {"answer": llm.invoke(state["question"]).content}

        graph = StateGraph(State)
        graph.add_node("solver", solver)
        graph.add_edge(START, "solver")
        graph.add_edge("solver", END)
        question = SECRET if failing == "tool" else PROMPT
        with pytest.raises((openai.BadRequestError, ValueError)):
            graph.compile().invoke({"question": question})
    finished = spans.get_finished_spans()
    failed = [s for s in finished if s.status.status_code == StatusCode.ERROR]
    expected = "execute_tool lookup" if failing == "tool" else "chat m"
    assert expected in [s.name for s in failed] and "invoke_agent solver" in [
        s.name for s in failed]
    if level == "messages":
        (span,) = [s for s in failed if s.name == expected]
        assert question in span.status.description
    else:
        assert_scrubbed(finished, question)


# -- AutoGen -------------------------------------------------------------------------------------
@pytest.fixture
def autogen_on():
    from agl_bridge.integrations.autogen import AutoGenInstrumentor
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(routing=False)
    AutoGenInstrumentor().instrument()
    yield
    AutoGenInstrumentor().uninstrument()
    OpenAIInstrumentor().uninstrument()


def test_autogen_agent_spans_keep_error_text_by_level(level, spans, autogen_on):
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = {"vision": False, "function_calling": True, "json_output": False,
            "family": "unknown", "structured_output": False}
    with ScriptedServer(vllm=True, status=400, error_message=echo) as server:
        client = OpenAIChatCompletionClient(model="m", base_url=server.base_url, api_key="k",
                                            model_info=info, max_retries=0)
        agent = AssistantAgent("solver", model_client=client)
        with pytest.raises(openai.BadRequestError):
            asyncio.run(agent.run(task=PROMPT))
    finished = spans.get_finished_spans()
    (autogen_agent,) = [s for s in finished if s.name == "invoke_agent solver"]
    assert autogen_agent.status.status_code == StatusCode.ERROR
    assert autogen_agent.attributes[sc.ERROR_TYPE] == "BadRequestError"
    if level == "messages":
        assert PROMPT in autogen_agent.status.description
    else:
        assert_scrubbed(finished, PROMPT)  # autogen-core's own agent span included


# -- the helper itself ---------------------------------------------------------------------------
def test_http_status_is_all_an_http_error_adds():
    from agl_bridge.errors import error_summary

    request = httpx.Request("POST", "http://h/v1/chat/completions")
    response = httpx.Response(503, request=request, text=PROMPT)
    exc = httpx.HTTPStatusError(PROMPT, request=request, response=response)
    assert error_summary(exc) == "HTTPStatusError (HTTP 503)"
    assert error_summary(KeyError(PROMPT)) == "KeyError"


def test_a_bad_capture_setting_scrubs_and_never_raises(monkeypatch, spans):
    from agl_bridge.errors import record_error

    monkeypatch.setenv(CAPTURE_ENV, "everything")
    span = trace.get_tracer("t").start_span("s")
    record_error(span, RuntimeError(PROMPT))  # must not replace the caller's error
    span.end()
    (done,) = spans.get_finished_spans()
    assert_scrubbed([done], PROMPT)
    assert done.status.description == "RuntimeError" and done.attributes[sc.ERROR_TYPE]


def test_the_level_can_be_given(spans):
    from agl_bridge.errors import record_error

    span = trace.get_tracer("t").start_span("s")
    record_error(span, RuntimeError(PROMPT), level=CaptureLevel.MESSAGES)
    span.end()
    (done,) = spans.get_finished_spans()
    assert done.status.description == f"RuntimeError: {PROMPT}"
