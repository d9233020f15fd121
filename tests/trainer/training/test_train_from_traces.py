"""train_from_traces and `agl-bridge train`: spans in, versioned adapters and metrics out."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import agl_bridge
from tests.factories import llm, reward, table


@pytest.fixture
def spans_dir(tmp_path):
    rows = []
    for e, r in enumerate([1.0, 0.0, 1.0, 0.0]):
        for agent in ("solver", "checker"):
            rows.append(llm(f"e{e}", e * 10, agent=agent, prompt=[257, 40 + e, 258],
                            completion=[60 + e, 61, 258]))
        rows.append(reward(f"e{e}", e * 10 + 5, r))
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows), tmp_path / "spans" / "part.parquet")
    return tmp_path / "spans"


def test_per_agent_lora_from_spans(tiny, spans_dir, tmp_path):
    run = agl_bridge.train_from_traces(
        spans_dir, tiny, algorithm="at_grpo", policy="per_agent_lora",
        output_dir=tmp_path / "run", learning_rate=1e-2, alpha=1.0, progress=False)
    assert set(run.adapters) == {"solver", "checker"}
    assert all((p / "adapter_model.safetensors").exists() for p in run.adapters.values())
    assert run.conversion.transitions == 8 and run.steps > 0
    assert len(run.metrics_path.read_text().splitlines()) >= 2
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["settings"]["train"]["policy"] == "per_agent_lora"
    assert saved["settings"]["convert"]["alpha"] == 1.0
    assert saved["settings"]["train"]["lora_r"] == 8  # every setting recorded, defaults too


def test_unknown_options_and_bad_choices_are_clear(tiny, spans_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown setting\\(s\\) \\['learning_rat'\\]"):
        agl_bridge.train_from_traces(spans_dir, tiny, output_dir=tmp_path, learning_rat=1.0)
    with pytest.raises(ValueError, match="policy = 'solo': expected one of 'shared'"):
        agl_bridge.train_from_traces(spans_dir, tiny, output_dir=tmp_path, policy="solo")


def test_cli_with_a_toml_config_and_flags(tiny, spans_dir, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('algorithm = "lightning_rl"\nlearning_rate = 0.05\nloss_type = "dr_grpo"\n'
                      'num_train_epochs = 2\n')
    exe = Path(sys.executable).with_name("agl-bridge")
    out = subprocess.run([str(exe), "train", str(spans_dir), "--base-model", str(tiny),
                          "--config", str(config), "--learning-rate", "0.01",
                          "--output-dir", str(tmp_path / "cli-run")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "adapter policy:" in out.stdout and "8 transitions" in out.stdout
    saved = json.loads((tmp_path / "cli-run" / "run.json").read_text())
    assert saved["settings"]["convert"]["algorithm"] == "lightning_rl"
    assert saved["settings"]["train"]["learning_rate"] == 0.01  # the flag wins over the file
    assert saved["settings"]["train"]["loss_type"] == "dr_grpo"
    bad = subprocess.run([str(exe), "train", str(spans_dir), "--base-model", str(tiny),
                          "--config", str(config) + ".missing"], capture_output=True, text=True)
    assert bad.returncode == 2 and "agl-bridge train: error:" in bad.stderr


def test_cli_continues_every_agents_adapter_and_flags_win(tiny, spans_dir, tmp_path):
    from agl_bridge.cli import main

    config = tmp_path / "train.toml"
    config.write_text('algorithm = "lightning_rl"\npolicy = "shared"\n')
    adapters = tmp_path / "adapters"
    common = ["train", str(spans_dir), "--base-model", str(tiny), "--config", str(config),
              "--policy", "per_agent_lora", "--algorithm", "at_grpo",
              "--adapters-dir", str(adapters)]
    assert main([*common, "--output-dir", str(tmp_path / "r1")]) == 0
    assert main([*common, "--output-dir", str(tmp_path / "r2"), "--continue"]) == 0
    saved = json.loads((tmp_path / "r2" / "run.json").read_text())
    assert saved["settings"]["convert"]["algorithm"] == "at_grpo"
    assert saved["settings"]["train"]["policy"] == "per_agent_lora"
    for agent in ("solver", "checker"):
        meta = json.loads((adapters / agent / "v0002" / "agl_bridge_adapter.json").read_text())
        assert meta["init_adapter"] == str(adapters / agent / "v0001")


def test_cli_under_torchrun_with_fsdp_converts_once_and_trains_sharded(tiny, spans_dir,
                                                                      tmp_path):
    """`torchrun -m agl_bridge.cli train --parallelism fsdp`: rank 0 converts while rank 1
    waits for its file, both train (the blocks sharded), rank 0 alone prints and saves."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", "-m", "agl_bridge.cli", "train", str(spans_dir),
                          "--base-model", str(tiny), "--policy", "per_agent_lora",
                          "--parallelism", "fsdp", "--per-device-train-batch-size", "1",
                          "--learning-rate", "0.05", "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.count("8 transitions") == 1  # one conversion, printed once
    assert out.stdout.count("adapter solver:") == out.stdout.count("adapter checker:") == 1
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["settings"]["train"]["parallelism"] == "fsdp"
    assert sorted(saved["adapters"]) == ["checker", "solver"]
    # 8 transitions, batch 1, 2 ranks: 2 steps of each adapter on every rank
    assert saved["steps"] == 4
