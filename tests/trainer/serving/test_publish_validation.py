"""Bad adapters are refused before any server or agent sees them, with the reason."""

import json
import shutil

import pyarrow as pa
import pytest

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.models.tiny import build_tiny_model
from agl_bridge.trainer.serving.publisher import PublishError, validate_adapter
from agl_bridge.trainer.training import GRPOConfig, train_policy


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "base"), build_tiny_model(root / "other", hidden_size=96)


@pytest.fixture(scope="module")
def adapter(models, tmp_path_factory):
    rows = [{"episode_id": f"e{i}", "prompt_ids": [257, 40 + i], "completion_ids": [60, 61],
             "completion_mask": [1, 1], "behaviour_logprobs": None, "reward": float(i),
             "group_id": "g", "merged_calls": 1, "retokenized": False} for i in range(2)]
    result = train_policy(pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA), models[0],
                          tmp_path_factory.mktemp("adapters"), adapter_name="team",
                          config=GRPOConfig(lora_r=8), progress=False)
    return result.adapter_dir


def copy(adapter, tmp_path, name="v0001"):
    target = tmp_path / "team" / name
    shutil.copytree(adapter, target)
    return target


def test_a_good_adapter_passes(models, adapter):
    assert validate_adapter(adapter, base_model=models[0], max_lora_rank=16)["r"] == 8


def test_rank_above_the_server_limit(models, adapter):
    with pytest.raises(PublishError, match="LoRA rank 8 is above the servers' --max-lora-rank 4"):
        validate_adapter(adapter, base_model=models[0], max_lora_rank=4)


def test_another_base_model_is_refused_by_fingerprint_and_by_shapes(models, adapter, tmp_path):
    with pytest.raises(PublishError, match="trained on another base model"):
        validate_adapter(adapter, base_model=models[1])
    no_meta = copy(adapter, tmp_path)
    (no_meta / "agl_bridge_adapter.json").unlink()  # a PEFT adapter from elsewhere
    with pytest.raises(PublishError, match=r"does not fit .* of the base model"):
        validate_adapter(no_meta, base_model=models[1])


def test_corrupt_missing_and_pickled_weights(models, adapter, tmp_path):
    cut = copy(adapter, tmp_path, "v0002")
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(PublishError, match=r"corrupt safetensors file .*truncated"):
        validate_adapter(cut)
    pickled = copy(adapter, tmp_path, "v0003")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    with pytest.raises(PublishError, match="weights are not safetensors"):
        validate_adapter(pickled)
    broken = copy(adapter, tmp_path, "v0004")
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(PublishError, match=r"adapter_config\.json: not valid JSON"):
        validate_adapter(broken)
    with pytest.raises(PublishError, match="no such adapter directory"):
        validate_adapter(tmp_path / "nope")
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
