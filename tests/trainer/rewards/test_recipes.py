"""Reward recipes: rewards derived at conversion from what the spans hold, declared in TOML."""

import json
import subprocess
import sys
from itertools import count
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, spans_to_transitions
from agl_bridge.trainer.conversion.columns import columns_to_read
from agl_bridge.trainer.rewards.evaluations import EvaluationReward
from agl_bridge.trainer.rewards.recipes import (
    EPISODE_KEY,
    RecipeError,
    load_recipe,
    recipe_from_dict,
)
from agl_bridge.trainer.rewards.terms import Coordination, Cost, Dag, Votes
from agl_bridge.trainer.rewards.terms import dag as dag_term
from agl_bridge.trainer.rewards.terms import votes as votes_term
from agl_bridge.trainer.rewards.terms.coordination import NO_QUALITY
from agl_bridge.trainer.rewards.terms.ratings import REWARDS, source
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
    ({"terms": {"nope": {}}}, r"\[terms.nope\]: unknown term; known: \['coordination', 'cost', "
     r"'dag', 'delegation', 'global', 'tool_choice', 'tool_failure', 'votes', 'workflow'\]"),
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


# -- the terms, one by one, on hand-built unit tables ------------------------------------------
_IDS = count(1)


def span(episode, t, name, attrs=None, *, end=None, **columns):
    return {"trace_id": "T", "span_id": f"x{next(_IDS):06d}", "name": name,
            "episode_id": episode, "start_time_unix_nano": t,
            "end_time_unix_nano": t if end is None else end,
            "attributes": json.dumps(attrs) if attrs is not None else None, **columns}


def chat(episode, t, agent, turn=None, *, end=None, usage=None, rnd=None, parent=None):
    row = llm(episode, t, agent=agent, turn=turn, round=rnd)
    row.update(end_time_unix_nano=end, parent_span_id=parent, attributes=json.dumps(
        {sc.GEN_AI_USAGE_INPUT_TOKENS: usage[0], sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage[1]})
        if usage else None)
    return row


def vote(episode, t, voter, target, **columns):
    return span(episode, t, sc.SPAN_VOTE, {sc.VOTE_VOTER: voter, sc.VOTE_TARGET: target},
                **columns)


def answer(episode, t, agent):
    return span(episode, t, sc.SPAN_NEW_ANSWER, {sc.COORDINATION_AGENT: agent})


def restart(episode, t, agent):
    return span(episode, t, sc.SPAN_RESTART, {sc.COORDINATION_AGENT: agent})


def final(episode, t, agent, counts=None, **columns):
    attrs = {sc.COORDINATION_AGENT: agent}
    if counts is not None:
        attrs[sc.VOTE_COUNTS] = counts if isinstance(counts, str) else json.dumps(counts)
    return span(episode, t, sc.SPAN_FINAL_SELECTION, attrs, **columns)


def step(episode, t, task, kind, *, agent=None, attempt=0, depends_on=None, passed=None,
         workflow="w1", end=None):
    attrs = {sc.WORKFLOW_ID: workflow, sc.WORKFLOW_TASK_ID: task,
             sc.WORKFLOW_TASK_ATTEMPT: attempt}
    if depends_on is not None:
        attrs[sc.WORKFLOW_TASK_DEPENDS_ON] = depends_on
    if passed is not None:
        attrs[sc.WORKFLOW_VALIDATION_PASSED] = passed
    if task is None:
        del attrs[sc.WORKFLOW_TASK_ID]
    return span(episode, t, sc.workflow_step_span_name(kind), attrs, end=end, agent_name=agent)


def unit(rows):
    """Rows as the converter hands them to a term: the span schema plus ``episode_key``."""
    t = table(rows)
    return t.append_column(EPISODE_KEY, pc.cast(t["episode_id"], "string"))


def got(derived):
    """(scope, agent, turn, value rounded) per reward, sorted."""
    return sorted((r.scope, r.agent, r.turn, round(r.value, 9)) for r in derived.rewards)


def evaluation(episode, value, *, name="judge", agent=None):
    return EvaluationReward(episode, value, "agent" if agent else "episode", agent, None, name,
                            "judge")


