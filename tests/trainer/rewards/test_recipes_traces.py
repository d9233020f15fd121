"""Recipes on real traces: the real MassGen 0.1.97 run (votes, restarts, a final selection) and
the Flow example (tasks, retries, dependencies), captured to span Parquet and rewarded again at
conversion with a recipe file. Every expected value is computed here from the spans or from
the orchestrator's own account, independently of the terms."""

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.feedback import evaluation_attributes, evaluation_row
from agl_bridge.otel.rows import rows_to_table
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.rewards.recipes import load_recipe
from tests.conftest import load_example
from tests.massgen_venv import RUNNER, call
from tests.scripted_server import ScriptedServer
from tests.span_files import spans_to_table

ANSWER_IDS, VOTE_IDS, FINAL_IDS = [21, 22], [31, 32], [41, 42]


def split_vote(body):
    """Answer while no answer exists; then agent_a votes for agent1 and agent_b for agent2
    (MassGen's anonymous labels): a split vote, so one of them voted for the answer that was
    not selected. The winner presents."""
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    text = json.dumps(body.get("messages"))
    if "vote" in tools:
        if "(no answers available yet)" in text:
            return "", [call("new_answer", content="2 + 3 = 5")]
        label = "agent1" if body["model"] == "m-agent_a" else "agent2"
        return "", [call("vote", agent_id=label, reason="mine is right")]
    if "new_answer" in tools:
        return "", [call("new_answer", content="The answer is 5.")]
    return "5", []


def ids_of(body):
    """Completion ids say what the call did: its vote, an answer, or the final answer."""
    _, calls = split_vote(body)
    kind = calls[0]["name"] if calls else "final"
    return [1, 2, 3, len(body["messages"])], {"vote": VOTE_IDS, "new_answer": ANSWER_IDS,
                                              "final": FINAL_IDS}[kind]


