"""The production demo end to end on vLLM with the tiny model: the team serves requests that
never repeat and carry no reward, simulated users send feedback later from their own process,
an LLM judge (the base model on the same vLLM) scores episodes that got none, the loop replays
the newest questions (recorded by the service as ``demo.question``) twice each, trains on the
live traces with the batch baseline and on the replays as groups, gates and publishes."""

import json

import pytest

from agl_bridge.trainer.loop import demo
from tests.span_files import all_rows

pytestmark = pytest.mark.e2e


def test_production_demo_learns_from_later_feedback_only(tmp_path):
    work = tmp_path / "prod"
    (work / "round00").mkdir(parents=True)
    (work / "state.json").write_text('{"left": "by an earlier run"}')  # --fresh discards it
    data = demo.main(["--workdir", str(work), "--model", "tiny", "--production", "--fresh",
                      "--rounds", "2", "--minutes", "12", "--eval-size", "8",
                      "--gate-size", "8", "--min-episodes", "12", "--concurrency", "4",
                      "--train.learning-rate", "2e-2",
                      "--train.per-device-train-batch-size", "8", "--rewards-from", "both",
                      "--judge.max-episodes", "8", "--replay-k", "2", "--replay-inputs", "3"])
    served = [json.loads(line) for line in (work / "served.jsonl").read_text().splitlines()]
    assert len({(r["a"], r["b"]) for r in served}) == len(served) > 20  # never repeated
    held = {(t["a"], t["b"]) for t in map(json.loads, (work / "eval-tasks.jsonl").open())}
    assert not held & {(r["a"], r["b"]) for r in served}  # the held-out set is never served
    # a round after a publish is held (nothing trained or published) until the watch has
    # judged the new version on its users' rewards; every other round trains
    waiting = [r for r in data["rounds"] if r.get("held")]
    rounds = [r for r in data["rounds"] if not r.get("held")]
    assert rounds and all(r["trained"] for r in rounds)
    for r in waiting:
        assert data["rounds"][r["round"] - 1].get("published") or \
            data["rounds"][r["round"] - 1].get("held")
        assert r["watch"]["verdict"] == "wait" and "episodes served by the new" in r["held"]
        assert "gate" not in r and not r.get("published")
    # the only rewards were the users' feedback, joined from their own process's files, and
    # the judge's scores (the base model on the same vLLM) for episodes without feedback
    assert all(r["evaluations_joined"] >= 12 for r in rounds)
    assert all(0 < r["judge"]["scored"] + r["judge"]["failed"] <= 8 for r in rounds)
    assert sum(r["judge"]["scored"] for r in rounds) > 0
    judged = [row for row in all_rows(work / "traces") if row["reward_kind"] == "judge"]
    assert judged and {row["evaluation_name"] for row in judged} == {"judge:right-sum"}
    feedback = {row["evaluation_target"] for row in all_rows(work / "traces")
                if row["evaluation_name"] == "thumbs"}
    assert not feedback & {row["evaluation_target"] for row in judged}  # judged: the others
    # the three newest questions, played twice each by the team: 3 groups x 2 episodes x 2
    # agents (one turn each) compared within their group; the live singles against the batch
    assert all(r["replay"]["inputs"] == 3 and r["replay"]["k"] == 2 for r in rounds)
    assert all(r["replay"]["team"]["episodes"] == 6 for r in rounds)
    assert all(r["baselines"]["group"] == 12 and r["baselines"]["batch"] > 0
               and sum(r["baselines"].values()) == r["transitions"] for r in rounds)
    assert all("publish" in r["gate"] and "rule" in r["gate"] for r in rounds)
    assert data["baseline"]["policy"] == {"solver": "base", "checker": "base"}
    assert data["final"]["after_rounds"] == len(data["rounds"])
    assert sum(v["requests"] for v in data["served"]) == len(served)
    # the service was stopped while each round trained: it answered nothing then
    pauses = data["service_paused"]
    assert len(pauses) == len(rounds) and all(b > a for a, b in pauses)
    assert not [r for r in served for a, b in pauses if a + 0.5 < r["time"] < b]
    assert (work / "report.html").exists() and "round 1" in (work / "summary.txt").read_text()