def test_votes_for_the_selected_answer_follow_the_massgen_rule():
    rows = [chat("e1", 1, "a", 0, end=2), chat("e1", 15, "a", 1, end=16),
            chat("e1", 1, "b", 0, end=3), chat("e1", 5, "b", 1, end=12),  # ends after b's vote
            answer("e1", 4, "a"), answer("e1", 4, "b"),
            vote("e1", 10, "a", "a"), vote("e1", 11, "b", "a"), vote("e1", 12, "c", "b"),
            vote("e1", 13, "d", "b", agent_name="d", turn_index=7),  # recorded in d's scope
            final("e1", 20, "a")]
    out = Votes()(unit(rows))
    assert got(out) == [("agent", "c", None, -0.5), ("turn", "a", 0, 1.0),
                        ("turn", "b", 0, 1.0), ("turn", "d", 7, -0.5)]
    assert {r.term for r in out.rewards} == {"votes"} and not out.notes


def test_only_each_voters_current_vote_counts():
    rows = [vote("e1", 5, "a", "b"), vote("e1", 6, "b", "a"), restart("e1", 7, "b"),
            vote("e1", 8, "a", "a"), vote("e1", 9, "c", "b"), final("e1", 20, "a")]
    out = Votes()(unit(rows))  # a's first vote replaced, b's withdrawn by its restart
    assert got(out) == [("agent", "a", None, 1.0), ("agent", "c", None, -0.5)]
    assert out.notes == {f"recipe votes: {votes_term.SUPERSEDED}": 2}


def test_a_vote_for_an_agent_that_never_answered_is_wrong():
    rows = [answer("e1", 1, "a"), answer("e1", 1, "b"), vote("e1", 5, "a", "ghost"),
            vote("e1", 6, "b", "a"), final("e1", 9, "a")]
    assert got(Votes()(unit(rows))) == [("agent", "a", None, -0.5), ("agent", "b", None, 1.0)]


def test_votes_without_a_final_selection_or_with_several():
    none = Votes()(unit([vote("e1", 5, "a", "b"), vote("e1", 6, "b", "b")]))
    assert none.rewards == [] and none.notes == {f"recipe votes: {votes_term.NO_SELECTION}": 2}
    several = Votes()(unit([vote("e2", 5, "a", "b"), final("e2", 8, "a"), final("e2", 9, "b")]))
    assert got(several) == [("agent", "a", None, 1.0)]  # the latest selection: b
    assert several.notes == {f"recipe votes: {votes_term.SEVERAL_SELECTIONS}": 1}


def test_votes_with_missing_attributes_are_noted_not_fatal():
    rows = [span("e1", 5, sc.SPAN_VOTE, {sc.VOTE_VOTER: "a"}),  # no target
            span("e1", 6, sc.SPAN_VOTE, None), {**vote("e1", 7, "b", "a"), "attributes": "{"},
            vote("e1", 8, "c", "a"), span("e1", 9, sc.SPAN_FINAL_SELECTION, {}),
            final("e1", 10, "a", counts="not json")]
    out = Votes()(unit(rows))
    assert got(out) == [("agent", "c", None, 1.0)]
    assert out.notes == {"recipe votes: vote span without voter or target (ignored)": 3,
                         "recipe votes: final selection span without an agent (ignored)": 1,
                         "recipe votes: final selection with unreadable vote counts "
                         "(votes counted from vote spans)": 1}


def test_votes_for_the_best_rated_answer():
    rows = [answer("e1", 1, "a"), answer("e1", 1, "b"),
            reward("e1", 2, 0.2, scope="agent", agent="a"),
            reward("e1", 2, 0.9, scope="turn", agent="b", turn=0),
            reward("e1", 2, 5.0, scope="agent", agent="c"),  # c never answered: not a candidate
            reward("e1", 2, 7.0),  # the team's reward rates nobody
            vote("e1", 5, "a", "a"), vote("e1", 6, "c", "b"), final("e1", 9, "a")]
    evals = {"e1": [evaluation("e1", 0.5, agent="a", name="helpful")]}
    # ratings: a 0.2 + 0.5 = 0.7, b 0.9: b is best, though a was selected
    out = Votes(target="best_rated")(unit(rows), evals)
    assert got(out) == [("agent", "a", None, -0.5), ("agent", "c", None, 1.0)]
    judge = {"e1": [evaluation("e1", 0.9, agent="a"), evaluation("e1", 0.3, agent="b"),
                    evaluation("e1", 0.5, agent="b")]}  # b: mean 0.4
    by_judge = Votes.from_config({"target": "best_rated", "rating": "evaluation:judge"}, "r")
    assert got(by_judge(unit(rows), judge)) == [("agent", "a", None, 1.0),
                                                ("agent", "c", None, -0.5)]


