"""LangChain/LangGraph through the real packages: graphs of ChatOpenAI agents against a
scripted OpenAI-compatible server that looks like vLLM, with both instrumentors on."""

import asyncio
from typing import TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.integrations.langchain import LangChainInstrumentor
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.scripted_server import ScriptedServer


class State(TypedDict):
    question: str
    answer: str
    verdict: str


@pytest.fixture
def instrumented():
    OpenAIInstrumentor().instrument()
    LangChainInstrumentor().instrument()
    yield
    LangChainInstrumentor().uninstrument()
    OpenAIInstrumentor().uninstrument()


@tool
def calculator(expression: str) -> str:
    """Evaluate a sum like 2+3."""
    a, b = expression.split("+")
    return str(int(a) + int(b))


@tool
def transfer_to_checker() -> str:
    """Hand the conversation to the checker."""
    return "ok"


def team_graph(base_url):
    llm = ChatOpenAI(model="m", base_url=base_url, api_key="k", max_retries=0)

    def solver(state):
        calculator.invoke({"expression": "2+3"})
        reply = llm.invoke(state["question"])
        transfer_to_checker.invoke({})
        return {"answer": reply.content}

    def checker(state):
        return {"verdict": llm.invoke(f"Is {state['answer']} right?").content}

    g = StateGraph(State)
    g.add_node("solver", solver)
    g.add_node("checker", checker)
    g.add_edge(START, "solver")
    g.add_edge("solver", "checker")
    g.add_edge("checker", "solver") if False else g.add_edge("checker", END)
    return g.compile()


def tree(spans):
    by_id = {s.context.span_id: s for s in spans}
    return {s.name: (by_id[s.parent.span_id].name if s.parent and s.parent.span_id in by_id
                     else None) for s in spans}


def test_graph_nodes_are_agents_and_llm_spans_nest_under_them(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[4, 5]) as server:
        with agl_bridge.episode("ep-lc", task_id="t"):
            out = team_graph(server.base_url).invoke({"question": "2+3?"})
    assert out["verdict"] == "hello"
    got = spans.get_finished_spans()
    names = sorted(s.name for s in got)
    assert names == sorted([
        "agl_bridge.episode", "invoke_workflow LangGraph", "invoke_agent solver",
        "execute_tool calculator", "chat m", "execute_tool transfer_to_checker",
        sc.SPAN_HANDOFF, "invoke_agent checker", "chat m"])
    by_name = {}
    for s in got:
        by_name.setdefault(s.name, []).append(s)
    ids = {s.context.span_id: s for s in got}
    parent = lambda s: ids[s.parent.span_id].name  # noqa: E731
    assert parent(by_name["invoke_workflow LangGraph"][0]) == "agl_bridge.episode"
    for agent in ("solver", "checker"):
        (a,) = by_name[f"invoke_agent {agent}"]
        assert parent(a) == "invoke_workflow LangGraph"
        assert a.attributes[sc.GEN_AI_AGENT_NAME] == agent and a.attributes[sc.TURN_INDEX] == 0
    chats = sorted(by_name["chat m"], key=lambda s: s.start_time)
    assert [parent(c) for c in chats] == ["invoke_agent solver", "invoke_agent checker"]
    for c, agent in zip(chats, ("solver", "checker")):
        assert c.attributes[sc.GEN_AI_AGENT_NAME] == agent
        assert c.attributes[sc.EPISODE_ID] == "ep-lc" and c.attributes[sc.TASK_ID] == "t"
        assert list(c.attributes[sc.COMPLETION_TOKEN_IDS]) == [4, 5]  # vLLM ids, via openai
    (tool_span,) = by_name["execute_tool calculator"]
    assert parent(tool_span) == "invoke_agent solver"
    assert tool_span.attributes[sc.GEN_AI_TOOL_NAME] == "calculator"
    (handoff,) = by_name[sc.SPAN_HANDOFF]  # the transfer tool; the checker's start adds none
    assert (handoff.attributes[sc.HANDOFF_FROM], handoff.attributes[sc.COORDINATION_AGENT]) == (
        "solver", "checker")


def test_root_run_is_the_episode_when_none_is_in_scope(spans, instrumented):
    with ScriptedServer(vllm=True) as server:
        graph = team_graph(server.base_url)
        graph.invoke({"question": "a"})
        graph.invoke({"question": "b"})
    episodes = {s.attributes[sc.EPISODE_ID] for s in spans.get_finished_spans()
                if s.name == "chat m"}
    assert len(episodes) == 2  # one per graph run, never merged


