"""Alias routing is not tracing (issue 14, item 10): agents get the live adapter version inside
``suppress_instrumentation()``, with the OpenAI instrumentor uninstrumented or never on, and the
tracing wrapper, when it is on, records the alias and the version that answered."""

import asyncio
import json

import openai
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from agl_bridge import semconv as sc
from agl_bridge.aliases import ALIASES_ENV
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "aliases.json"
    path.write_text(json.dumps({"aliases": {"team": "team@v1"}}))
    monkeypatch.setenv(ALIASES_ENV, str(path))
    return path


@pytest.fixture(autouse=True)
def routing_off_afterwards():
    """Routing is process-wide; each test starts and ends with it off."""
    from agl_bridge.integrations.openai import disable_routing

    disable_routing()
    yield
    disable_routing()


def chat_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("chat")]


def ask(client, model="team"):
    return client.chat.completions.create(model=model, messages=MESSAGES)


async def ask_async(base_url, model="team"):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    return await client.chat.completions.create(model=model, messages=MESSAGES)


def test_routing_works_inside_suppress_instrumentation(table, spans, instrumented):
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with suppress_instrumentation():
            ask(client)
            asyncio.run(ask_async(server.base_url))
        ask(client)
    assert [b["model"] for b in server.requests] == ["team@v1"] * 3
    (span,) = chat_spans(spans)  # suppressed calls are not traced, yet they are routed
    assert span.attributes[sc.POLICY_ALIAS] == "team"


def test_routing_outlives_the_instrumentor(table, spans):
    inst = OpenAIInstrumentor()
    inst.instrument()
    inst.uninstrument()
    with ScriptedServer(vllm=False) as server:
        ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
        asyncio.run(ask_async(server.base_url))
    assert [b["model"] for b in server.requests] == ["team@v1"] * 2
    assert chat_spans(spans) == []


def test_routing_on_its_own_and_off_again(table, spans):
    from agl_bridge.integrations.openai import disable_routing, enable_routing, routing_enabled

    enable_routing()
    assert routing_enabled()
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client)
        disable_routing()
        ask(client)
    assert [b["model"] for b in server.requests] == ["team@v1", "team"]
    assert not routing_enabled() and chat_spans(spans) == []
    # both slots empty: the client is the SDK's own again
    from openai.resources.chat.completions import AsyncCompletions, Completions
    from wrapt import ObjectProxy

    assert not isinstance(vars(Completions)["create"], ObjectProxy)
    assert not isinstance(vars(AsyncCompletions)["create"], ObjectProxy)


@pytest.mark.parametrize("routing_first", [True, False])
def test_the_span_records_the_alias_and_the_version_that_answered(
        routing_first, table, spans):
    from agl_bridge.integrations.openai import enable_routing

    inst = OpenAIInstrumentor()
    if routing_first:
        enable_routing()
    inst.instrument()
    try:
        with ScriptedServer(vllm=True) as server:
            response = ask(openai.OpenAI(base_url=server.base_url, api_key="k"))
            asyncio.run(ask_async(server.base_url))
    finally:
        inst.uninstrument()
    assert response.model == "team@v1"  # what answered, as vLLM says
    for span in chat_spans(spans):
        a = span.attributes
        assert span.name == "chat team@v1" and a[sc.GEN_AI_REQUEST_MODEL] == "team@v1"
        assert a[sc.POLICY_ALIAS] == "team" and a[sc.POLICY_VERSION] == "team@v1"
    assert len(chat_spans(spans)) == 2


def test_instrument_with_routing_off_sends_names_as_written(table, spans):
    inst = OpenAIInstrumentor()
    inst.instrument(routing=False)
    try:
        with ScriptedServer(vllm=False) as server:
            ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    finally:
        inst.uninstrument()
    assert server.requests[0]["model"] == "team"
    (span,) = chat_spans(spans)
    assert sc.POLICY_ALIAS not in span.attributes


