"""AutoGen AgentChat 0.7 through the real package: teams of AssistantAgents whose model client
is AutoGen's own OpenAIChatCompletionClient, against a scripted vLLM-like server."""

import asyncio

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.integrations.autogen import AutoGenInstrumentor
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.scripted_server import ScriptedServer

MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False,
              "family": "unknown", "structured_output": False}


@pytest.fixture
def instrumented():
    OpenAIInstrumentor().instrument()
    AutoGenInstrumentor().instrument()
    yield
    AutoGenInstrumentor().uninstrument()
    OpenAIInstrumentor().uninstrument()


def client(url, stream=False):
    return OpenAIChatCompletionClient(model="m", base_url=url, api_key="k",
                                      model_info=MODEL_INFO, max_retries=0)


def agents(url, stream=False, **extra):
    return [AssistantAgent(name, model_client=client(url), model_client_stream=stream,
                           **extra.get(name, {}))
            for name in ("solver", "checker")]


def spans_named(spans, prefix):
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith(prefix)),
                  key=lambda s: s.start_time)


@pytest.mark.parametrize("stream", [False, True])
def test_round_robin_turns_agents_and_token_ids(spans, instrumented, stream):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9]) as server:
        team = RoundRobinGroupChat(agents(server.base_url, stream), max_turns=4)
        with agl_bridge.episode("ep-ag", task_id="t1"):
            result = asyncio.run(team.run(task="What is 2+3?"))
    assert [m.source for m in result.messages] == ["user", "solver", "checker", "solver",
                                                   "checker"]
    chats = spans_named(spans, "chat m")
    assert [(c.attributes[sc.GEN_AI_AGENT_NAME], c.attributes[sc.TURN_INDEX]) for c in chats] == [
        ("solver", 0), ("checker", 0), ("solver", 1), ("checker", 1)]
    ids = {s.context.span_id: s for s in spans.get_finished_spans()}
    for c in chats:  # nested in autogen-core's own agent span, not in one of ours
        parent = ids[c.parent.span_id]
        assert parent.name == f"invoke_agent {c.attributes[sc.GEN_AI_AGENT_NAME]}"
        assert parent.instrumentation_scope.name != sc.INSTRUMENTATION_SCOPE
        assert parent.attributes[sc.TURN_INDEX] == c.attributes[sc.TURN_INDEX]
        assert c.attributes[sc.EPISODE_ID] == "ep-ag" and c.attributes[sc.TASK_ID] == "t1"
        assert list(c.attributes[sc.COMPLETION_TOKEN_IDS]) == [7, 8, 9]
        assert c.attributes[sc.LLM_STREAM] is stream
    selections = spans_named(spans, sc.SPAN_SELECT_SPEAKER)
    assert [list(s.attributes[sc.COORDINATION_SPEAKERS]) for s in selections] == [
        ["solver"], ["checker"], ["solver"], ["checker"]]
    assert {s.attributes[sc.COORDINATION_STRATEGY] for s in selections} == {"round_robin"}
    (stop,) = spans_named(spans, sc.SPAN_TERMINATION)
    assert "Maximum number of turns 4 reached" in stop.attributes[sc.COORDINATION_REASON]
    assert stop.attributes[sc.EPISODE_ID] == "ep-ag"


def test_selector_llm_call_is_the_managers_turn(spans, instrumented):
    with ScriptedServer(vllm=True, reply="checker") as server:
        team = SelectorGroupChat(agents(server.base_url), model_client=client(server.base_url),
                                 max_turns=2, allow_repeated_speaker=True)
        asyncio.run(team.run(task="go"))
    selections = spans_named(spans, sc.SPAN_SELECT_SPEAKER)
    assert [list(s.attributes[sc.COORDINATION_SPEAKERS]) for s in selections] == [
        ["checker"], ["checker"]]
    ids = {s.context.span_id: s for s in spans.get_finished_spans()}
    selector_chats = [c for c in spans_named(spans, "chat m")
                      if ids[c.parent.span_id].name == sc.SPAN_SELECT_SPEAKER]
    assert len(selector_chats) == 2
    assert {c.attributes[sc.GEN_AI_AGENT_NAME] for c in selector_chats} == {
        selections[0].attributes[sc.GEN_AI_AGENT_NAME]}
    assert [c.attributes[sc.TURN_INDEX] for c in selector_chats] == [0, 1]
    episodes = {s.attributes.get(sc.EPISODE_ID) for s in spans_named(spans, "chat m")}
    assert len(episodes) == 1 and None not in episodes  # the team run is the episode


def test_swarm_handoffs_are_coordination_spans(spans, instrumented):
    call = {"id": "call_1", "name": "transfer_to_checker", "arguments": "{}"}
    with ScriptedServer(vllm=True, tool_calls=[call]) as server:
        solver, checker = agents(server.base_url, solver={"handoffs": ["checker"]},
                                 checker={"handoffs": ["checker"]})
        team = Swarm([solver, checker], termination_condition=MaxMessageTermination(4))
        asyncio.run(team.run(task="go"))
    handoffs = spans_named(spans, sc.SPAN_HANDOFF)
    assert handoffs and (handoffs[0].attributes[sc.HANDOFF_FROM],
                         handoffs[0].attributes[sc.COORDINATION_AGENT]) == ("solver", "checker")
    assert {s.attributes[sc.COORDINATION_STRATEGY]
            for s in spans_named(spans, sc.SPAN_SELECT_SPEAKER)} == {"swarm"}


def test_a_lone_agent_run_is_its_own_episode(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        solver = agents(server.base_url)[0]
        asyncio.run(solver.run(task="a"))
        asyncio.run(solver.run(task="b"))
    chats = spans_named(spans, "chat m")
    assert len({c.attributes[sc.EPISODE_ID] for c in chats}) == 2
    assert {c.attributes[sc.GEN_AI_AGENT_NAME] for c in chats} == {"solver"}


def test_unsupported_version_is_left_uninstrumented(spans, monkeypatch, caplog):
    monkeypatch.setattr(AutoGenInstrumentor, "instrumentation_dependencies",
                        lambda self: ("autogen-agentchat >= 9.0",))
    AutoGenInstrumentor().instrument()
    assert not AutoGenInstrumentor().is_instrumented_by_opentelemetry
    assert any("autogen-agentchat" in r.getMessage() for r in caplog.records)
