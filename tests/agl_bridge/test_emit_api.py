import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry.trace import StatusCode

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.otel.threads import ThreadContextInstrumentor


def named(spans, name):
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_reward_parts_sum_and_are_kept(spans):
    with agl_bridge.episode("e"):
        total = agl_bridge.emit_reward({"correct": 1.0, "format": 0.25}, kind="task")
    assert total == 1.25
    (r,) = named(spans, sc.SPAN_REWARD)
    assert r.attributes[sc.REWARD_VALUE] == 1.25
    assert r.attributes[sc.reward_part_attribute("correct")] == 1.0
    assert r.attributes[sc.reward_part_attribute("format")] == 0.25


@pytest.mark.parametrize("level, content", [("token_ids", False), ("messages", True)])
def test_tool_decorator_sync_and_async(spans, monkeypatch, level, content):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", level)

    @agl_bridge.tool
    def add(a, b=2):
        """Add two numbers.

        Longer text that is not the description."""
        return a + b

    @agl_bridge.tool(name="fetch_doc", description="Fetch a document")
    async def fetch(doc_id):
        await asyncio.sleep(0)
        return {"id": doc_id}

    with agl_bridge.episode("e"), agl_bridge.agent("coder"):
        assert add(1) == 3
        assert asyncio.run(fetch("d1")) == {"id": "d1"}
    (s_add,) = named(spans, "execute_tool add")
    (s_fetch,) = named(spans, "execute_tool fetch_doc")
    assert s_add.attributes[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert s_add.attributes[sc.GEN_AI_TOOL_NAME] == "add"
    assert s_add.attributes[sc.GEN_AI_TOOL_DESCRIPTION] == "Add two numbers."
    assert s_fetch.attributes[sc.GEN_AI_TOOL_DESCRIPTION] == "Fetch a document"
    assert s_add.attributes[sc.GEN_AI_AGENT_NAME] == "coder"
    assert s_fetch.attributes[sc.EPISODE_ID] == "e"
    if content:
        assert json.loads(s_add.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"a": 1}
        assert json.loads(s_fetch.attributes[sc.GEN_AI_TOOL_CALL_RESULT]) == {"id": "d1"}
    else:
        assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in s_add.attributes
        assert sc.GEN_AI_TOOL_CALL_RESULT not in s_fetch.attributes


def test_tool_errors_are_recorded_and_reraised(spans):
    @agl_bridge.tool
    def broken():
        raise KeyError("missing")

    with pytest.raises(KeyError):
        broken()
    (span,) = named(spans, "execute_tool broken")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "KeyError"


def test_voting_vocabulary(spans, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")
    with agl_bridge.episode("e", task_id="t"), agl_bridge.coordination_round(1):
        agl_bridge.new_answer("a", "42", label="agent1.1")
        agl_bridge.vote("b", "a", reason="a is right")
        agl_bridge.restart("b", reason="new answer from a")
        agl_bridge.final_selection("a", vote_counts={"a": 2, "b": 0})
    (answer,) = named(spans, sc.SPAN_NEW_ANSWER)
    (vote,) = named(spans, sc.SPAN_VOTE)
    (restart,) = named(spans, sc.SPAN_RESTART)
    (final,) = named(spans, sc.SPAN_FINAL_SELECTION)
    (rnd,) = named(spans, sc.SPAN_ROUND)
    assert (answer.attributes[sc.COORDINATION_AGENT], answer.attributes[sc.ANSWER_LABEL],
            answer.attributes[sc.ANSWER_CONTENT]) == ("a", "agent1.1", "42")
    assert (vote.attributes[sc.VOTE_VOTER], vote.attributes[sc.VOTE_TARGET],
            vote.attributes[sc.VOTE_REASON]) == ("b", "a", "a is right")
    assert restart.attributes[sc.COORDINATION_REASON] == "new answer from a"
    assert json.loads(final.attributes[sc.VOTE_COUNTS]) == {"a": 2, "b": 0}
    for s in (answer, vote, restart, final):
        assert s.attributes[sc.COORDINATION_ROUND] == 1 and s.attributes[sc.EPISODE_ID] == "e"
        assert s.parent.span_id == rnd.context.span_id


def test_vote_reason_and_answer_text_are_content(spans):
    agl_bridge.new_answer("a", "secret answer")
    agl_bridge.vote("b", "a", reason="secret reason")
    assert sc.ANSWER_CONTENT not in named(spans, sc.SPAN_NEW_ANSWER)[0].attributes
    assert sc.VOTE_REASON not in named(spans, sc.SPAN_VOTE)[0].attributes


def test_coordination_refuses_bad_input():
    with pytest.raises(ValueError, match="vote: target"):
        agl_bridge.vote("a", "")
    with pytest.raises(ValueError, match="vote counts must be ints, bad for \\['b'\\]"):
        agl_bridge.final_selection("a", vote_counts={"a": 1, "b": 1.5})
    with pytest.raises(ValueError, match="step must be one of"):
        with agl_bridge.task_step("t1", "deploy"):
            pass


def test_workflow_task_steps(spans):
    with agl_bridge.workflow("wf") as wf:
        with agl_bridge.task_step("t2", "schedule", depends_on=["t1"], agent="planner"):
            pass
        with agl_bridge.task_step("t2", "execute", agent="coder"):
            agl_bridge.emit_reward(0.0, scope="agent")
        with agl_bridge.task_step("t2", "validate") as step:
            step.passed(False)
        with agl_bridge.task_step("t2", "retry", attempt=1, agent="coder"):
            pass
    assert wf == "wf"
    sched = named(spans, sc.workflow_step_span_name("schedule"))[0]
    assert list(sched.attributes[sc.WORKFLOW_TASK_DEPENDS_ON]) == ["t1"]
    assert sched.attributes[sc.WORKFLOW_TASK_ID] == "t2"
    assert sched.attributes[sc.WORKFLOW_ID] == "wf"
    assert named(spans, sc.workflow_step_span_name("validate"))[0].attributes[
        sc.WORKFLOW_VALIDATION_PASSED] is False
    assert named(spans, sc.workflow_step_span_name("retry"))[0].attributes[
        sc.WORKFLOW_TASK_ATTEMPT] == 1
    (reward,) = named(spans, sc.SPAN_REWARD)
    assert (reward.attributes[sc.WORKFLOW_TASK_ID], reward.attributes[sc.GEN_AI_AGENT_NAME]) == (
        "t2", "coder")


def test_scope_follows_thread_pools_and_threads_when_instrumented(spans):
    def work(i):
        agl_bridge.emit_reward(float(i))

    def run_all():
        with agl_bridge.episode("pool-ep"), agl_bridge.agent("worker"):
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(work, range(4)))
            t = threading.Thread(target=work, args=(9,))
            t.start()
            t.join()

    ThreadContextInstrumentor().instrument()
    try:
        run_all()
    finally:
        ThreadContextInstrumentor().uninstrument()
    got = named(spans, sc.SPAN_REWARD)
    assert len(got) == 5
    assert all(s.attributes.get(sc.EPISODE_ID) == "pool-ep" for s in got)
    (ep,) = named(spans, sc.SPAN_EPISODE)
    assert all(s.context.trace_id == ep.context.trace_id for s in got)

    spans.clear()
    run_all()  # uninstrumented: pool workers start with an empty context
    assert [s.attributes.get(sc.EPISODE_ID) for s in named(spans, sc.SPAN_REWARD)] == [None] * 5
