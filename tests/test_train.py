import json
import math

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.tiny_model import build_tiny_model
from agl_bridge.trainer.train import (METADATA_FILE, GRPOConfig, base_model_fingerprint,
                                      latest_adapter, train_grpo)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def transitions(rewards, groups=None):
    rows = []
    for i, r in enumerate(rewards):
        rows.append({"episode_id": f"e{i}", "task_id": "t", "agent_name": "a",
                     "prompt_ids": [257, 40 + i, 41, 258], "completion_ids": [60 + i, 61, 62],
                     "completion_mask": [1, 1, 1], "behaviour_logprobs": None, "reward": r,
                     "group_id": (groups or ["task:t"] * len(rewards))[i],
                     "merged_calls": 1, "retokenized": False})
    return pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA)


def test_only_lora_weights_change_and_versions_accumulate(tiny, tmp_path):
    base_before = load_file(str(tiny / "model.safetensors"))
    cfg = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2, num_train_epochs=2)
    first = train_grpo(transitions([1.0, 0.0, 0.5, 0.0]), tiny, tmp_path, adapter_name="solver",
                       config=cfg, progress=False)
    assert first.adapter_dir == tmp_path / "solver" / "v0001" and first.steps == 4
    weights = load_file(str(first.adapter_dir / "adapter_model.safetensors"))
    assert weights and all("lora_" in k for k in weights)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
    base_after = load_file(str(tiny / "model.safetensors"))
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)

    meta = json.loads((first.adapter_dir / METADATA_FILE).read_text())
    assert meta["base_model_fingerprint"] == base_model_fingerprint(tiny)
    assert meta["version"] == 1 and meta["transitions"] == 4 and meta["steps"] == 4
    assert all(math.isfinite(m["loss"]) for m in first.metrics)

    second = train_grpo(transitions([0.0, 1.0]), tiny, tmp_path, adapter_name="solver",
                        config=cfg, init_adapter=first.adapter_dir, progress=False)
    assert second.adapter_dir.name == "v0002" and latest_adapter(tmp_path, "solver") == second.adapter_dir
    assert json.loads((second.adapter_dir / METADATA_FILE).read_text())["init_adapter"] == str(
        first.adapter_dir)


def test_zero_advantage_leaves_the_adapter_at_init(tiny, tmp_path):
    result = train_grpo(transitions([0.5, 0.5]), tiny, tmp_path, config=GRPOConfig(
        learning_rate=1e-1), progress=False)
    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    assert all(v.abs().sum() == 0 for k, v in weights.items() if "lora_B" in k)
    assert result.metrics[0]["loss"] == 0.0


def test_refuses_empty_and_non_finite_input(tiny, tmp_path):
    with pytest.raises(ValueError, match="no transitions"):
        train_grpo(transitions([]), tiny, tmp_path, progress=False)
    with pytest.raises(ValueError, match="transition 1: reward is nan"):
        train_grpo(transitions([0.0, math.nan]), tiny, tmp_path, progress=False)
    assert not (tmp_path / "policy").exists()