def test_best_rated_ties_and_no_ratings_reward_nobody():
    rows = [answer("e1", 1, "a"), answer("e1", 1, "b"), vote("e1", 5, "a", "a"),
            vote("e1", 6, "b", "a"), final("e1", 9, "a")]
    tie = {"e1": [evaluation("e1", 0.5, agent="a"), evaluation("e1", 0.5, agent="b")]}
    judge = source({"rating": "evaluation:judge"}, "rating", REWARDS, "r")
    out = Votes(target="best_rated", rating=judge)(unit(rows), tie)
    assert out.rewards == [] and out.notes == {f"recipe votes: {votes_term.TIE}": 2}
    unrated = Votes(target="best_rated")(unit(rows))
    assert unrated.rewards == [] and unrated.notes == {f"recipe votes: {votes_term.NO_RATING}": 2}


def test_vote_constants_and_weight_come_from_the_recipe():
    term = Votes.from_config({"correct": 2.0, "wrong": -1.0, "weight": 0.5}, "r")
    rows = [vote("e1", 5, "a", "a"), vote("e1", 6, "b", "c"), final("e1", 9, "a")]
    assert got(term(unit(rows))) == [("agent", "a", None, 1.0), ("agent", "b", None, -0.5)]


def coordinated(episode="e1", counts=None):
    """Two agents: a's call 100 + 20 tokens, b's 50 + 30, one call without usage (its ids:
    2 + 2); rounds up to 4 (5 rounds); team reward 0.5; a selected."""
    return [chat(episode, 1, "a", 0, usage=(100, 20), rnd=0),
            chat(episode, 2, "b", 0, usage=(50, 30), rnd=4), chat(episode, 3, "b", 1),
            answer(episode, 4, "a"), answer(episode, 4, "b"),
            vote(episode, 5, "a", "a"), vote(episode, 6, "b", "b"),
            reward(episode, 8, 0.5), final(episode, 9, "a", counts)]


def test_coordination_is_the_massgen_formula():
    # 2 x 0.5 + 1 (a has 2 of 3 votes) - 0.1 x (5 - 3) - 0.001 x 204
    out = Coordination()(unit(coordinated(counts={"a": 2, "b": 1})))
    assert got(out) == [("team", None, None, round(1.0 + 1.0 - 0.2 - 0.204, 9))]
    unanimous = Coordination.from_config({"consensus_rule": "unanimous"}, "r")
    assert got(unanimous(unit(coordinated(counts={"a": 2, "b": 1})))) == [
        ("team", None, None, round(1.0 - 0.5 - 0.2 - 0.204, 9))]
    # no tallies on the selection: the vote spans, 1 of 2 for a, is no majority
    assert got(Coordination()(unit(coordinated()))) == [
        ("team", None, None, round(1.0 - 0.5 - 0.2 - 0.204, 9))]


def test_coordination_constants_and_token_count_are_configurable():
    term = Coordination.from_config({"quality_weight": 1.0, "consensus": 2.0,
                                     "no_consensus": 0.0, "free_rounds": 0, "per_round": -1.0,
                                     "per_token": -0.01, "tokens": "output", "weight": 2.0},
                                    "r")
    # 2 x (0.5 + 2 - 5 - 0.01 x (20 + 30 + 2))
    assert got(term(unit(coordinated(counts={"a": 2})))) == [
        ("team", None, None, round(2 * (0.5 + 2.0 - 5.0 - 0.52), 9))]


def test_coordination_quality_from_a_judge_and_when_missing():
    rows = [r for r in coordinated(counts={"a": 2}) if r["name"] != "agl_bridge.reward"]
    judge = Coordination.from_config({"quality": "evaluation:judge"}, "r")
    evals = {"e1": [evaluation("e1", 0.8, agent="a"), evaluation("e1", 0.2, agent="b"),
                    evaluation("e1", 0.6)]}  # the selected agent's score wins
    assert got(judge(unit(rows), evals)) == [("team", None, None, round(1.6 + 1 - 0.2 - 0.204, 9))]
    episode_only = {"e1": [evaluation("e1", 0.6), evaluation("e1", 0.4)]}  # the mean: 0.5
    assert got(judge(unit(rows), episode_only)) == [
        ("team", None, None, round(1.0 + 1 - 0.2 - 0.204, 9))]
    missing = Coordination()(unit(rows))
    assert got(missing) == [("team", None, None, round(1 - 0.2 - 0.204, 9))]
    assert missing.notes == {f"recipe coordination: {NO_QUALITY}": 1}


