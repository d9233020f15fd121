"""One round of the production demo's loop on the GPU: the tiny model served by CUDA vLLM
(0.35 of the GPU's memory, engine.py) while the round trains beside it on the same GPU, the
service kept running through training (``--keep-serving-while-training``: what the CPU demo
pauses, because there they share two cores), simulated users' feedback and the judge as
rewards, replayed questions as groups, the gate, a publish. And the README's demo settings
(SmolLM2, the arithmetic team) for one round: it trains, publishes and reports."""

from __future__ import annotations

import json

import pytest

from agl_bridge.trainer.loop import demo

pytestmark = pytest.mark.gpu


def test_one_production_round_on_the_gpu(cuda, tmp_path):
    work = tmp_path / "prod"
    data = demo.main(["--workdir", str(work), "--model", "tiny", "--production", "--fresh",
                      "--rounds", "1", "--minutes", "10", "--eval-size", "8",
                      "--gate-size", "8", "--min-episodes", "12", "--concurrency", "4",
                      "--keep-serving-while-training",
                      "--train.learning-rate", "2e-2",
                      "--train.per-device-train-batch-size", "8", "--rewards-from", "both",
                      "--judge.max-episodes", "8", "--replay-k", "2", "--replay-inputs", "3"])
    rounds = data["rounds"]
    assert len(rounds) == 1 and rounds[0]["trained"]
    assert rounds[0]["evaluations_joined"] >= 12
    assert rounds[0]["replay"]["inputs"] == 3 and rounds[0]["replay"]["k"] == 2
    assert "publish" in rounds[0]["gate"] and "rule" in rounds[0]["gate"]
    assert data["final"]["after_rounds"] == 1
    served = [json.loads(line) for line in (work / "served.jsonl").read_text().splitlines()]
    assert len(served) > 20
    # served while the round trained: the service was never paused
    assert not data.get("service_paused")
    log = (work / "vllm.log").read_text(errors="replace").lower()
    assert "cuda" in log and "bfloat16" in log, log[-2000:]
    assert (work / "report.html").exists() and "round 1" in (work / "summary.txt").read_text()


def test_one_round_of_the_readme_demo_on_smollm2(cuda, tmp_path):
    work = tmp_path / "demo"
    data = demo.main(["--workdir", str(work), "--model", "smollm2", "--rounds", "1",
                      "--tasks-per-round", "16", "--rollouts", "4", "--eval-size", "32",
                      "--gate.rule", "off"])
    (r0,) = data["rounds"]
    assert r0["transitions"] == 16 * 4 * 2  # 16 tasks x 4 rollouts x solver and checker
    assert r0["published"] == {"solver": "solver@v1", "checker": "checker@v1"}
    assert data["final"]["after_rounds"] == 1 and data["final"]["policy"] == r0["published"]
    assert sum(data["seconds"].values()) > 0
