"""The Flow-style integration through examples/flow_dag.py, with a scripted model."""

import openai
import pytest

from agl_bridge import semconv as sc
from agl_bridge.integrations.flow import Workflow
from agl_bridge.integrations.openai import OpenAIInstrumentor
from tests.conftest import load_example
from tests.scripted_server import ScriptedServer

flow_dag = load_example("flow_dag")


@pytest.fixture
def openai_traced():
    OpenAIInstrumentor().instrument()
    yield
    OpenAIInstrumentor().uninstrument()


def test_dag_run_records_steps_agents_and_rewards(spans, openai_traced):
    # the scripted model always answers 5: right for 2+3 and 1+4, wrong for their total
    with ScriptedServer(vllm=True, reply="5") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        summary = flow_dag.run_workflow(client, "m", (2, 3, 1, 4), max_retries=1)
    assert summary["tasks"] == {
        "left": {"agent": "alice", "passed": True, "retries": 0},
        "right": {"agent": "bob", "passed": True, "retries": 0},
        "total": {"agent": "alice", "passed": False, "retries": 1}}
    got = spans.get_finished_spans()
    steps = [(s.name.rsplit(".", 1)[1], s.attributes[sc.WORKFLOW_TASK_ID])
             for s in sorted(got, key=lambda s: s.start_time)
             if s.name.startswith("agl_bridge.workflow.task.")]
    assert steps == [("schedule", "left"), ("execute", "left"), ("validate", "left"),
                     ("schedule", "right"), ("execute", "right"), ("validate", "right"),
                     ("schedule", "total"), ("execute", "total"), ("validate", "total"),
                     ("retry", "total"), ("validate", "total")]
    chats = [s for s in got if s.name == "chat m"]
    assert [(c.attributes[sc.WORKFLOW_TASK_ID], c.attributes[sc.GEN_AI_AGENT_NAME],
             c.attributes[sc.TURN_INDEX]) for c in sorted(chats, key=lambda s: s.start_time)] == [
        ("left", "alice", 0), ("right", "bob", 0), ("total", "alice", 0), ("total", "alice", 1)]
    ids = {s.context.span_id: s for s in got}
    assert {ids[c.parent.span_id].name for c in chats} == {
        "agl_bridge.workflow.task.execute", "agl_bridge.workflow.task.retry"}
    episode_ids = {s.attributes.get(sc.EPISODE_ID) for s in got if s.name != "agl_bridge.episode"}
    assert len(episode_ids) == 1 and None not in episode_ids
    rewards = {(r.attributes.get(sc.WORKFLOW_TASK_ID), r.attributes.get(sc.GEN_AI_AGENT_NAME),
                r.attributes[sc.REWARD_SCOPE]): r.attributes[sc.REWARD_VALUE]
               for r in got if r.name == sc.SPAN_REWARD}
    assert rewards == {("left", "alice", "agent"): 1.0, ("right", "bob", "agent"): 1.0,
                       ("total", "alice", "agent"): pytest.approx(-0.2),
                       (None, None, "team"): pytest.approx(2 / 3)}
    validations = [s.attributes[sc.WORKFLOW_VALIDATION_PASSED] for s in got
                   if s.name == "agl_bridge.workflow.task.validate"]
    assert sorted(validations) == [False, False, True, True]


def test_task_order_and_duplicates_are_checked(spans):
    with Workflow("wf") as wf:
        with pytest.raises(ValueError, match="depends on \\['a'\\], which have not run"):
            with wf.task("b", depends_on=["a"]):
                pass
        with wf.task("a"):
            pass
        with pytest.raises(ValueError, match="task 'a' run twice"):
            with wf.task("a"):
                pass