def test_coordination_only_for_episodes_that_coordinate():
    rows = [chat("e1", 1, "a", 0, usage=(10, 10)), reward("e1", 2, 1.0),
            chat("e2", 1, "a", 0, usage=(10, 10)), restart("e2", 2, "a")]
    out = Coordination()(unit(rows))  # e2: no selection, no votes, quality 0, 20 tokens
    assert [(r.episode, round(r.value, 9)) for r in out.rewards] == [("e2", -0.52)]
    assert out.notes["recipe coordination: episode without a final selection (no consensus)"] == 1


def flow_run(episode="e1", *, total_passes=False):
    """The Flow example's workflow: left (alice) and right (bob) pass; total (alice, depends on
    both) fails, is retried once, and passes or fails again."""
    return [step(episode, 1, "left", "schedule", agent="alice"),
            step(episode, 2, "left", "execute", agent="alice", end=4),
            step(episode, 5, "left", "validate", agent="alice", passed=True),
            step(episode, 6, "right", "schedule", agent="bob"),
            step(episode, 7, "right", "execute", agent="bob"),
            step(episode, 8, "right", "validate", agent="bob", passed=True),
            step(episode, 9, "total", "schedule", agent="alice", depends_on=["left", "right"]),
            step(episode, 10, "total", "execute", agent="alice"),
            step(episode, 11, "total", "validate", agent="alice", passed=False),
            step(episode, 12, "total", "retry", agent="alice", attempt=1),
            step(episode, 13, "total", "validate", agent="alice", attempt=1,
                 passed=total_passes)]


def test_dag_rewards_are_the_flow_design():
    out = Dag()(unit(flow_run()))
    assert got(out) == [("agent", "alice", None, -0.6), ("agent", "alice", None, 1.0),
                        ("agent", "bob", None, 1.0), ("team", None, None, round(2 / 3, 9))]
    passed = Dag()(unit(flow_run(total_passes=True)))  # the dependents' success: +0.5 each
    assert got(passed) == [("agent", "alice", None, 0.9), ("agent", "alice", None, 1.5),
                           ("agent", "bob", None, 1.5), ("team", None, None, 1.0)]
    assert not out.notes and not passed.notes


def test_dag_constants_and_efficiency():
    term = Dag.from_config({"success": 2.0, "failure": -1.0, "retry": -0.5, "downstream": 1.0,
                            "efficiency": 0.3, "workflow": 3.0}, "r")
    rows = [step("e1", 0, "a", "execute", agent="x", end=10**9),  # 1 s: 0.3 / 2
            step("e1", 2 * 10**9, "a", "validate", agent="x", passed=True),
            step("e1", 3 * 10**9, "b", "execute", agent="y", depends_on=["a"]),
            step("e1", 4 * 10**9, "b", "validate", agent="y", passed=False)]
    assert got(term(unit(rows))) == [("agent", "x", None, 2.15), ("agent", "y", None, -0.7),
                                     ("team", None, None, 1.5)]


def test_dag_edge_cases_are_noted_never_fatal():
    rows = [step("e1", 1, "x", "execute", agent="p"), step("e1", 2, "x", "retry", agent="p",
                                                           attempt=1),  # never validated
            step("e1", 3, "y", "execute", agent="q", depends_on=["ghost", "y"]),
            step("e1", 4, "y", "validate", agent="q", passed=True),
            step("e1", 5, "m", "execute", agent="r", depends_on=["n"]),
            step("e1", 6, "m", "validate", agent="r", passed=True),
            step("e1", 7, "n", "execute", agent="s", depends_on=["m"]),
            step("e1", 8, "n", "validate", agent="s", passed=True),
            step("e1", 9, "z", "validate", passed=True),  # no agent anywhere
            step("e1", 10, "v", "validate", agent="t"),  # no verdict
            step("e1", 11, None, "execute", agent="p"),  # no task id
            step("e1", 12, "u", "schedule", agent="t", depends_on="m")]  # not a list
    out = Dag()(unit(rows))
    assert got(out) == [("agent", "p", None, -0.6), ("agent", "q", None, 1.0),
                        ("agent", "r", None, 1.0), ("agent", "s", None, 1.0),
                        ("agent", "t", None, -0.5), ("agent", "t", None, -0.5),
                        ("team", None, None, round(4 / 7, 9))]
    n = {k.removeprefix("recipe dag: "): v for k, v in out.notes.items()}
    assert n == {dag_term.NEVER_VALIDATED: 3, dag_term.UNKNOWN_DEPENDENCY: 1,
                 dag_term.CYCLE: 3, dag_term.NO_AGENT: 1, dag_term.NO_VERDICT: 1,
                 dag_term.NO_TASK_ID: 1, dag_term.BAD_DEPENDS_ON: 1}


