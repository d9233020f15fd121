"""Live prompt swap (issue 33, item 2): with ``AGL_BRIDGE_PROMPTS`` naming a prompt table, an
agent's system message is the live version of its prompt on its next call, the chat span
records the version, p0 is the agent's own prompt, and a table that cannot be used never fails
a call. Off unless asked. In-process on the scripted server; zero-code in ``test_e2e``-free
subprocesses below."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import openai
import pyarrow.parquet as pq
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.integrations.openai import disable_prompt_swap, disable_routing
from agl_bridge.integrations.openai.prompt_swap import (
    enable_prompt_swap,
    prompt_swap_enabled,
    with_prompt,
)
from agl_bridge.prompts import PROMPTS_ENV
from agl_bridge.trainer.serving.prompts import PromptRegistry
from tests.paths import AGENTS, ROOT
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "system", "content": "You write."}, {"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def swap_off_afterwards():
    disable_prompt_swap()
    yield
    disable_prompt_swap()
    disable_routing()


@pytest.fixture
def registry(tmp_path, monkeypatch):
    reg = PromptRegistry(tmp_path / "reg")
    monkeypatch.setenv(PROMPTS_ENV, str(reg.table_path))
    return reg


def chat_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("chat")]


def ask(client, agent: str | None = "writer", messages=MESSAGES):
    if agent is None:
        return client.chat.completions.create(model="base", messages=messages)
    with agl_bridge.agent(agent):
        return client.chat.completions.create(model="base", messages=messages)


def systems(server):
    return [b["messages"][0]["content"] for b in server.requests]


def test_the_live_version_on_the_next_call_and_rollback_in_one_step(registry, spans,
                                                                    instrumented):
    messages = [dict(m) for m in MESSAGES]
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client, messages=messages)  # no table yet: the agent's own prompt, p0
        registry.publish("writer", "You write short, exact answers.")
        ask(client, messages=messages)
        registry.publish("writer", "Version two.")
        ask(client, messages=messages)
        registry.rollback("writer", "p0")
        ask(client, messages=messages)
    assert systems(server) == ["You write.", "You write short, exact answers.", "Version two.",
                               "You write."]
    assert messages == MESSAGES  # the caller's list is never changed
    assert [b["messages"][1] for b in server.requests] == [MESSAGES[1]] * 4
    assert [s.attributes[sc.PROMPT_VERSION] for s in chat_spans(spans)] == \
        ["writer@p0", "writer@p1", "writer@p2", "writer@p0"]


def test_only_the_agent_named_is_swapped(registry, spans, instrumented):
    registry.publish("writer", "Writer's live prompt.")
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client, "reviewer")  # no entry: its own prompt, recorded as p0
        ask(client, None)  # no agent: untouched, nothing recorded
        ask(client, "writer", [{"role": "user", "content": "hi"}])  # no system message
    assert systems(server) == ["You write.", "You write.", "Writer's live prompt."]
    assert server.requests[2]["messages"][1] == {"role": "user", "content": "hi"}
    versions = [s.attributes.get(sc.PROMPT_VERSION) for s in chat_spans(spans)]
    assert versions == ["reviewer@p0", None, "writer@p1"]


def test_the_table_over_http_for_agents_on_other_hosts(tmp_path, spans, instrumented,
                                                       monkeypatch, caplog):
    """``agl-bridge aliases-serve`` serves the registry's prompt table at ``/prompts``; an agent
    with ``AGL_BRIDGE_PROMPTS`` set to that URL follows publishes and rollbacks by polling, and
    keeps the last good table while the server is gone."""
    import time

    from agl_bridge.prompts import HttpPromptTable, default_prompt_table
    from agl_bridge.trainer.serving.alias_server import AliasServer

    reg = PromptRegistry(tmp_path / "reg")
    monkeypatch.setenv("AGL_BRIDGE_ALIASES_POLL_S", "0.05")
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with AliasServer(reg.directory) as tables:
            monkeypatch.setenv(PROMPTS_ENV, tables.prompts_url)
            assert tables.prompts_url.endswith("/prompts")
            with caplog.at_level(logging.WARNING):
                ask(client)  # nothing published yet: 404, the agent's own prompt
            assert "prompt table http" in caplog.text and "HTTP 404" in caplog.text
            table = default_prompt_table()
            assert isinstance(table, HttpPromptTable)

            def until(version):
                deadline = time.monotonic() + 5
                while getattr(table.live("writer"), "version", None) != version:
                    assert time.monotonic() < deadline, f"{version} never reached the poller"
                    time.sleep(0.01)

            reg.publish("writer", "Served over HTTP.")
            until("writer@p1")
            ask(client)
            reg.rollback("writer", "p0")
            until("writer@p0")
            ask(client)
            reg.publish("writer", "Second.")
            until("writer@p2")
        with caplog.at_level(logging.WARNING):
            time.sleep(0.3)  # the table's server is gone: polls fail, the last good table stays
            ask(client)
    assert "keeping the table read before (1 agents)" in caplog.text
    assert systems(server) == ["You write.", "Served over HTTP.", "You write.", "Second."]
    assert [s.attributes[sc.PROMPT_VERSION] for s in chat_spans(spans)] == \
        ["writer@p0", "writer@p1", "writer@p0", "writer@p2"]
    monkeypatch.delenv(PROMPTS_ENV)
    table.close()


def test_off_unless_asked(tmp_path, spans, instrumented, monkeypatch):
    monkeypatch.delenv(PROMPTS_ENV, raising=False)
    assert prompt_swap_enabled()  # the instrumentor turns it on; without a table it does nothing
    with ScriptedServer(vllm=False) as server:
        ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    assert server.requests[0]["messages"] == MESSAGES
    assert sc.PROMPT_VERSION not in chat_spans(spans)[0].attributes


def test_swapped_without_tracing_inside_suppression_and_async(registry, spans):
    registry.publish("writer", "Live.")
    enable_prompt_swap()

    async def ask_async(base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        with agl_bridge.agent("writer"):
            return await client.chat.completions.create(model="base", messages=MESSAGES)

    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with suppress_instrumentation():
            ask(client)
        asyncio.run(ask_async(server.base_url))
    assert systems(server) == ["Live.", "Live."]
    assert chat_spans(spans) == []


@pytest.mark.parametrize("content, problem", [
    ("{", "it is not valid JSON"),
    ('{"prompts": {"writer": {"version": "writer@p2", "text": ""}}}',
     "agent 'writer': text '' is not a non-empty string"),
    ('{"prompts": {"writer": {"version": "writer@p2"}}}', "text None is not"),
    ('{"prompts": {"writer": {"version": "writer-p2", "text": "x"}}}',
     "version 'writer-p2' is not writer@p<N>"),
    ('{"prompts": []}', '"prompts" is a list, not an object'),
    ('{"prompts": {"a b": {"version": "a b@p1", "text": "x"}}}', "agent name 'a b'"),
])
def test_an_unusable_table_never_fails_a_call(registry, spans, instrumented, caplog, content,
                                             problem):
    registry.publish("writer", "Good version.")
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client)
        registry.table_path.write_text(content)
        with caplog.at_level(logging.WARNING, logger="agl_bridge"):
            ask(client)
            ask(client)
    assert systems(server) == ["Good version."] * 3  # the last good table stays in force
    warnings = [r.getMessage() for r in caplog.records if "prompt file" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per version of the file
    assert problem in warnings[0] and str(registry.table_path) in warnings[0]
    assert PROMPTS_ENV in warnings[0]


def test_no_table_ever_good_swaps_nothing(tmp_path, spans, instrumented, monkeypatch, caplog):
    monkeypatch.setenv(PROMPTS_ENV, str(tmp_path / "missing.json"))
    with ScriptedServer(vllm=False) as server, caplog.at_level(logging.WARNING):
        ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0))
    assert systems(server) == ["You write."]
    assert any("does not exist" in r.getMessage() and "no prompt is swapped" in r.getMessage()
               for r in caplog.records)


def test_with_prompt_keeps_other_fields_and_inserts_when_missing():
    out = with_prompt([{"role": "developer", "content": "x", "name": "n"}], "new")
    assert out == [{"role": "developer", "content": "new", "name": "n"}]
    assert with_prompt([], "new") == [{"role": "system", "content": "new"}]


def test_zero_code_autogen_team_follows_the_table(tmp_path):
    """An AutoGen team with no agl-bridge code, under AGL_BRIDGE_AUTO=1: the writer's system
    message is the published version, the reviewer's its own; the spans say which."""
    reg = PromptRegistry(tmp_path / "reg")
    reg.publish("writer", "Published writer prompt.")
    with ScriptedServer(vllm=True) as server:
        env = {**os.environ, "AGL_BRIDGE_AUTO": "1", "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "k", PROMPTS_ENV: str(reg.table_path),
               "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "spans"), "PYTHONWARNINGS": "ignore"}
        out = subprocess.run([sys.executable, str(AGENTS / "prompted_team.py")], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    by_agent = {}
    for body in server.requests:
        first = body["messages"][0]
        by_agent.setdefault(first["content"], 0)
        by_agent[first["content"]] += 1
    assert set(by_agent) == {"Published writer prompt.", "You review the writer's answer."}
    table = pq.read_table(tmp_path / "spans")
    rows = [json.loads(a) for a, op in zip(table["attributes"].to_pylist(),
                                           table["operation_name"].to_pylist()) if op == "chat"]
    assert sorted(r[sc.PROMPT_VERSION] for r in rows) == ["reviewer@p0", "writer@p1"]


def test_langgraph_agents_follow_the_table(registry, spans):
    """LangChain's ChatOpenAI calls through ``with_raw_response.create``: the swap reaches it,
    for the agent LangGraph's ``create_agent(name=...)`` names."""
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from agl_bridge.integrations.langchain import LangChainInstrumentor
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    registry.publish("writer", "Writer, published.")
    OpenAIInstrumentor().instrument()
    LangChainInstrumentor().instrument()
    try:
        with ScriptedServer(vllm=True) as server:
            llm = ChatOpenAI(model="m", base_url=server.base_url, api_key="k", max_retries=0)
            for name in ("writer", "reviewer"):
                agent = create_agent(llm, tools=[], name=name, system_prompt=f"You are {name}.")
                agent.invoke({"messages": [("user", "hi")]})
    finally:
        LangChainInstrumentor().uninstrument()
        OpenAIInstrumentor().uninstrument()
    assert systems(server) == ["Writer, published.", "You are reviewer."]
    assert [s.attributes[sc.PROMPT_VERSION] for s in chat_spans(spans)] == \
        ["writer@p1", "reviewer@p0"]