@pytest.fixture(scope="module")
def massgen_traces(massgen_python, tmp_path_factory):
    """Span Parquet of one real MassGen run, captured with AGL_BRIDGE_AUTO=1."""
    work = tmp_path_factory.mktemp("massgen")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(work / "traces"),
               OPENAI_API_KEY="unused", LITELLM_LOCAL_MODEL_COST_MAP="True",
               OTEL_SERVICE_NAME="massgen-team")
    with ScriptedServer(vllm=True, script=split_vote, ids_for=ids_of) as server:
        out = subprocess.run([str(massgen_python), str(RUNNER), server.base_url], env=env,
                             cwd=work, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    selected = json.loads(out.stdout.strip().splitlines()[-1])["selected_agent"]
    assert selected in ("agent_a", "agent_b")  # a failed backend would give None
    return work / "traces", selected


def read_rows(directory: Path) -> list[dict]:
    return pa.concat_tables([pq.read_table(f) for f in iter_parquet_files(directory)]
                            ).to_pylist()


def massgen_rule(rows):
    """The MassGen design's compute_voting_reward over the agents' current votes: each voter's
    latest vote (MassGen keeps one per agent), +1 if for the winner, else -0.5."""
    spans = sorted(rows, key=lambda r: (r["start_time_unix_nano"], r["span_id"]))
    attrs = [json.loads(r["attributes"] or "{}") for r in spans]
    current = {a[sc.VOTE_VOTER]: a[sc.VOTE_TARGET] for r, a in zip(spans, attrs)
               if r["name"] == sc.SPAN_VOTE}
    (winner,) = [a for r, a in zip(spans, attrs) if r["name"] == sc.SPAN_FINAL_SELECTION]
    selected = winner[sc.COORDINATION_AGENT]
    return {v: 1.0 if t == selected else -0.5 for v, t in current.items()}, winner, current


def test_a_stored_massgen_run_is_rewarded_again_by_the_voting_rule(massgen_traces, tmp_path):
    traces, selected = massgen_traces
    rows = read_rows(traces)
    expected, winner, current = massgen_rule(rows)
    # the run is what the test is about: a split vote, the selection MassGen returned, and
    # the current votes are exactly the ones MassGen's own tally counted
    assert winner[sc.COORDINATION_AGENT] == selected
    assert sorted(expected.values()) == [-0.5, 1.0]
    assert json.loads(winner[sc.VOTE_COUNTS]) == dict(Counter(current.values()))

    recipe = tmp_path / "votes.toml"
    recipe.write_text("[terms.votes]\ntarget = \"selected\"\ncorrect = 1.0\nwrong = -0.5\n")
    stats = convert(traces, tmp_path / "t.parquet",
                    ConvertConfig(recipe=load_recipe(recipe), missing_reward=0.0))
    assert {agent: v for (term, agent), v in stats.recipe.items()} == expected
    summary = stats.summary()
    for agent, value in expected.items():
        assert f"recipe votes: {agent} {value:+.4f} in 1 reward(s)" in summary

    # each vote's reward lands on the call that cast it (its completion ids say so)
    out = pq.read_table(tmp_path / "t.parquet").to_pylist()
    voted = {t["agent_name"]: t["reward"] for t in out if t["completion_ids"] == VOTE_IDS
             and t["reward"] != 0.0}
    assert voted == expected
    assert all(t["reward"] == 0.0 for t in out if t["completion_ids"] != VOTE_IDS)

    plain = convert(traces, tmp_path / "plain.parquet", ConvertConfig(missing_reward=0.0))
    assert not plain.recipe  # the same stored spans, no recipe: nothing derived


def test_the_massgen_run_with_a_judge_and_the_coordination_term(massgen_traces, tmp_path):
    traces, selected = massgen_traces
    rows = read_rows(traces)
    (episode,) = {r["episode_id"] for r in rows if r["episode_id"]}
    other = "agent_b" if selected == "agent_a" else "agent_a"
    # a judge, after the fact, rates the answer that was not selected higher
    judged = tmp_path / "judge"
    judged.mkdir()
    pq.write_table(rows_to_table([
        evaluation_row(evaluation_attributes(episode, score, name="judge", agent=agent,
                                             kind=sc.RewardKind.JUDGE))
        for agent, score in ((selected, 0.25), (other, 0.75))]), judged / "judge.parquet")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[evaluations]\njudge = 1.0\n'
                      '[terms.votes]\ntarget = "best_rated"\nrating = "evaluation:judge"\n'
                      '[terms.coordination]\nquality = "evaluation:judge"\nfree_rounds = 1\n')
    stats = convert([traces, judged], tmp_path / "t.parquet",
                    ConvertConfig(recipe=load_recipe(recipe)))

    _, winner, current = massgen_rule(rows)
    votes = {(term, agent): v for (term, agent), v in stats.recipe.items() if term == "votes"}
    assert votes == {("votes", v): 1.0 if t == other else -0.5 for v, t in current.items()}

    # coordination: quality = the judge's score of the selected answer; a split vote is no
    # majority; rounds = the highest coordination round + 1 (restarts count up an agent's
    # round in MassGen); tokens = the usage MassGen's server reported on every call
    restarts = [r for r in rows if r["name"] == sc.SPAN_RESTART]
    assert restarts  # a new answer restarts the other agent: recorded as spans
    rounds = max(r["coordination_round"] for r in rows
                 if r["coordination_round"] is not None) + 1
    chats = [json.loads(r["attributes"]) for r in rows if r["operation_name"] == "chat"]
    tokens = sum(a[sc.GEN_AI_USAGE_INPUT_TOKENS] + a[sc.GEN_AI_USAGE_OUTPUT_TOKENS]
                 for a in chats)
    counts = json.loads(winner[sc.VOTE_COUNTS])
    assert 2 * counts[selected] <= sum(counts.values())  # no majority
    assert stats.recipe[("coordination", None)] == pytest.approx(
        2 * 0.25 - 0.5 - 0.1 * max(0, rounds - 1) - 0.001 * tokens)
    assert rounds >= 2 and tokens > 0
    assert "recipe coordination: (episode)" in stats.summary()


# -- the Flow example ------------------------------------------------------------------------
flow_dag = load_example("flow_dag")
PLAN = {"left": (), "right": (), "total": ("left", "right")}  # flow_dag.run_workflow's


def flow_reply(fixed_total: bool):
    """The scripted model: right for 2+3 and 1+4; 5+5 wrong at first, then (``fixed_total``)
    right on the retry."""
    asked: Counter = Counter()

    def script(body):
        question = body["messages"][-1]["content"]
        asked[question] += 1
        if "5 + 5" in question:
            return ("10" if fixed_total and asked[question] > 1 else "7"), []
        return "5", []
    return script


