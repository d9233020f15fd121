"""Reward recipes: rewards derived at conversion from what the spans hold, declared in TOML."""

import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, spans_to_transitions
from agl_bridge.trainer.rewards.recipes import RecipeError, load_recipe, recipe_from_dict
from tests.factories import llm, reward, table


def tool(episode, t, *, agent="a", turn=0, failed=False):
    return {"trace_id": "T", "span_id": f"tool{episode}{t}", "name": "execute_tool calc",
            "episode_id": episode, "task_id": "t1", "agent_name": agent, "turn_index": turn,
            "operation_name": sc.OP_EXECUTE_TOOL, "start_time_unix_nano": t,
            "status_code": "ERROR" if failed else "OK"}


def test_a_failed_tool_call_costs_the_calling_agent_its_turn(tmp_path):
    rows = [llm("e1", 1, agent="a"), tool("e1", 2, failed=True), tool("e1", 3, failed=True),
            llm("e1", 4, agent="b", prompt=[9]), tool("e1", 5, agent="b"),
            reward("e1", 6, 1.0)]
    path = tmp_path / "rewards.toml"
    path.write_text("[terms.tool_failure]\npenalty = -0.25\n")
    out, stats = spans_to_transitions(table(rows), ConvertConfig(recipe=load_recipe(path)))
    assert sorted((t["agent_name"], t["reward"]) for t in out.to_pylist()) == [
        ("a", 0.5), ("b", 1.0)]
    assert stats.recipe == {("tool_failure", "a"): -0.5}
    assert "recipe tool_failure: a -0.5000 in 2 reward(s)" in stats.summary()
    plain, _ = spans_to_transitions(table(rows))  # stored traces, rewarded again without it
    assert sorted(t["reward"] for t in plain.to_pylist()) == [1.0, 1.0]


def test_the_recipe_can_be_the_only_reward():
    rows = [llm("e1", 1), tool("e1", 2, failed=True), llm("e2", 1, prompt=[4]), tool("e2", 2)]
    recipe = recipe_from_dict({"terms": {"tool_failure": {"penalty": -1.0, "weight": 0.5}}})
    out, _ = spans_to_transitions(table(rows), ConvertConfig(recipe=recipe, missing_reward=0.0))
    assert sorted((t["episode_id"], t["reward"]) for t in out.to_pylist()) == [
        ("e1", -0.5), ("e2", 0.0)]


@pytest.mark.parametrize("config, message", [
    ({"terms": {"nope": {}}}, r"\[terms.nope\]: unknown term; known: \['tool_failure'\]"),
    ({"terms": {"tool_failure": {"penalty": "high"}}}, r"tool_failure\]\.penalty: expected a"),
    ({"terms": {"tool_failure": {"typo": 1}}}, r"unknown key\(s\) \['typo'\]"),
    ({"terms": {"tool_failure": 3}}, r"must be a table"),
    ({"evaluations": {"feedback": True}}, r"\[evaluations\]\.feedback: expected a finite"),
    ({"other": {}}, r"unknown section\(s\) \['other'\]"),
])
def test_bad_recipes_are_refused_by_key(config, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(config, "r.toml")


def test_bad_recipe_files_name_the_file(tmp_path):
    (tmp_path / "bad.toml").write_text("[terms\n")
    with pytest.raises(RecipeError, match=r"bad\.toml: not valid TOML"):
        load_recipe(tmp_path / "bad.toml")
    with pytest.raises(RecipeError, match=r"missing\.toml: cannot read"):
        load_recipe(tmp_path / "missing.toml")


def test_the_recipes_evaluation_weights_apply_unless_given():
    from agl_bridge.feedback import evaluation_attributes, evaluation_row
    from agl_bridge.trainer.rewards.evaluations import JOINED, NOT_COUNTED

    rows = [llm("e1", 1), reward("e1", 2, 0.0),
            evaluation_row(evaluation_attributes("e1", 0.5, name="helpful")),
            evaluation_row(evaluation_attributes("e1", 0.25, name="tone"))]
    recipe = recipe_from_dict({"evaluations": {"helpful": 2.0}})
    out, stats = spans_to_transitions(table(rows), ConvertConfig(recipe=recipe))
    assert out["reward"].to_pylist() == [1.0]  # 0 + 2 x 0.5; tone not counted
    assert stats.notes[JOINED] == 1 and stats.notes[NOT_COUNTED] == 1
    given, _ = spans_to_transitions(table(rows), ConvertConfig(
        recipe=recipe, evaluation_weights={"tone": 1.0}))
    assert given["reward"].to_pylist() == [0.25]  # given explicitly: the recipe's give way