def test_turns_count_per_agent_and_async_runs_stay_apart(spans, instrumented):
    def looping_graph(base_url):
        llm = ChatOpenAI(model="m", base_url=base_url, api_key="k", max_retries=0)

        class S(TypedDict):
            n: int

        async def worker(state):
            await llm.ainvoke("go")
            return {"n": state["n"] + 1}

        g = StateGraph(S)
        g.add_node("worker", worker)
        g.add_edge(START, "worker")
        g.add_conditional_edges("worker", lambda s: "worker" if s["n"] < 3 else END)
        return g.compile()

    async def main(url):
        graph = looping_graph(url)

        async def one(i):
            with agl_bridge.episode(f"e{i}"):
                await graph.ainvoke({"n": 0})
        await asyncio.gather(*(one(i) for i in range(4)))

    with ScriptedServer(vllm=True) as server:
        asyncio.run(main(server.base_url))
    chats = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    assert len(chats) == 12
    per_episode = {}
    for c in chats:
        per_episode.setdefault(c.attributes[sc.EPISODE_ID], []).append(
            c.attributes[sc.TURN_INDEX])
    assert {k: sorted(v) for k, v in per_episode.items()} == {
        f"e{i}": [0, 1, 2] for i in range(4)}


def test_non_openai_chat_models_get_their_own_chat_span(spans, instrumented):
    model = GenericFakeChatModel(messages=iter([AIMessage(content="hi")]))
    with agl_bridge.episode("e-fake"):
        assert model.invoke("hello").content == "hi"
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    assert chat.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert chat.attributes[sc.EPISODE_ID] == "e-fake"


def test_uninstrument_removes_the_handler(spans):
    LangChainInstrumentor().instrument()
    LangChainInstrumentor().uninstrument()
    GenericFakeChatModel(messages=iter([AIMessage(content="x")])).invoke("y")
    assert spans.get_finished_spans() == ()


def test_supervisor_with_create_agent_subagent_is_a_handoff(spans, instrumented):
    """LangChain 1.x's own agents: a supervisor whose tool runs a research subagent."""
    import json as _json

    from langchain.agents import create_agent

    def script(body):
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        answered = any(m.get("role") == "tool" for m in body["messages"])
        if "ask_researcher" in tools and not answered:
            return "", [{"id": "call_1", "name": "ask_researcher",
                         "arguments": _json.dumps({"question": "2+3?"})}]
        return ("The answer is 5." if "ask_researcher" in tools else "5"), []

    with ScriptedServer(vllm=True, script=script, completion_ids=[9, 9]) as server:
        llm = ChatOpenAI(model="m", base_url=server.base_url, api_key="k", max_retries=0)
        researcher = create_agent(llm, tools=[], name="researcher")

        @tool
        def ask_researcher(question: str) -> str:
            """Ask the research agent."""
            return researcher.invoke({"messages": [("user", question)]})["messages"][-1].content

        supervisor = create_agent(llm, tools=[ask_researcher], name="supervisor")
        with agl_bridge.episode("ep-sup", task_id="t"):
            out = supervisor.invoke({"messages": [("user", "What is 2+3?")]})
    assert out["messages"][-1].content == "The answer is 5."
    got = spans.get_finished_spans()
    ids = {s.context.span_id: s for s in got}
    chats = sorted((s for s in got if s.name == "chat m"), key=lambda s: s.start_time)
    assert [c.attributes[sc.GEN_AI_AGENT_NAME] for c in chats] == [
        "supervisor", "researcher", "supervisor"]
    assert all(list(c.attributes[sc.COMPLETION_TOKEN_IDS]) == [9, 9] for c in chats)
    agents = [s for s in got if s.name.startswith("invoke_agent")]
    assert sorted(s.name for s in agents) == ["invoke_agent researcher", "invoke_agent supervisor"]
    (researcher_span,) = [s for s in agents if s.name == "invoke_agent researcher"]
    assert ids[researcher_span.parent.span_id].name == "execute_tool ask_researcher"
    (handoff,) = [s for s in got if s.name == sc.SPAN_HANDOFF]
    assert (handoff.attributes[sc.HANDOFF_FROM], handoff.attributes[sc.COORDINATION_AGENT]) == (
        "supervisor", "researcher")
    supervisor_chats = [c for c in chats if c.attributes[sc.GEN_AI_AGENT_NAME] == "supervisor"]
    assert {c.attributes[sc.TURN_INDEX] for c in supervisor_chats} == {0}  # one activation
