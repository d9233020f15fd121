"""The Flow-style team (``agl-bridge demo --task flow``): the planner's DAG is checked before it
runs, executors choose their tools, the validator has failed steps retried, and the spans of
all of it become per-role transitions with the workflow, global, delegation and tool-choice
rewards."""

import json
import re

import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.loop.team import run_team
from agl_bridge.trainer.loop.teams import flow, flow_plans, flow_world
from agl_bridge.trainer.rewards.recipes import recipe_from_dict
from tests.scripted_server import ScriptedServer

TEAM = "python -m agl_bridge.trainer.loop.teams.flow"
RECIPE = {"terms": {"workflow": {}, "global": {}, "delegation": {}, "tool_choice": {}}}


def gold_plan(task):
    """The plan a good planner writes for each kind of question."""
    items, kind = task["items"], task["kind"]
    if kind == "price":
        steps = [{"id": "n1", "task": items[0], "tool": "lookup", "after": []}]
    elif kind == "cost":
        steps = [{"id": "n1", "task": items[0], "tool": "lookup", "after": []},
                 {"id": "n2", "task": f"n1 * {task['count']}", "tool": "calculator",
                  "after": ["n1"]}]
    else:
        steps = [{"id": "n1", "task": items[0], "tool": "lookup", "after": []},
                 {"id": "n2", "task": items[1], "tool": "lookup", "after": []},
                 {"id": "n3", "task": "n1 + n2", "tool": "calculator", "after": ["n1", "n2"]}]
    return json.dumps(steps)


# -- the world and the plans ------------------------------------------------------------------
def test_questions_answers_tools_and_a_held_out_split():
    space = flow_world.task_space()
    assert len(space) == 12 + 96 + 132 and len({t["task_id"] for t in space}) == len(space)
    cost = {"kind": "cost", "items": ["peach"], "count": 3, "task_id": "x"}
    assert flow_world.question(cost) == "What do 3 peaches cost?"
    assert flow_world.answer(cost) == 24
    pair = {"kind": "pair", "items": ["apple", "fig"], "task_id": "y"}
    assert flow_world.question(pair) == "What do an apple and a fig cost together?"
    assert flow_world.answer(pair) == 10
    assert flow_world.calculator("(7 + 2) * 3") == 27
    for bad in ("fig", "7 / 2", "__import__('os')", "2 ** 99"):
        with pytest.raises(ValueError):
            flow_world.calculator(bad)
    assert flow_world.lookup("Figs") == 7 and flow_world.lookup("an apple") == 3
    with pytest.raises(KeyError):
        flow_world.lookup("7 * 4")
    held, pool = flow_world.split(40, 0)
    assert len(held) == 40 and len(pool) == len(space) - 40
    assert {t["task_id"].removeprefix("eval-") for t in held}.isdisjoint(
        t["task_id"] for t in pool)
    assert held == flow_world.split(40, 0)[0] and held != flow_world.split(40, 1)[0]
    assert {t["kind"] for t in held} == set(flow_world.KINDS)


@pytest.mark.parametrize("task", [
    {"kind": "price", "items": ["fig"]}, {"kind": "cost", "items": ["kiwi"], "count": 5},
    {"kind": "pair", "items": ["lime", "plum"]}])
def test_good_plans_pass_their_check_and_fit_the_servers_shape(task):
    text = gold_plan(task)
    assert re.fullmatch(flow_plans.PLAN_REGEX, text)
    plan = flow_plans.check(text)
    assert plan.valid and plan.problem is None
    n = {"price": 1, "cost": 2, "pair": 3}[task["kind"]]
    assert (len(plan.steps), plan.edges, plan.depth) == (n, n - 1 if n < 3 else 2,
                                                          1 if n == 1 else 2)
    assert plan.final.id == f"n{n}"
    assert re.fullmatch(flow_plans.PLAN_REGEX, flow.EXAMPLE_PLAN)
    assert re.fullmatch(flow_plans.CALL_REGEX, '{"tool": "lookup", "input": "fig"}')


def _plan(*steps):
    return json.dumps([{"id": i, "task": t, "tool": tool, "after": list(a)}
                       for i, t, tool, a in steps])


