"""The Flow design's workflow-level terms (scheme 1 ``workflow``, scheme 5 ``global``) and the
hierarchical ones (``delegation`` for the planner, ``tool_choice`` for executors), on hand-built
unit tables, checked against the design's formulas transcribed as written."""

import json

import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, spans_to_transitions
from agl_bridge.trainer.rewards.recipes import EPISODE_KEY, RecipeError, recipe_from_dict
from agl_bridge.trainer.rewards.terms import Delegation, GlobalReward, ToolChoice, WorkflowReward
from agl_bridge.trainer.rewards.terms import delegation as delegation_term
from agl_bridge.trainer.rewards.terms import tool_choice as tool_choice_term
from agl_bridge.trainer.rewards.terms import workflow as workflow_term
from tests.factories import llm, table
from tests.trainer.rewards.test_recipes import got, span, step, unit

S = 10**9  # nanoseconds in a second


# -- the design's functions, as its document writes them (001, section 6.3.3 and 2.4) ---------
def design_compute_reward(result, alpha, beta, gamma):
    """Scheme 1, ``WorkflowStructureRL.compute_reward``."""
    success_rate = result["completed_tasks"] / result["total_tasks"]
    efficiency = 1.0 / (result["total_time"] + 1e-6)
    complexity = result["dependency_complexity"]
    return alpha * success_rate + beta * efficiency - gamma * complexity


def design_compute_global_reward(result, success_weight=1.0, efficiency_weight=0.3,
                                 failure_penalty=0.5):
    """Scheme 5, ``RewardCalculator.compute_global_reward``."""
    total_tasks, completed_tasks = result["total_tasks"], result["completed_tasks"]
    total_time = result["total_time"]
    success_rate = completed_tasks / total_tasks if total_tasks > 0 else 0
    return (success_weight * success_rate * 10
            + efficiency_weight * (1 / (total_time + 1)) * 5
            - failure_penalty * (total_tasks - completed_tasks))


# -- spans ------------------------------------------------------------------------------------
def workflow_span(episode, start, end, workflow="w1"):
    return span(episode, start, sc.SPAN_WORKFLOW, {sc.WORKFLOW_ID: workflow}, end=end)


def plan(episode, t, planner="planner", *, valid=True, workflow="w1"):
    attrs = {sc.WORKFLOW_ID: workflow, sc.WORKFLOW_PLANNER: planner, sc.WORKFLOW_PLAN_VALID: valid}
    return span(episode, t, sc.SPAN_WORKFLOW_PLAN, attrs, agent_name=planner)


def schedule(episode, t, task, *, agent="executor", planner="planner", assignee=None,
             requires=None, capabilities=None, depends_on=None, workflow="w1"):
    row = step(episode, t, task, "schedule", agent=agent, depends_on=depends_on,
               workflow=workflow)
    attrs = json.loads(row["attributes"])
    for key, value in ((sc.WORKFLOW_PLANNER, planner), (sc.WORKFLOW_TASK_ASSIGNEE, assignee),
                       (sc.WORKFLOW_TASK_REQUIRES, requires),
                       (sc.WORKFLOW_CAPABILITIES, capabilities)):
        if value is not None:
            attrs[key] = value
    row["attributes"] = json.dumps(attrs)
    return row


def tool_call(episode, t, tool, *, task="a", agent="executor", turn=0, failed=False,
              workflow="w1"):
    attrs = {sc.GEN_AI_TOOL_NAME: tool, sc.WORKFLOW_ID: workflow}
    if task is not None:
        attrs[sc.WORKFLOW_TASK_ID] = task
    if tool is None:
        del attrs[sc.GEN_AI_TOOL_NAME]
    return span(episode, t, f"execute_tool {tool}", attrs, agent_name=agent, turn_index=turn,
                operation_name=sc.OP_EXECUTE_TOOL, status_code="ERROR" if failed else "OK")


