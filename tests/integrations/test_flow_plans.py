"""A planner's workflow in the Flow integration: the plan span, and what the plan decided on
each schedule span (planner, assignee, requirement, capabilities)."""

import json

from agl_bridge import semconv as sc
from agl_bridge.integrations.flow import Workflow


def test_plan_and_schedule_record_the_planners_decisions(spans):
    with Workflow("wf", task_id="q1") as wf:
        wf.plan("planner", valid=True, nodes=2, edges=1, depth=2)
        with wf.task("n1") as t:
            t.schedule("executor", planner="planner", assignee="lookup", requires="lookup",
                       capabilities={"executor": ["lookup", "calculator"]})
        with wf.task("n2", depends_on=["n1"]) as t:
            t.schedule("executor")  # a rule's decision: nothing of a plan on it
        wf.plan("planner", valid=False, problem="several final steps")
    got = {s.name: s for s in spans.get_finished_spans()}
    plans = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_WORKFLOW_PLAN]
    assert [(p.attributes[sc.WORKFLOW_PLAN_VALID], p.attributes.get(sc.WORKFLOW_PLAN_PROBLEM),
             p.attributes.get(sc.WORKFLOW_PLAN_NODES)) for p in plans] == [
        (True, None, 2), (False, "several final steps", None)]
    for p in plans:  # in the planner's scope, inside the workflow and episode
        assert p.attributes[sc.GEN_AI_AGENT_NAME] == "planner"
        assert p.attributes[sc.WORKFLOW_ID] == "wf" and p.attributes[sc.TASK_ID] == "q1"
        assert p.attributes[sc.WORKFLOW_PLANNER] == "planner"
    assert plans[0].attributes[sc.WORKFLOW_PLAN_EDGES] == 1
    assert plans[0].attributes[sc.WORKFLOW_PLAN_DEPTH] == 2
    schedules = sorted((s for s in spans.get_finished_spans()
                        if s.name == sc.workflow_step_span_name("schedule")),
                       key=lambda s: s.start_time)
    first, second = (dict(s.attributes) for s in schedules)
    assert first[sc.WORKFLOW_PLANNER] == "planner" and first[sc.WORKFLOW_TASK_ASSIGNEE] == "lookup"
    assert first[sc.WORKFLOW_TASK_REQUIRES] == "lookup"
    assert json.loads(first[sc.WORKFLOW_CAPABILITIES]) == {"executor": ["lookup", "calculator"]}
    assert first[sc.GEN_AI_AGENT_NAME] == "executor"
    assert not {sc.WORKFLOW_PLANNER, sc.WORKFLOW_TASK_ASSIGNEE, sc.WORKFLOW_TASK_REQUIRES,
                sc.WORKFLOW_CAPABILITIES} & set(second)
    assert sc.SPAN_WORKFLOW in got
