"""The relay team (``agl-bridge demo --task relay``): each role sees what the other lacks, the
team succeeds only if both do their part, and per-role success is measured on its own."""

import re

import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.loop.demo import TEAMS, held_out, team_agents, training_tasks
from agl_bridge.trainer.loop.team import run_team
from agl_bridge.trainer.loop.teams.relay import (
    make_story,
    numbers,
    score_reader,
    score_solver,
    score_team,
)
from tests.scripted_server import ScriptedServer


def test_stories_ask_for_a_plus_b_with_distractors_and_are_fixed_by_their_seed():
    for seed in range(40):
        a, b = 7 + seed % 30, 2 + seed % 8
        story = make_story(a, b, f"t{seed}")
        assert story == make_story(a, b, f"t{seed}")
        got = numbers(story)
        assert a in got and b in got and len(got) >= 3  # at least one distracting number
        assert [x for x in got if x not in (a, b)]
    assert len({make_story(5, 6, f"s{i}") for i in range(30)}) > 5


@pytest.mark.parametrize("text, parts", [
    ("23 + 9", {"correct": 1.0, "partial": 0.0, "form": 0.2}),
    ("9 + 23", {"correct": 1.0, "partial": 0.0, "form": 0.2}),
    ("the numbers are 23 and 9.", {"correct": 1.0, "partial": 0.0, "form": 0.0}),
    ("41 + 9", {"correct": 0.0, "partial": 0.25, "form": 0.2}),
    ("no numbers", {"correct": 0.0, "partial": 0.0, "form": 0.0}),
])
def test_reader_parts(text, parts):
    assert score_reader(text, 23, 9) == pytest.approx(parts)


@pytest.mark.parametrize("text, given, parts", [
    ("41 + 9 = 50", [41, 9], {"correct": 1.0, "close": 0.0, "form": 0.2}),  # right for its input
    ("50", [41, 9], {"correct": 1.0, "close": 0.0, "form": 0.0}),
    ("41 + 9 = 48", [41, 9], {"correct": 0.0, "close": 0.3 * 0.8, "form": 0.2}),
    ("7", [41], {"correct": 0.0, "close": 0.0, "form": 0.0}),  # nothing to add was given
])
def test_solver_is_judged_on_what_it_was_given(text, given, parts):
    assert score_solver(text, given) == pytest.approx(parts)


def test_team_needs_the_true_sum():
    assert score_team("41 + 9 = 50", 23, 9)["correct"] == 0.0  # the solver right, the team not
    assert score_team("23 + 9 = 32", 23, 9) == {"correct": 1.0, "close": 0.0}


def test_demo_tasks_carry_their_story_and_the_relay_team():
    # the aliases come from the team's own program (its AGENTS), not from the demo
    assert TEAMS["relay"].endswith("teams.relay") and team_agents("relay") == ("reader", "solver")
    assert team_agents("add") == ("solver", "checker")
    ev = held_out("relay", 10, 0)
    assert all(t["kind"] == "relay" and str(t["a"]) in t["story"] for t in ev)
    train = training_tasks("relay", 8, 0, 0, ev)
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in ev}


def _script(body):
    """The reader relays the story's first two numbers after any distractor (right when the
    story mentions a distractor first); the solver adds what it got."""
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if system.startswith("You read"):
        a, b = _operands_of(user)
        return f"{a} + {b}", []
    x, y = (int(v) for v in re.findall(r"\d+", user)[:2])
    return f"{x} + {y} = {x + y}", []


STORY_OPERANDS: dict[str, tuple[int, int]] = {}


def _operands_of(story):
    return STORY_OPERANDS[story]


def test_the_team_runs_under_zero_code_capture_and_each_role_sees_its_own(tmp_path):
    tasks = held_out("relay", 6, 1)
    for t in tasks:
        STORY_OPERANDS[t["story"]] = (t["a"], t["b"]) if t["a"] != 9 else (t["a"], 99)
    with ScriptedServer(vllm=True, script=_script, completion_ids=[5, 6]) as server:
        run = run_team(f"python -m {TEAMS['relay']}", tasks, tmp_path / "run",
                       base_url=server.base_url, aliases=None, timeout_s=300)
    assert len(run.results) == 6
    for r in run.results:
        wrong_relay = r["a"] == 9
        assert r["agent_correct"] == {"reader": not wrong_relay, "solver": True}
        assert r["success"] is (not wrong_relay)
    solver_bodies = [b for b in server.requests if b["messages"][0]["content"].startswith("Comp")]
    assert len(solver_bodies) == 6
    for body in solver_bodies:  # the solver never sees the story: only the reader's line
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        assert re.fullmatch(r"\d+ \+ \d+", body["messages"][1]["content"])
    spans = list((tmp_path / "run" / "spans").rglob("*.parquet"))
    out = tmp_path / "t.parquet"
    stats = convert(spans, out, ConvertConfig(algorithm="at_grpo"))
    t = pq.read_table(out).to_pylist()
    assert stats.transitions == 12 and {r["agent_name"] for r in t} == {"reader", "solver"}
    summary = run.summary
    assert summary["per_role"]["solver"] == 1.0 and summary["episodes"] == 6


def test_branch_samples_the_readers_turn_k_ways_and_evaluation_never_branches(tmp_path):
    from agl_bridge.cli import build_parser
    from agl_bridge.trainer.loop.demo import team_commands

    tasks = held_out("relay", 3, 2)
    for t in tasks:
        STORY_OPERANDS[t["story"]] = (t["a"], t["b"])
    with ScriptedServer(vllm=True, script=_script, completion_ids=[5, 6]) as server:
        run = run_team(f"python -m {TEAMS['relay']} --branch 3", tasks, tmp_path / "run",
                       base_url=server.base_url, aliases=None, timeout_s=300)
    assert len(run.results) == 3 and all(r["success"] for r in run.results)
    reader = [b for b in server.requests if b["messages"][0]["content"].startswith("You read")]
    solver = [b for b in server.requests if b["messages"][0]["content"].startswith("Comp")]
    assert [b.get("n") for b in reader] == [3] * 3 and [b.get("n") for b in solver] == [None] * 3
    out = tmp_path / "t.parquet"
    convert(list((tmp_path / "run" / "spans").rglob("*.parquet")), out,
            ConvertConfig(algorithm="at_grpo"))
    t = pq.read_table(out).to_pylist()
    by_agent = {a: [r for r in t if r["agent_name"] == a] for a in ("reader", "solver")}
    assert len(by_agent["reader"]) == 9 and len(by_agent["solver"]) == 3
    assert sorted(r["candidate_index"] for r in by_agent["reader"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(r["candidate_index"] is None for r in by_agent["solver"])
    # the demo passes --branch to training rollouts only, and only for the relay team
    assert build_parser().parse_args(["demo", "--task", "relay", "--branch", "4"]).branch == 4
    team, evaluation = team_commands("relay", 4)
    assert team.endswith("--reward relay --branch 4") and "--branch" not in evaluation
    with pytest.raises(SystemExit, match="--branch is for --task relay"):
        team_commands("add", 2)