def three_tasks(episode="e1", *, c_passes=False, workflow_span_too=True, valid=True):
    """A planner's plan of three tasks: a; b after a; c after a and b. a and b pass, c fails
    (or passes). The workflow span lasts 3 s."""
    rows = [plan(episode, 0, valid=valid),
            schedule(episode, 1, "a"), step(episode, 1 * S, "a", "execute", agent="executor"),
            step(episode, 1 * S + 5, "a", "validate", agent="executor", passed=True),
            schedule(episode, 2, "b", depends_on=["a"]),
            step(episode, 2 * S, "b", "execute", agent="executor"),
            step(episode, 2 * S + 5, "b", "validate", agent="executor", passed=True),
            schedule(episode, 3, "c", depends_on=["a", "b"]),
            step(episode, 2 * S + 6, "c", "execute", agent="executor", end=2 * S + 8),
            step(episode, 2 * S + 9, "c", "validate", agent="executor", passed=c_passes)]
    if workflow_span_too:
        rows.append(workflow_span(episode, 0, 3 * S))
    return rows


# -- scheme 1: workflow -----------------------------------------------------------------------
@pytest.mark.parametrize("alpha, beta, gamma", [(1.0, 0.1, 0.05), (2.0, 0.5, 0.2)])
def test_workflow_is_scheme_ones_formula(alpha, beta, gamma):
    term = WorkflowReward.from_config({"alpha": alpha, "beta": beta, "gamma": gamma,
                                       "time_offset": 1e-6}, "r")
    out = term(unit(three_tasks()))
    # 2 of 3 tasks completed, 3 s, 3 dependency edges (a->b, a->c, b->c)
    expected = design_compute_reward({"completed_tasks": 2, "total_tasks": 3, "total_time": 3.0,
                                      "dependency_complexity": 3}, alpha, beta, gamma)
    assert got(out) == [("agent", "planner", None, round(expected, 9))]
    assert not out.notes


def test_workflow_defaults_complexity_measures_and_offset():
    rows = unit(three_tasks(c_passes=True))
    base = 1.0 + 0.1 / (3 + 1)  # all 3 completed, 3 s, offset 1
    assert got(WorkflowReward()(rows)) == [("agent", "planner", None, round(base - 0.05 * 3, 9))]
    per_task = WorkflowReward.from_config({"complexity": "edges_per_task"}, "r")(rows)
    assert got(per_task) == [("agent", "planner", None, round(base - 0.05 * 1, 9))]
    depth = WorkflowReward.from_config({"complexity": "depth", "gamma": 0.1}, "r")(rows)
    assert got(depth) == [("agent", "planner", None, round(base - 0.1 * 3, 9))]  # a -> b -> c


def test_workflow_invalid_plans_recipients_and_missing_parts():
    invalid = WorkflowReward.from_config({"invalid": -2.0, "weight": 0.5}, "r")
    assert got(invalid(unit(three_tasks(valid=False)))) == [("agent", "planner", None, -1.0)]
    team = WorkflowReward.from_config({"to": "team"}, "r")(unit(three_tasks()))
    assert [r.scope for r in team.rewards] == ["team"]
    # no plan span, no planner on the schedules, no workflow span: the team, time from steps
    rows = [r for r in three_tasks(workflow_span_too=False) if r["name"] != sc.SPAN_WORKFLOW_PLAN]
    for r in rows:
        attrs = json.loads(r["attributes"])
        attrs.pop(sc.WORKFLOW_PLANNER, None)
        r["attributes"] = json.dumps(attrs)
    out = WorkflowReward()(unit(rows))
    seconds = (2 * S + 9 - 1) / S  # the first step's start to the last step's end
    assert got(out) == [("team", None, None, round(2 / 3 + 0.1 / (seconds + 1) - 0.15, 9))]
    n = {k.removeprefix("recipe workflow: "): v for k, v in out.notes.items()}
    assert n == {workflow_term.NO_WORKFLOW_SPAN: 1, workflow_term.NO_PLANNER: 1}


def test_the_planner_is_found_on_the_schedules_without_a_plan_span():
    rows = [r for r in three_tasks() if r["name"] != sc.SPAN_WORKFLOW_PLAN]
    out = WorkflowReward()(unit(rows))
    assert [(r.scope, r.agent) for r in out.rewards] == [("agent", "planner")]


# -- scheme 5: global -------------------------------------------------------------------------
def test_global_is_scheme_fives_formula():
    result = {"total_tasks": 3, "completed_tasks": 2, "total_time": 3.0}
    # the design's code scales success by 10 and efficiency by 5: weights 10 and 1.5
    term = GlobalReward.from_config({"success_weight": 10.0, "efficiency_weight": 1.5,
                                     "failure_penalty": 0.5}, "r")
    out = term(unit(three_tasks()))
    assert got(out) == [("team", None, None, round(design_compute_global_reward(result), 9))]
    # the form with the design's RewardConfig defaults: 1 x 2/3 + 0.3 / 4 - 0.5 x 1
    assert got(GlobalReward()(unit(three_tasks()))) == [
        ("team", None, None, round(2 / 3 + 0.3 / 4 - 0.5, 9))]