def test_dag_turn_scope_and_several_workflows():
    rows = flow_run()
    attempt = rows[9]["span_id"]  # total's retry: its call is alice's turn 1
    rows += [chat("e1", 12, "alice", 1, parent=attempt), chat("e1", 2, "alice", 0,
                                                              parent=rows[1]["span_id"])]
    rows += [step("e1", 20, "solo", "execute", agent="bob", workflow="w2"),
             step("e1", 21, "solo", "validate", agent="bob", passed=True, workflow="w2")]
    out = Dag(scope="turn")(unit(rows))
    assert got(out) == [("agent", "bob", None, 1.0), ("agent", "bob", None, 1.0),
                        ("team", None, None, round(2 / 3, 9)), ("team", None, None, 1.0),
                        ("turn", "alice", 0, 1.0), ("turn", "alice", 1, -0.6)]
    assert out.notes == {f"recipe dag: {dag_term.NO_TURN}": 2}  # bob's calls were not traced


def test_cost_charges_each_call_to_its_agent_and_turn():
    rows = [chat("e1", 0, "a", 0, end=2 * 10**9, usage=(100, 20)), chat("e1", 0, "b"),
            chat("e1", 0, None, 3, end=10**9, usage=(0, 0)),
            reward("e1", 5, 1.0), tool("e1", 6)]
    term = Cost.from_config({"per_token": -0.001, "per_second": -0.01}, "r")
    out = term(unit(rows))  # b: 4 tokens from its ids, no end; the third: only 1 s
    assert got(out) == [("agent", "b", None, -0.004), ("episode", None, None, -0.01),
                        ("turn", "a", 0, -0.14)]
    assert out.notes == {"recipe cost: LLM call without an end time (latency 0)": 1}
    outputs = Cost.from_config({"tokens": "output"}, "r")(unit(rows))
    assert got(outputs) == [("agent", "b", None, -0.002), ("turn", "a", 0, -0.02)]


def test_token_counts_ignore_keys_inside_string_values():
    quoted = json.dumps({"note": '{"gen_ai.usage.input_tokens": 999}',
                         sc.GEN_AI_USAGE_OUTPUT_TOKENS: 7})
    row = {**chat("e1", 0, "a", 0), "attributes": quoted}  # input: its 2 prompt ids
    assert got(Cost()(unit([row]))) == [("turn", "a", 0, -0.009)]


@pytest.mark.parametrize("config, message", [
    ({"votes": {"target": "winner"}}, r"votes\]\.target: expected one of \['selected', "),
    ({"votes": {"rating": "judge"}}, r"votes\]\.rating: expected 'rewards' or 'evaluation:N"),
    ({"coordination": {"quality": "evaluation:"}}, r"coordination\]\.quality: expected 'task'"),
    ({"coordination": {"consensus_rule": "most"}}, r"consensus_rule: expected one of"),
    ({"coordination": {"free_rounds": -1}}, r"free_rounds: expected an integer >= 0"),
    ({"coordination": {"tokens": "all"}}, r"tokens: expected one of \['input\+output'"),
    ({"dag": {"scope": "team"}}, r"dag\]\.scope: expected one of \['agent', 'turn'\]"),
    ({"dag": {"retries": -0.1}}, r"dag\]: unknown key\(s\) \['retries'\]"),
    ({"cost": {"per_token": float("nan")}}, r"cost\]\.per_token: expected a finite number"),
])
def test_bad_term_tables_are_refused_by_key(config, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"terms": config}, "r.toml")


