"""The multi-turn team (``agl-bridge demo --task retry``): one solver over several turns of one
conversation, told too high or too low until right, rewarded once at the end, at team scope
only (the team is the solver: an own reward of the same parts would count them twice under
``r = alpha * team + own``); under zero-code capture each reply becomes a transition of its own,
and PPO's conversion puts the episode's reward, once, on the last turn only."""

import re

import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.loop.demo import TEAMS, held_out, team_agents, team_commands
from agl_bridge.trainer.loop.team import run_team
from agl_bridge.trainer.loop.teams.retry import end_reward, hint, measures
from tests.scripted_server import ScriptedServer


@pytest.mark.parametrize("reply, told", [
    ("23 + 9 = 32", None),
    ("23 + 9 = 35", "No: 23 + 9 is less than 35. Try again. Reply with one line: 23 + 9 = "
                    "<result>"),
    ("30", "No: 23 + 9 is more than 30. Try again. Reply with one line: 23 + 9 = <result>"),
    ("I do not know", "No number there. Reply with one line: 23 + 9 = <result>"),
    ("", "No number there. Reply with one line: 23 + 9 = <result>"),
])
def test_hints_say_which_side_and_nothing_once_right(reply, told):
    assert hint(23, 9, reply) == told


@pytest.mark.parametrize("last, replies, parts", [
    ("23 + 9 = 32", 1, {"correct": 1.0, "close": 0.0, "turns": 0.0}),
    ("23 + 9 = 32", 3, {"correct": 1.0, "close": 0.0, "turns": -0.2}),
    ("23 + 9 = 37", 3, {"correct": 0.0, "close": 0.3 * 0.5, "turns": -0.2}),
    ("nothing", 2, {"correct": 0.0, "close": 0.0, "turns": -0.1}),
])
def test_the_end_reward_pays_right_most_and_right_at_once_best(last, replies, parts):
    assert end_reward(last, 23, 9, replies) == pytest.approx(parts)


def _script(body):
    """Wrong by one at the first reply, right after a hint; never right for 9 + b."""
    first = body["messages"][0]["content"]
    a, b = (int(x) for x in re.findall(r"\d+", first)[:2])
    if a == 9:
        return f"{a} + {b} = {a + b + 5}", []
    return f"{a} + {b} = {a + b + (1 if len(body['messages']) == 1 else 0)}", []


def test_each_reply_is_a_turn_and_ppo_puts_the_end_reward_on_the_last(tmp_path):
    assert TEAMS["retry"].endswith("teams.retry") and team_agents("retry") == ("solver",)
    assert team_commands("retry")[0].endswith("--reward retry")
    tasks = held_out("retry", 5, 3)
    tasks[0] = {**tasks[0], "a": 9, "b": 4, "task_id": "eval-9+4"}  # never right: all 3 turns
    with ScriptedServer(vllm=True, script=_script, completion_ids=[5, 6]) as server:
        run = run_team(f"python -m {TEAMS['retry']}", tasks, tmp_path / "run",
                       base_url=server.base_url, aliases=None, timeout_s=300)
    by_task = {r["task_id"]: r for r in run.results}
    assert by_task["eval-9+4"]["turns"] == 3 and not by_task["eval-9+4"]["success"]
    right = [r for r in run.results if r["task_id"] != "eval-9+4"]
    assert all(r["turns"] == 2 and r["success"] and not r["first_try"] for r in right)
    assert all(r["team_reward"] == pytest.approx(0.9) for r in right)  # 1 - 0.1 for one retry
    # the conversation grows: question, reply, hint, reply, hint
    longest = max(server.requests, key=lambda b: len(b["messages"]))
    assert [m["role"] for m in longest["messages"]] == ["user", "assistant", "user",
                                                        "assistant", "user"]
    assert "is less than" in longest["messages"][2]["content"]
    assert measures(run.results)["replies per task"]["mean"] == pytest.approx(11 / 5)
    spans = list((tmp_path / "run" / "spans").rglob("*.parquet"))
    out = tmp_path / "t.parquet"
    convert(spans, out, ConvertConfig(algorithm="ppo"))
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 11 and {r["agent_name"] for r in rows} == {"solver"}
    team_reward = {r["episode_id"]: r["team_reward"] for r in run.results}
    assert sorted(team_reward.values()) == pytest.approx([-0.2 + 0.3 * 0.5] + [0.9] * 4)
    for episode in {r["episode_id"] for r in rows}:
        turns = sorted((r["turn_index"], r["reward"]) for r in rows if r["episode_id"] == episode)
        assert [t for t, _ in turns] == list(range(len(turns)))
        assert all(reward == 0.0 for _, reward in turns[:-1])  # observations carry nothing:
        # the episode's reward lands at the end of the last turn, counted once (alpha 1)
        assert turns[-1][1] == pytest.approx(team_reward[episode])
