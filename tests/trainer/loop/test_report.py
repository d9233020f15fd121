"""The loop's report (``trainer/loop/report.py``) and summary: how the episodes each prompt
version served did, from a hand-made state (the watch's ``prompt_rewards`` and the loop's
events)."""

import pytest

from agl_bridge.trainer.loop.report import prompt_versions, write_report
from agl_bridge.trainer.loop.summary import summary_text

P0 = {"checker": "checker@p0", "solver": "solver@p0"}
EVENTS = [
    {"round": 0, "event": "prompt published", "versions": {"solver": "solver@p1"},
     "previous": P0, "reason": "not worse"},
    {"round": 1, "event": "prompt rolled back", "from": {"solver": "solver@p1"}, "to": P0,
     "reason": "worse beyond noise"},
    {"round": 2, "event": "published", "versions": {"solver": "solver@v1"},  # an adapter's
     "previous": {"solver": "base"}},
    {"round": 3, "event": "prompt published", "versions": {"solver": "solver@p2"},
     "previous": P0, "reason": "not worse"},
]
REWARDS = {
    "checker@p0,solver@p0": [0.0, 1.0, 0.0, 0.0],
    "checker@p0,solver@p1": [1.0, 1.0, 0.0],
    "checker@p0,solver@p0,solver@p1": [1.0],  # one episode across the publish
    "checker@p0,solver@p2": [0.5, 0.7, 0.9],
}


def state(**more):
    return {"prompt_rewards": REWARDS, "events": EVENTS, "rounds": [], "seconds": {"apo": 60.0},
            **more}


def test_each_prompt_state_has_its_episodes_mean_reward_interval_and_standing():
    rows = {r["versions"]: r for r in prompt_versions(state())}
    assert list(rows) == list(REWARDS)  # in the order first served
    assert {k: r["status"] for k, r in rows.items()} == {
        "checker@p0,solver@p0": "replaced", "checker@p0,solver@p1": "rolled back (round 1)",
        "checker@p0,solver@p0,solver@p1": "mixed", "checker@p0,solver@p2": "live"}
    assert [r["episodes"] for r in rows.values()] == [4, 3, 1, 3]
    # 0/1 rewards: Wilson's interval for 1 of 4, by hand (z = 1.96)
    assert rows["checker@p0,solver@p0"]["reward"] == pytest.approx(
        {"mean": 0.25, "low": 0.0456, "high": 0.6994, "n": 4}, abs=1e-3)
    # other rewards: the normal interval of the mean, 0.7 +- 1.96 * 0.2 / sqrt(3)
    assert rows["checker@p0,solver@p2"]["reward"] == pytest.approx(
        {"mean": 0.7, "low": 0.4737, "high": 0.9263, "n": 3}, abs=1e-3)


def test_with_no_prompt_change_the_states_served_are_live():
    rows = prompt_versions(state(events=[], prompt_rewards={"solver@p0": [1.0, 0.0]}))
    assert [(r["versions"], r["status"]) for r in rows] == [("solver@p0", "live")]
    assert prompt_versions(state(prompt_rewards={})) == []


def test_the_summary_and_the_page_show_them(tmp_path):
    text = summary_text(state())
    assert "episodes by the prompt versions that served them" in text
    assert ("  checker@p0,solver@p1: 3 episodes, 0.667 [0.208, 0.939]; rolled back (round 1)"
            in text.splitlines())
    assert "checker@p0,solver@p2: 3 episodes, 0.700 [0.474, 0.926]; live" in text
    assert "prompt versions" not in summary_text(state(prompt_rewards={}))

    settings = {"model": "m", "task": "sum", "tasks_per_round": 8, "rollouts": 2,
                "temperature": 1.0, "eval_size": 8, "convert": {"algorithm": "grpo", "alpha": 0},
                "train": {"policy": "per_agent", "learning_rate": 1e-4}}
    page = write_report(tmp_path, state(settings=settings, rounds=[{
        "round": 0, "lever": "apo", "apo": {}, "published": {}, "seconds": 60.0}])).read_text()
    assert "Prompt versions: how their episodes did" in page
    assert "<td>checker@p0,solver@p2</td><td>3</td><td>0.700 [0.474, 0.926]</td><td>live</td>" \
        in page.replace("\n", "")


def test_a_ppo_round_shows_no_zero_variance_groups(tmp_path):
    """Issue 34 review: a ppo round's record holds no GRPO group statistics (its critic's
    advantages train); the per-round table shows a dash there, a GRPO round its count."""
    settings = {"model": "m", "task": "retry", "tasks_per_round": 4, "rollouts": 2,
                "temperature": 1.0, "eval_size": 4, "convert": {"algorithm": "ppo", "alpha": 1},
                "train": {"policy": "per_agent_lora", "learning_rate": 1e-4}}
    base = {"transitions": 8, "steps": 1, "published": {"solver": "solver@v1"},
            "seconds": 30.0}
    page = write_report(tmp_path, state(settings=settings, rounds=[
        {"round": 0, **base}, {"round": 1, **base, "zero_variance_groups": 3}])).read_text()
    cells = page.replace("\n", "")
    assert "<td>0</td><td>–</td><td>–</td><td>–</td><td>8</td><td>1</td><td>–</td>" in cells
    assert "<td>1</td><td>–</td><td>–</td><td>–</td><td>8</td><td>1</td><td>3</td>" in cells