def test_global_for_a_workflow_without_tasks_and_several_workflows():
    rows = three_tasks() + [workflow_span("e1", 0, 1 * S, workflow="w2"),
                            plan("e1", 1, valid=False, workflow="w2")]
    out = GlobalReward()(unit(rows))  # w2: no task ran: rate 0, no failures, 1 s
    assert got(out) == [("team", None, None, round(0.3 / 2, 9)),
                        ("team", None, None, round(2 / 3 + 0.3 / 4 - 0.5, 9))]


# -- delegation -------------------------------------------------------------------------------
def test_delegation_rewards_the_planner_for_capable_assignees():
    caps = json.dumps({"executor": ["calculator", "lookup"], "scribe": ["text"]})
    rows = [schedule("e1", 1, "a", assignee="calculator", requires="calculator"),  # a tool
            schedule("e1", 2, "b", assignee="lookup", requires="calculator"),
            schedule("e1", 3, "c", assignee="executor", requires="lookup", capabilities=caps),
            schedule("e1", 4, "d", assignee="scribe", requires="lookup", capabilities=caps),
            schedule("e1", 5, "e", planner=None, assignee="lookup", requires="calculator"),
            schedule("e1", 6, "f", requires="lookup"),  # no assignee
            schedule("e1", 7, "g", assignee="lookup"),  # no requirement
            schedule("e1", 8, "h", assignee="x", requires="y", capabilities="[1]")]
    out = Delegation()(unit(rows))
    assert got(out) == [("agent", "planner", None, -0.5), ("agent", "planner", None, -0.5),
                        ("agent", "planner", None, -0.5), ("agent", "planner", None, 0.5),
                        ("agent", "planner", None, 0.5)]
    n = {k.removeprefix("recipe delegation: "): v for k, v in out.notes.items()}
    assert n == {delegation_term.NO_ASSIGNEE: 1, delegation_term.NO_REQUIREMENT: 1,
                 delegation_term.BAD_CAPABILITIES: 1}
    weighted = Delegation.from_config({"capable": 1.0, "incapable": -2.0, "weight": 0.5}, "r")
    assert sum(r.value for r in weighted(unit(rows)).rewards) == pytest.approx(
        0.5 * (2 * 1.0 + 3 * -2.0))


def test_a_rescheduled_task_is_judged_by_its_latest_schedule():
    rows = [schedule("e1", 1, "a", assignee="lookup", requires="calculator"),
            schedule("e1", 2, "a", assignee="calculator", requires="calculator")]
    assert got(Delegation()(unit(rows))) == [("agent", "planner", None, 0.5)]


# -- tool choice ------------------------------------------------------------------------------
def test_tool_choice_rewards_the_right_tool_and_charges_failures():
    rows = [schedule("e1", 1, "a", requires="lookup"), schedule("e1", 2, "b",
                                                                requires="calculator"),
            tool_call("e1", 3, "lookup", task="a", turn=0),  # right
            tool_call("e1", 4, "lookup", task="b", turn=0),  # wrong
            tool_call("e1", 5, "calculator", task="b", turn=1, failed=True),  # right, failed
            tool_call("e1", 6, "calculator", task=None, agent="other", turn=None, failed=True),
            tool_call("e1", 7, None, task="a", turn=2)]  # no tool name
    out = ToolChoice()(unit(rows))
    assert got(out) == [("agent", "other", None, -0.25), ("turn", "executor", 0, -0.5),
                        ("turn", "executor", 0, 0.5), ("turn", "executor", 1, 0.25)]
    n = {k.removeprefix("recipe tool_choice: "): v for k, v in out.notes.items()}
    assert n == {tool_choice_term.NO_REQUIREMENT: 1, tool_choice_term.NO_TOOL_NAME: 1}
    strict = ToolChoice.from_config({"right": 1.0, "wrong": -1.0, "failure": -1.0}, "r")
    assert sum(r.value for r in strict(unit(rows)).rewards) == pytest.approx(1 - 1 + 0 - 1)