def flow_design(summary) -> tuple[dict[str, float], float]:
    """The Flow design's task rewards per agent and the workflow reward, from the
    orchestrator's own account of the run (not from the spans)."""
    tasks = summary["tasks"]
    per_agent: Counter = Counter()
    for task, t in tasks.items():
        dependents = [d for d, deps in PLAN.items() if task in deps]
        per_agent[t["agent"]] += (1.0 if t["passed"] else -0.5) - 0.1 * t["retries"] + \
            0.5 * sum(tasks[d]["passed"] for d in dependents)
    return dict(per_agent), sum(t["passed"] for t in tasks.values()) / len(tasks)


@pytest.mark.parametrize("fixed_total", [False, True], ids=["total-fails", "total-retried"])
def test_the_flow_example_is_rewarded_again_by_the_dag_recipe(spans, instrumented, tmp_path,
                                                              fixed_total):
    with ScriptedServer(vllm=True, script=flow_reply(fixed_total)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        summary = flow_dag.run_workflow(client, "m", (2, 3, 1, 4), max_retries=1)
    assert summary["tasks"]["total"] == {"agent": "alice", "passed": fixed_total, "retries": 1}
    traces = tmp_path / "traces"
    traces.mkdir()
    pq.write_table(spans_to_table(spans.get_finished_spans()), traces / "spans.parquet")

    recipe = tmp_path / "dag.toml"
    recipe.write_text("[terms.dag]\nsuccess = 1.0\nfailure = -0.5\nretry = -0.1\n"
                      "downstream = 0.5\nworkflow = 1.0\n")
    stats = convert(traces, tmp_path / "t.parquet", ConvertConfig(recipe=load_recipe(recipe)))
    per_agent, workflow = flow_design(summary)
    assert dict(stats.recipe) == pytest.approx(
        {**{("dag", a): v for a, v in per_agent.items()}, ("dag", None): workflow})
    if fixed_total:  # left and right each gain 0.5 from total's success; total paid its retry
        assert per_agent == pytest.approx({"alice": 1.5 + 0.9, "bob": 1.5}) and workflow == 1
    else:
        assert per_agent == pytest.approx({"alice": 1.0 - 0.6, "bob": 1.0})
    summary_text = stats.summary()
    assert "recipe dag: alice" in summary_text and "recipe dag: bob" in summary_text

    # the trainer sees the recorded rewards plus the recipe's: the integration's own (success -
    # 0.2 per retry per task, completion for the team) and the dag term's, per agent and team
    plain = convert(traces, tmp_path / "plain.parquet")
    before = {(t["agent_name"], t["turn_index"], t["span_id"]): t["reward"]
              for t in pq.read_table(tmp_path / "plain.parquet").to_pylist()}
    after = {(t["agent_name"], t["turn_index"], t["span_id"]): t["reward"]
             for t in pq.read_table(tmp_path / "t.parquet").to_pylist()}
    assert before.keys() == after.keys() and plain.transitions == stats.transitions
    for (agent, turn, span), reward in after.items():
        assert reward == pytest.approx(before[(agent, turn, span)] + per_agent[agent] + workflow)


def test_the_flow_example_with_turn_scoped_task_rewards(spans, instrumented, tmp_path):
    with ScriptedServer(vllm=True, script=flow_reply(True)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        flow_dag.run_workflow(client, "m", (2, 3, 1, 4), max_retries=1)
    traces = tmp_path / "traces"
    traces.mkdir()
    pq.write_table(spans_to_table(spans.get_finished_spans()), traces / "spans.parquet")
    recipe = tmp_path / "dag.toml"
    recipe.write_text('[terms.dag]\nscope = "turn"\n')
    plain = convert(traces, tmp_path / "plain.parquet")
    stats = convert(traces, tmp_path / "t.parquet", ConvertConfig(recipe=load_recipe(recipe)))
    assert not any("recipe dag" in note for note in stats.notes)  # every attempt had its call
    gained = Counter()
    before = {t["span_id"]: t["reward"]
              for t in pq.read_table(tmp_path / "plain.parquet").to_pylist()}
    for t in pq.read_table(tmp_path / "t.parquet").to_pylist():
        gained[(t["agent_name"], t["turn_index"])] += round(t["reward"] - before[t["span_id"]] -
                                                           1.0, 9)  # less the workflow's 1.0
    # alice's turn 0 holds two calls (left, and total's first attempt): left's 1.5 on each;
    # total's 0.9 on its retry, alice's turn 1; bob's right, 1.5, on his turn 0
    assert dict(gained) == {("alice", 0): 3.0, ("alice", 1): 0.9, ("bob", 0): 1.5}
    assert plain.transitions == stats.transitions == 4
