import json
import math

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from agl_bridge.trainer.adapters import METADATA_FILE, base_model_fingerprint, latest_adapter
from agl_bridge.trainer.training import GRPOConfig, train_policy
from tests.factories import transitions
from tests.paths import TESTS


def test_only_lora_weights_change_and_versions_accumulate(tiny, tmp_path):
    base_before = load_file(str(tiny / "model.safetensors"))
    cfg = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2, num_train_epochs=2)
    first = train_policy(transitions([1.0, 0.0, 0.5, 0.0]), tiny, tmp_path, adapter_name="solver",
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

    second = train_policy(transitions([0.0, 1.0]), tiny, tmp_path, adapter_name="solver",
                          config=cfg, init_adapters={"solver": first.adapter_dir}, progress=False)
    assert second.adapter_dir.name == "v0002"
    assert latest_adapter(tmp_path, "solver") == second.adapter_dir
    assert json.loads((second.adapter_dir / METADATA_FILE).read_text())["init_adapter"] == str(
        first.adapter_dir)


def test_zero_variance_groups_are_filtered_and_leave_the_adapter_at_init(tiny, tmp_path):
    result = train_policy(transitions([0.5, 0.5]), tiny, tmp_path, config=GRPOConfig(
        learning_rate=1e-1), progress=False)
    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    assert all(v.abs().sum() == 0 for k, v in weights.items() if "lora_B" in k)
    assert result.steps == 0 and result.metrics == []
    kept = train_policy(transitions([0.5, 0.5]), tiny, tmp_path, progress=False, config=GRPOConfig(
        learning_rate=1e-1, filter_zero_variance_groups=False))
    assert kept.metrics[0]["loss"] == 0.0 and kept.metrics[0]["skipped_zero_variance"] == 0


def test_per_agent_lora_adapters_learn_only_from_their_own_agent(tiny, tmp_path):

    # agent a's transitions carry signal; agent b's group has equal rewards (no signal)
    data = transitions([1.0, 0.0, 0.3, 0.3], groups=["g_a", "g_a", "g_b", "g_b"],
                       agents=["a", "a", "b", "b"])
    cfg = GRPOConfig(learning_rate=5e-2, per_device_train_batch_size=2,
                     filter_zero_variance_groups=False)
    result = train_policy(data, tiny, tmp_path, policy="per_agent_lora", config=cfg,
                          metrics_path=tmp_path / "metrics.jsonl", progress=False)
    assert set(result.adapters) == {"a", "b"}
    assert result.adapters["a"] == tmp_path / "a" / "v0001"
    lora_b = {name: [v for k, v in load_file(str(d / "adapter_model.safetensors")).items()
                     if "lora_B" in k] for name, d in result.adapters.items()}
    assert any(v.abs().sum() > 0 for v in lora_b["a"])
    assert all(v.abs().sum() == 0 for v in lora_b["b"])  # its batches had zero advantage
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert {json.loads(line)["adapter"] for line in lines} == {"a", "b"}
    per_model = train_policy(data, tiny, tmp_path / "pm", policy="per_agent_model", config=cfg,
                             progress=False)
    assert set(per_model.adapters) == {"a", "b"}
    # single-role training: only a's transitions, only a's adapter gets a version
    only_a = train_policy(data, tiny, tmp_path / "one", policy="per_agent_lora",
                          config=GRPOConfig(**{**cfg.__dict__, "train_agents": ["a"]}),
                          progress=False)
    assert set(only_a.adapters) == {"a"} and not (tmp_path / "one" / "b").exists()
    with pytest.raises(ValueError, match=r"no transitions of train_agents \['c'\]"):
        train_policy(data, tiny, tmp_path / "none", policy="per_agent_lora",
                     config=GRPOConfig(train_agents=["c"]), progress=False)


def test_kl_is_zero_before_the_first_update_and_importance_weights_apply(tiny, tmp_path):
    data = transitions([1.0, 0.0])
    table = data.set_column(data.schema.get_field_index("behaviour_logprobs"),
                            "behaviour_logprobs", pa.array([[-9.0, -9.0, -9.0]] * 2,
                                                           pa.list_(pa.float32())))
    result = train_policy(table, tiny, tmp_path, progress=False, config=GRPOConfig(
        learning_rate=1e-1, beta=0.5, per_device_train_batch_size=1, num_train_epochs=2))
    first = result.metrics[0]
    assert first["kl"] == 0.0  # the adapter starts as the identity: policy == reference
    assert any(m["kl"] > 0 for m in result.metrics[1:])
    # the random model gives ~log(1/320) = -5.8; the sampler said -9: ratios e^3 capped at 2
    assert first["importance_weight_mean"] == pytest.approx(2.0)
    assert first["behaviour_logprob_abs_diff"] > 0


def test_refuses_empty_and_non_finite_input(tiny, tmp_path):
    with pytest.raises(ValueError, match="no transitions"):
        train_policy(transitions([]), tiny, tmp_path, progress=False)
    with pytest.raises(ValueError, match="transition 1: reward is nan"):
        train_policy(transitions([0.0, math.nan]), tiny, tmp_path, progress=False)
    assert not (tmp_path / "policy").exists()


def test_two_process_data_parallel_with_gloo(tiny, tmp_path):
    """torchrun, 2 CPU processes: each trains half the batches, gradients are averaged, and
    every rank ends with the same weights, which changed; rank 0 alone saves."""
    import subprocess
    import sys

    script = TESTS / "distributed_train.py"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(script), str(tiny), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r0, r1 = ({**json.loads((tmp_path / f"rank{i}.json").read_text()),
               "lora": load_file(str(tmp_path / f"rank{i}.safetensors"))} for i in (0, 1))
    assert r0["micro_batches"] == r1["micro_batches"] == 4  # 8 transitions, batch 1, 2 ranks
    assert r0["steps"] == r1["steps"] == 4
    assert r0["adapters"] == ["a", "b"] and r1["adapters"] == []
    assert r0["lora"].keys() == r1["lora"].keys()
    assert all(torch.equal(r0["lora"][k], r1["lora"][k]) for k in r0["lora"])
    assert any(v.abs().sum() > 0 for k, v in r0["lora"].items() if "lora_B" in k)
    assert (tmp_path / "adapters" / "a" / "v0001" / "adapter_model.safetensors").exists()


def test_resume_reproduces_the_loss_trajectory_and_metadata_has_the_data_range(tiny, tmp_path):
    from agl_bridge.trainer.training.checkpoints import latest_checkpoint

    data = transitions([1.0, 0.0, 0.7, 0.1, 0.4, 0.9])
    cfg = dict(learning_rate=5e-2, per_device_train_batch_size=2, num_train_epochs=2)
    whole = train_policy(data, tiny, tmp_path / "a", config=GRPOConfig(**cfg), progress=False)
    stopped = train_policy(data, tiny, tmp_path / "b", checkpoint_dir=tmp_path / "ckpt",
                           config=GRPOConfig(**cfg, save_steps=1, max_steps=3), progress=False)
    assert stopped.steps == 3 and latest_checkpoint(tmp_path / "ckpt").name == "checkpoint-3"
    resumed = train_policy(data, tiny, tmp_path / "c", checkpoint_dir=tmp_path / "ckpt",
                           resume_from_checkpoint=True, config=GRPOConfig(**cfg), progress=False)
    assert len(whole.metrics) == len(resumed.metrics) == 6
    assert [m["loss"] for m in resumed.metrics] == pytest.approx(
        [m["loss"] for m in whole.metrics], abs=1e-6)
    a = load_file(str(whole.adapter_dir / "adapter_model.safetensors"))
    c = load_file(str(resumed.adapter_dir / "adapter_model.safetensors"))
    assert all(torch.allclose(a[k], c[k], atol=1e-6) for k in a)
    meta = json.loads((whole.adapter_dir / METADATA_FILE).read_text())
    assert meta["data"] == {"transitions_file": None, "rows": 6, "episodes": 6}
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        train_policy(data, tiny, tmp_path / "d", checkpoint_dir=tmp_path / "none",
                     resume_from_checkpoint=True, progress=False)