def test_the_attributes_column_is_read_only_when_a_term_needs_it():
    def columns(terms):
        return columns_to_read(False, recipe_from_dict({"terms": terms}).columns)

    assert "attributes" not in columns({"tool_failure": {}})
    assert "name" not in columns({"tool_failure": {}})
    for term in ("votes", "coordination", "dag", "cost"):
        assert "attributes" in columns({term: {}}), term
    assert "name" in columns({"votes": {}}) and "name" in columns({"dag": {}})
    assert "parent_span_id" not in columns({"dag": {}})  # only turn scope needs it
    assert "parent_span_id" in columns({"dag": {"scope": "turn"}})


def test_a_recipe_of_every_term_through_the_converter(tmp_path):
    rows = coordinated(counts={"a": 2}) + [tool("e1", 20, agent="a", turn=0, failed=True)]
    path = tmp_path / "recipe.toml"
    path.write_text('[terms.votes]\n[terms.coordination]\n[terms.cost]\nper_token = -0.01\n'
                    '[terms.tool_failure]\n[terms.dag]\n')
    out, stats = spans_to_transitions(table(rows), ConvertConfig(recipe=load_recipe(path)))
    # votes: a +1 (for a), b -0.5; coordination 1 + 1 - 0.2 - 0.204 = 1.596 for the team;
    # cost: a 1.2, b 0.8 + 0.04; tool_failure: a -0.2; the task reward 0.5
    assert dict(stats.recipe) == pytest.approx({
        ("votes", "a"): 1.0, ("votes", "b"): -0.5, ("coordination", None): 1.596,
        ("cost", "a"): -1.2, ("cost", "b"): -0.84, ("tool_failure", "a"): -0.2})
    summary = stats.summary()
    for line in ("recipe votes: a +1.0000 in 1 reward(s)", "recipe votes: b -0.5000 in 1",
                 "recipe coordination: (episode) +1.5960 in 1", "recipe cost: a -1.2000 in 1",
                 "recipe cost: b -0.8400 in 2", "recipe tool_failure: a -0.2000 in 1"):
        assert line in summary, line
    by_turn = {(t["agent_name"], t["turn_index"]): t["reward"] for t in out.to_pylist()}
    # every turn: team 0.5 + 1.596; own: its cost, a@0 its vote and tool failure, b's vote on
    # b@1 (b's latest call before the vote)
    assert by_turn == pytest.approx({("a", 0): 2.096 + 1.0 - 1.2 - 0.2,
                                     ("b", 0): 2.096 - 0.8, ("b", 1): 2.096 - 0.5 - 0.04})


def test_terms_read_only_the_columns_they_declare():
    """The converter hands a term only the columns it declares: the same rewards and notes
    from those as from every column."""
    rows = (coordinated(counts={"a": 2}) + flow_run("e2") + [
        tool("e1", 20, agent="a", turn=0, failed=True),
        chat("e2", 10, "alice", 0, end=11, parent="nope", usage=(3, 4))])
    evals = {"e1": [evaluation("e1", 0.8, agent="a")]}
    full = unit(rows)
    for config in ({"tool_failure": {}}, {"votes": {"target": "best_rated"}},
                   {"coordination": {"quality": "evaluation:judge"}},
                   {"dag": {"scope": "turn", "efficiency": 1.0}}, {"dag": {}},
                   {"cost": {"per_second": -1.0}}):
        (term,) = recipe_from_dict({"terms": config}).terms
        narrow = full.select(list(dict.fromkeys([*term.columns, EPISODE_KEY])))
        expected = term(full, evals)
        assert expected.rewards, config
        assert term(narrow, evals) == expected, config


def test_agl_bridge_convert_takes_a_recipe_file(tmp_path):
    pq.write_table(table(coordinated(counts={"a": 2})), tmp_path / "spans.parquet")
    (tmp_path / "votes.toml").write_text('[terms.votes]\ntarget = "selected"\n')
    (tmp_path / "bad.toml").write_text('[terms.votes]\ntarget = "winner"\n')
    exe = Path(sys.executable).with_name("agl-bridge")

    def convert(recipe):
        return subprocess.run([str(exe), "convert", str(tmp_path / "spans.parquet"),
                               str(tmp_path / "t.parquet"), "--rewards", str(tmp_path / recipe)],
                              capture_output=True, text=True)
    out = convert("votes.toml")
    assert out.returncode == 0, out.stderr
    assert "recipe votes: a +1.0000 in 1 reward(s)" in out.stdout
    assert "recipe votes: b -0.5000 in 1 reward(s)" in out.stdout
    bad = convert("bad.toml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "bad.toml: [terms.votes].target: expected one of ['selected', 'best_rated']" in \
        bad.stderr