@pytest.mark.parametrize("text, problem", [
    ('[{"id": "n1", "task": "fig", "tool": "lookup", "after": [', "not JSON"),
    ("[]", "no steps"),
    ('{"id": "n1"}', "not a list of steps"),
    ('[{"id": "n1", "task": "fig"}]', "a step without id, task, tool and after"),
    (_plan(("n1", "fig", "lookup", ()), ("n1", "kiwi", "lookup", ())), "duplicate id"),
    (_plan(("n1", "n2 * 2", "calculator", ["n2"])), "depends on an unknown step"),
    (_plan(("n1", "fig", "lookup", ()), ("n2", "n1 * 2", "calculator", ())),
     "uses a result it does not wait for"),
    (_plan(("n1", "fig", "lookup", ()), ("n2", "n1 * 2", "calculator", ["n1", "n1x"])),
     "depends on an unknown step"),
    (_plan(("n1", "fig", "lookup", ()), ("n2", "kiwi", "lookup", ()),
           ("n3", "n1 * 9", "calculator", ["n1", "n2"])), "waits for a result it does not use"),
    (_plan(("n1", "the answer", "lookup", ())), "a task no one tool can do"),
    (_plan(("n1", "peach", "lookup", ()), ("n2", "pear", "lookup", ()),
           ("n3", "peach + pear", "calculator", ["n1", "n2"])), "waits for a result it does"),
    (_plan(("n1", "peach + pear", "calculator", ())), "a task no one tool can do"),
    (_plan(("n1", "2 limes", "lookup", ())), "a task no one tool can do"),
    (_plan(("n1", "n2 + 1", "calculator", ["n2"]), ("n2", "n1 + 1", "calculator", ["n1"])),
     "a dependency cycle"),
    (_plan(("n1", "fig", "lookup", ()), ("n2", "kiwi", "lookup", ())), "several final steps"),
])
def test_plans_that_cannot_run_are_refused_with_the_first_problem(text, problem):
    plan = flow_plans.check(text)
    assert not plan.valid and plan.problem.startswith(problem)
    stage = next((i for i, c in enumerate(flow_plans.CHECKS) if plan.problem == c), 0)
    assert plan.progress == stage / len(flow_plans.CHECKS) and flow_plans.check(gold_plan(
        {"kind": "price", "items": ["fig"]})).progress == 1.0


def test_requirements_steps_and_tool_calls():
    assert flow_plans.requirement("price of a fig") == "lookup"
    assert flow_plans.requirement("figs") == "lookup"
    assert flow_plans.requirement("n1 * 4") == "calculator"
    assert flow_plans.requirement("7") == "calculator"
    assert flow_plans.requirement("(3 + 4) * 2") == "calculator"
    assert flow_plans.requirement("total") is None
    assert flow_plans.requirement("n1 + n2") == "calculator"
    for neither in ("peach + pear", "2 limes", "fig * 2", "n1 * fig"):
        assert flow_plans.requirement(neither) is None, neither
    assert flow_plans.expected("figs") == 7 and flow_plans.expected("What does a fig cost?") == 7
    assert flow_plans.expected("(7 + 2) * 3") == 27 and flow_plans.expected("7 / 2") is None
    assert flow_plans.expected("peach + pear") is None
    assert flow.fill("n1 * 4 + n12", {"n1": 7, "n12": 2}) == "7 * 4 + 2"
    assert flow.tool_call('{"tool": "lookup", "input": "fig"}') == ("lookup", "fig")
    assert flow.tool_call("calculator: 7 * 4") == ("calculator", "7 * 4")
    assert flow.tool_call("no idea") == (None, "")