def test_a_failing_router_never_fails_the_call(table, spans, caplog):
    from agl_bridge.integrations.openai import patch

    def broken(kwargs):
        raise RuntimeError("boom")

    patch.set_router(broken)
    try:
        with ScriptedServer(vllm=False) as server:
            response = ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    finally:
        patch.set_router(None)
    assert response.choices[0].message.content == "hello"
    assert server.requests[0]["model"] == "team"
    assert any("alias routing failed" in r.getMessage() for r in caplog.records)


def test_the_routing_instrumentor_routes_without_tracing(table, spans):
    from agl_bridge.integrations.openai import RoutingInstrumentor, routing_enabled

    inst = RoutingInstrumentor()
    inst.instrument()
    try:
        assert routing_enabled()
        with ScriptedServer(vllm=False) as server:
            ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
        assert [b["model"] for b in server.requests] == ["team@v1"]
        assert chat_spans(spans) == []  # routed, not traced
    finally:
        inst.uninstrument()
    assert not routing_enabled()


def test_by_agent_a_shared_client_reaches_each_agents_live_version(tmp_path, monkeypatch, spans):
    """Issue 29.1: one model client shared by every agent (the frameworks' usual pattern) asks
    for one model name; with ``AGL_BRIDGE_ROUTE_BY=agent`` each call goes to the live version of
    its agent's alias; an agent without an alias, or a call outside any agent, goes by model."""
    import agl_bridge
    from agl_bridge.aliases import ROUTE_BY_ENV
    from agl_bridge.integrations.openai import enable_routing

    path = tmp_path / "aliases.json"
    path.write_text(json.dumps({"aliases": {"planner": "planner@v3", "analyst": "analyst@v1"}}))
    monkeypatch.setenv(ALIASES_ENV, str(path))
    enable_routing()
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

        def team() -> None:
            for name in ("planner", "analyst", "critic"):
                with agl_bridge.agent(name):
                    ask(client, model="gpt-4o")
            ask(client, model="planner")

        team()  # by model name only: the default
        monkeypatch.setenv(ROUTE_BY_ENV, "agent")
        team()
    sent = [b["model"] for b in server.requests]
    assert sent[:4] == ["gpt-4o", "gpt-4o", "gpt-4o", "planner@v3"]
    assert sent[4:] == ["planner@v3", "analyst@v1", "gpt-4o", "planner@v3"]


def test_a_version_unloaded_under_a_stale_table_falls_back_instead_of_failing(tmp_path,
                                                                              monkeypatch,
                                                                              spans, caplog):
    """Issue 30.1: the alias server was down through a publish; the agents kept their table
    (coder@v4), the publisher unloaded v4 after its drain, and 85 of 85 calls answered 404
    until the table came back. A routed call whose version is gone now goes to the model the
    program asked for if the server has it, else the base model, sync and async."""
    import logging

    from agl_bridge.integrations.openai import enable_routing

    path = tmp_path / "aliases.json"
    path.write_text(json.dumps({"aliases": {"coder": "coder@v4", "base": "coder@v4"}}))
    monkeypatch.setenv(ALIASES_ENV, str(path))
    enable_routing()
    with ScriptedServer(vllm=True, lora=True, base_model="base") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with caplog.at_level(logging.WARNING):
            first = ask(client, model="base")  # a shared client that asks for the base
            second = ask(client, model="coder")  # an alias vLLM does not serve itself
            third = asyncio.run(ask_async(server.base_url, model="coder"))
        sent = [b["model"] for b in server.requests if "messages" in b]
    assert sent == ["coder@v4", "base", "coder@v4", "base", "coder@v4", "base"]
    assert (first.model, second.model, third.model) == ("base", "base", "base")
    assert "coder@v4 is no longer served" in caplog.text
    with ScriptedServer(vllm=True, status=404) as server:  # it cannot say what it serves
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.NotFoundError):  # the call's own error, as without routing
            ask(client, model="coder")
        assert [b["model"] for b in server.requests] == ["coder@v4"]
        assert "/v1/models" in server.gets  # asked, after the 404
    with ScriptedServer(vllm=True, status=500) as server:  # not a 404: the server is not asked
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            ask(client, model="coder")
        assert "/v1/models" not in server.gets and len(server.requests) == 1