def test_tool_choice_follows_recorded_capabilities():
    caps = json.dumps({"calculator": ["arithmetic"], "lookup": ["prices"]})
    rows = [schedule("e1", 1, "a", requires="arithmetic", capabilities=caps),
            tool_call("e1", 2, "calculator", task="a"), tool_call("e1", 3, "lookup", task="a")]
    assert got(ToolChoice()(unit(rows))) == [("turn", "executor", 0, -0.5),
                                              ("turn", "executor", 0, 0.5)]


# -- as recipes, through the converter --------------------------------------------------------
@pytest.mark.parametrize("config, message", [
    ({"workflow": {"complexity": "width"}}, r"workflow\]\.complexity: expected one of \['edges'"),
    ({"workflow": {"to": "executor"}}, r"workflow\]\.to: expected one of \['planner', 'team'\]"),
    ({"workflow": {"time_offset": 0}}, r"workflow\]\.time_offset: expected a number > 0"),
    ({"global": {"success": 1.0}}, r"global\]: unknown key\(s\) \['success'\]"),
    ({"delegation": {"capable": "yes"}}, r"delegation\]\.capable: expected a finite number"),
    ({"tool_choice": {"right": float("inf")}}, r"tool_choice\]\.right: expected a finite"),
])
def test_bad_flow_term_tables_are_refused_by_key(config, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"terms": config}, "r.toml")


def test_flow_terms_reach_each_roles_transitions():
    """A planner call and two executor calls with the workflow's spans: the planner's
    transition gets scheme 1 and delegation, each executor turn its tool choice, everyone the
    team's global reward."""
    rows = three_tasks(c_passes=True)
    for r in rows:  # the plan assigned every task to the lookup tool; each needs the calculator
        if r["name"] == sc.workflow_step_span_name("schedule"):
            attrs = json.loads(r["attributes"])
            attrs.update({sc.WORKFLOW_TASK_ASSIGNEE: "lookup",
                          sc.WORKFLOW_TASK_REQUIRES: "calculator"})
            r["attributes"] = json.dumps(attrs)
    rows += [llm("e1", 0, agent="planner", turn=0),
             llm("e1", 1 * S + 1, agent="executor", turn=0, prompt=[5]),
             llm("e1", 2 * S + 1, agent="executor", turn=1, prompt=[6]),
             tool_call("e1", 1 * S + 2, "calculator", task="a", turn=0),
             tool_call("e1", 2 * S + 2, "lookup", task="b", turn=1, failed=True)]
    recipe = recipe_from_dict({"terms": {"workflow": {}, "global": {}, "delegation": {},
                                         "tool_choice": {}}})
    out, stats = spans_to_transitions(table(rows), ConvertConfig(recipe=recipe,
                                                                 missing_reward=0.0))
    team = 1.0 + 0.3 / 4  # all 3 completed in 3 s
    by_turn = {(t["agent_name"], t["turn_index"]): t["reward"] for t in out.to_pylist()}
    assert by_turn == pytest.approx({
        ("planner", 0): team + (1.0 + 0.1 / 4 - 0.15) + 3 * -0.5,
        ("executor", 0): team + 0.5, ("executor", 1): team - 0.5 - 0.25})
    summary = stats.summary()
    for line in ("recipe workflow: planner +0.8750 in 1 reward(s)",
                 "recipe delegation: planner -1.5000 in 3 reward(s)",
                 "recipe global: (episode) +1.0750 in 1 reward(s)",
                 "recipe tool_choice: executor -0.2500 in 2 reward(s)"):
        assert line in summary, line


def test_flow_terms_read_only_the_columns_they_declare():
    rows = three_tasks() + [schedule("e1", 9, "a", assignee="lookup", requires="lookup"),
                            tool_call("e1", 10, "lookup", task="a", failed=True),
                            llm("e1", 11, agent="executor")]
    full = unit(rows)
    for config in ({"workflow": {}}, {"workflow": {"complexity": "depth"}}, {"global": {}},
                   {"delegation": {}}, {"tool_choice": {}}):
        (term,) = recipe_from_dict({"terms": config}).terms
        narrow = full.select(list(dict.fromkeys([*term.columns, EPISODE_KEY])))
        expected = term(full)
        assert expected.rewards, config
        assert term(narrow) == expected, config