# -- the team as a program, on a scripted server ----------------------------------------------
def _script(bad_planner=False, lazy_executor=False):
    def answer(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You plan"):
            if bad_planner:  # two results, nobody uses the second: several final steps
                return _plan(("n1", "fig", "lookup", ()), ("n2", "kiwi", "calculator", ())), []
            return gold_plan(QUESTIONS[user]), []
        step = user.splitlines()[0].removeprefix("Step: ")
        if lazy_executor:  # the worked example's call, whatever the step: runs, does no step
            return json.dumps({"tool": "lookup", "input": "fig"}), []  # but fig's
        item = re.search("|".join(flow_world.PRICES), step)
        if item and "failed" not in user and step.startswith("What"):  # the whole question:
            return json.dumps({"tool": "calculator", "input": step[:20]}), []  # a wrong try
        if item:
            return json.dumps({"tool": "lookup", "input": item.group(0)}), []
        return json.dumps({"tool": "calculator", "input": step}), []
    return answer


QUESTIONS: dict[str, dict] = {}


def _tasks():
    tasks = [{"task_id": "p", "kind": "price", "items": ["fig"]},
             {"task_id": "c", "kind": "cost", "items": ["kiwi"], "count": 5},
             {"task_id": "q", "kind": "pair", "items": ["lime", "plum"]}]
    for t in tasks:
        QUESTIONS[flow_world.question(t)] = t
    return tasks


def test_the_team_plans_executes_and_each_role_is_rewarded_from_its_spans(tmp_path):
    with ScriptedServer(vllm=True, script=_script(), completion_ids=[5, 6]) as server:
        run = run_team(TEAM, _tasks(), tmp_path / "run", base_url=server.base_url,
                       aliases=None, timeout_s=300)
    assert [(r["task_id"], r["final"], r["success"]) for r in run.results] == [
        ("p", 7, True), ("c", 20, True), ("q", 8, True)]
    for r in run.results:
        assert r["plan_valid"] and r["agent_correct"] == {"planner": True, "executor": True}
        assert r["agent_score"] == {"planner": 1.0, "executor": 1.0} and r["retries"] == 0
    assert run.summary["valid_plans"] == 1.0 and run.summary["tool_accuracy"] == 1.0
    assert run.summary["steps"] == 2.0 and run.summary["depth"] == pytest.approx(5 / 3)
    planner_bodies = [b for b in server.requests if b["messages"][0]["content"].startswith(
        "You plan")]
    assert len(planner_bodies) == 3 and all(
        b["structured_outputs"]["regex"] == flow_plans.PLAN_REGEX for b in planner_bodies)
    assert {b["model"] for b in server.requests} == {"planner", "executor"}

    out = tmp_path / "t.parquet"
    stats = convert(list((tmp_path / "run" / "spans").rglob("*.parquet")), out,
                    ConvertConfig(algorithm="at_grpo", recipe=recipe_from_dict(RECIPE)))
    t = pq.read_table(out).to_pylist()
    by_agent = {a: [r for r in t if r["agent_name"] == a] for a in ("planner", "executor")}
    assert len(by_agent["planner"]) == 3 and len(by_agent["executor"]) == 6  # 1 + 2 + 3 steps
    assert all(r["completion_ids"] == [5, 6] for r in t)  # the server's ids, not retokenized
    summary = stats.summary()
    # every step assigned to a tool that can do it, every call the right tool that worked
    for line in ("recipe delegation: planner +3.0000 in 6 reward(s)",
                 "recipe tool_choice: executor +3.0000 in 6 reward(s)",
                 "recipe workflow: planner", "recipe global: (episode)"):
        assert line in summary, (line, summary)
    assert stats.notes == {} or not any(k.startswith("recipe") for k in stats.notes)


def test_a_plan_that_cannot_run_is_replaced_and_the_planner_pays(tmp_path):
    with ScriptedServer(vllm=True, script=_script(bad_planner=True),
                        completion_ids=[5, 6]) as server:
        run = run_team(TEAM, _tasks(), tmp_path / "run", base_url=server.base_url,
                       aliases=None, timeout_s=300)
    by_task = {r["task_id"]: r for r in run.results}
    for r in run.results:
        assert not r["plan_valid"] and r["plan_problem"] == "several final steps"
        assert r["agent_score"]["planner"] == 0.0 and r["steps"] is None
    # the fallback asks the executor the whole question: its first try (the calculator) fails,
    # the validator has it retried, and the lookup answers the one-item question only
    assert by_task["p"]["success"] and by_task["p"]["retries"] == 1
    assert not by_task["c"]["success"] and not by_task["q"]["success"]
    retried = [b for b in server.requests if "Your last call failed" in
               b["messages"][-1]["content"]]
    assert len(retried) == 3
    out = tmp_path / "t.parquet"
    stats = convert(list((tmp_path / "run" / "spans").rglob("*.parquet")), out,
                    ConvertConfig(algorithm="at_grpo", recipe=recipe_from_dict(RECIPE)))
    summary = stats.summary()
    assert "recipe workflow: planner -3.0000 in 3 reward(s)" in summary, summary
    assert "recipe delegation" not in summary  # the fallback's step was no planner's decision
    t = pq.read_table(out).to_pylist()
    assert {r["agent_name"] for r in t} == {"planner", "executor"}


def test_the_demo_draws_flow_tasks_and_converts_with_the_teams_recipe(tmp_path):
    from agl_bridge.trainer.conversion import ConvertConfig
    from agl_bridge.trainer.loop.config import LoopConfig
    from agl_bridge.trainer.loop.demo import (
        TEAMS,
        held_out,
        team_agents,
        team_commands,
        team_recipe,
        training_tasks,
    )

    assert TEAMS["flow"].endswith("teams.flow") and team_agents("flow") == ("planner", "executor")
    ev = held_out("flow", 20, 0)
    train = training_tasks("flow", 50, 0, 0, ev)
    assert len(train) == 50 and all(t["task_id"].startswith("train-") for t in train)
    assert not {t["task_id"].removeprefix("eval-") for t in ev} & {
        t["task_id"].removeprefix("train-") for t in train}
    assert training_tasks("flow", 50, 0, 1, ev) != train  # drawn per round
    assert team_commands("flow")[1] == f"python -m {TEAMS['flow']} --reward flow"
    cfg = team_recipe("flow", LoopConfig(model="m"), tmp_path)
    assert cfg.convert.rewards == str(tmp_path / "flow-recipe.toml")
    assert [t.name for t in cfg.convert.recipe.terms] == [
        "workflow", "global", "delegation", "tool_choice"]
    assert team_recipe("add", LoopConfig(model="m"), tmp_path).convert.rewards is None
    (tmp_path / "mine.toml").write_text("[terms.tool_choice]\n")
    mine = LoopConfig(model="m", convert=ConvertConfig(rewards=str(tmp_path / "mine.toml")))
    kept = team_recipe("flow", mine, tmp_path)  # --convert.rewards given: the user's recipe
    assert [t.name for t in kept.convert.recipe.terms] == ["tool_choice"]


def test_the_workflow_measures_and_the_demo_summary_of_them():
    from agl_bridge.trainer.loop.demo import summary

    def result(valid, right, calls, retries, steps=2, depth=2):
        return {"plan_valid": valid, "steps": steps if valid else None,
                "depth": depth if valid else None, "right_tool": right, "tool_calls": calls,
                "retries": retries, "seconds": 2.0}

    before = flow.measures([result(False, 0, 2, 1), result(True, 1, 2, 0, 3, 2)])
    after = flow.measures([result(True, 2, 2, 0), result(True, 2, 2, 0, 1, 1)])
    assert before["valid plans"]["rate"] == 0.5 and after["valid plans"]["rate"] == 1.0
    assert before["tool accuracy"]["rate"] == 0.25 and before["tool accuracy"]["n"] == 4
    assert before["steps per valid plan"]["mean"] == 3.0 and after["depth per valid plan"][
        "mean"] == 1.5
    assert before["retries per task"]["mean"] == 0.5
    stats = {"success": {"rate": 0.5, "low": 0.1, "high": 0.9, "n": 2},
             "agents": {"planner": {"rate": 0.5}}}
    text = summary({"demo": {"eval_temperature": 0, "eval_rollouts": 1, "temperature": 0.6},
                    "rounds": [], "seconds": {"rollouts": 60.0}},
                   {**stats, "measures": before}, {**stats, "measures": after})
    assert "  valid plans: 50.0% [" in text and "] -> 100.0% [" in text
    assert "  steps per valid plan: 3.00 [3.00, 3.00] -> 1.50 [" in text


def test_branch_has_the_planner_write_k_workflows_and_the_best_checked_one_runs(tmp_path):
    with ScriptedServer(vllm=True, script=_script(), completion_ids=[5, 6]) as server:
        run = run_team(f"{TEAM} --branch 3", _tasks(), tmp_path / "run",
                       base_url=server.base_url, aliases=None, timeout_s=300)
    assert all(r["success"] and r["plan_valid"] for r in run.results)
    planner = [b for b in server.requests if b["model"] == "planner"]
    assert [b.get("n") for b in planner] == [3] * 3
    assert all(b.get("n") is None for b in server.requests if b["model"] == "executor")
    out = tmp_path / "t.parquet"
    convert(list((tmp_path / "run" / "spans").rglob("*.parquet")), out,
            ConvertConfig(algorithm="at_grpo", recipe=recipe_from_dict(RECIPE)))
    t = pq.read_table(out).to_pylist()
    candidates = [r for r in t if r["agent_name"] == "planner"]
    assert sorted(r["candidate_index"] for r in candidates) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    score = flow.plan_score(0.5)
    good = type("Choice", (), {"message": type("M", (), {"content": gold_plan(
        {"kind": "price", "items": ["fig"]})})()})()
    bad = type("Choice", (), {"message": type("M", (), {"content": "[]"})()})()
    assert (score(good), score(bad)) == (0.5, 0.0)


def test_a_call_that_runs_but_does_another_step_fails_validation(tmp_path):
    """An executor that copies its worked example (``lookup fig``) whatever the step: the tool
    runs, but the validator compares the result with what the step comes to, so only the fig's
    own price passes; the others are retried, told why, and the executor scores 0 there."""
    with ScriptedServer(vllm=True, script=_script(lazy_executor=True),
                        completion_ids=[5, 6]) as server:
        run = run_team(TEAM, _tasks(), tmp_path / "run", base_url=server.base_url,
                       aliases=None, timeout_s=300)
    by_task = {r["task_id"]: r for r in run.results}
    assert by_task["p"]["success"] and by_task["p"]["agent_score"]["executor"] == 1.0
    assert by_task["p"]["retries"] == 0
    for t in ("c", "q"):
        r = by_task[t]
        assert r["plan_valid"] and not r["success"]
        assert r["retries"] == {"c": 2, "q": 3}[t]  # every step but q's fig lookup, once each
    assert by_task["c"]["agent_score"]["executor"] == 0.0
    assert by_task["q"]["steps_right"] == 0  # lime and plum looked up as fig; 2 calls for n3
    assert any("lookup 'fig' does not do this step" in b["messages"][-1]["content"]
               for b in server.requests)
    assert run.summary["steps_right"] < run.summary["tool_accuracy"]
