"""SFT from traces: which transitions are imitated (a table), the loss (by hand), and training
(the selected completions become likelier; the others are never trained on)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import agl_bridge
from agl_bridge.trainer.adapters import METADATA_FILE
from agl_bridge.trainer.training import GRPOConfig
from agl_bridge.trainer.training.data import collate
from agl_bridge.trainer.training.loop import train_policy
from agl_bridge.trainer.training.model import completion_logprobs
from agl_bridge.trainer.training.sft import select_for_sft, sft_loss
from tests.factories import transitions

G = np.array(["a", "a", "a", "b", "b", "c", "d", "d"])
R = np.array([1.0, 0.0, 1.0, 0.2, 0.2, 0.9, -1.0, -2.0])


@pytest.mark.parametrize("how, min_reward, expected", [
    # best: the group's top (ties: all of them) where it beats another member
    ("best", None, [1, 0, 1, 0, 0, 0, 1, 0]),
    # with a floor: groups whose best reaches it, lone rollouts and all-equal groups included
    ("best", 0.5, [1, 0, 1, 0, 0, 1, 0, 0]),
    ("best", 0.1, [1, 0, 1, 1, 1, 1, 0, 0]),
    # threshold: every transition at or above the floor, groups ignored
    ("threshold", 0.2, [1, 0, 1, 1, 1, 1, 0, 0]),
    ("threshold", -1.5, [1, 1, 1, 1, 1, 1, 1, 0]),
])
def test_selection_table(how, min_reward, expected):
    assert select_for_sft(R, G, how, min_reward).astype(int).tolist() == expected


def test_selection_errors_and_empty_input():
    with pytest.raises(ValueError, match="needs sft_min_reward"):
        select_for_sft(R, G, "threshold")
    with pytest.raises(ValueError, match="sft_select must be best or threshold"):
        select_for_sft(R, G, "top")  # type: ignore[arg-type]
    assert select_for_sft(np.array([]), np.array([]), "best").shape == (0,)


def test_sft_loss_is_the_mean_negative_log_likelihood_of_the_masked_tokens():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert float(sft_loss(logp, mask, "bnpo")) == pytest.approx((1 + 2 + 1.5) / 5)
    assert float(sft_loss(logp, mask, "grpo")) == pytest.approx((1.5 + 0.5) / 2)


def _table(rewards, groups):
    return transitions(rewards, groups=groups)


def _nll(model, rows, device):
    with torch.no_grad():
        batch = collate(rows, 0, device)
        logp = completion_logprobs(model, batch)
        return float(-(logp * batch["loss_mask"]).sum() / batch["loss_mask"].sum())


def test_sft_raises_the_likelihood_of_the_selected_completions_only(tiny, tmp_path, monkeypatch):
    from agl_bridge.trainer.training import loop

    table = _table([1.0, 0.0, 0.0, 0.3, 0.1], ["g1", "g1", "g1", "g2", "g2"])
    rows = table.to_pylist()
    seen: list[list[int]] = []

    def spy(part, pad_id, device, packing=None, mask_dtype=torch.float32):
        seen.extend(r["completion_ids"] for r in part)
        return collate(part, pad_id, device, packing, mask_dtype)

    monkeypatch.setattr(loop, "collate", spy)
    cfg = GRPOConfig(learning_rate=5e-2, per_device_train_batch_size=2, num_train_epochs=4,
                     lora_r=4)
    result = train_policy(table, tiny, tmp_path / "adapters", config=cfg, progress=False,
                          keep_model=True, objective="sft")
    chosen = [rows[0], rows[3]]  # the best of g1 and of g2
    assert sorted(map(tuple, seen)) == sorted([tuple(r["completion_ids"]) for r in chosen] * 4)
    assert all(m["objective"] == "sft" for m in result.metrics)
    model = result.model
    device = next(model.parameters()).device
    after = _nll(model, chosen, device)
    with model.disable_adapter():
        before = _nll(model, chosen, device)
    assert after < before - 0.5, (before, after)  # learned what it was shown
    meta = json.loads((result.adapter_dir / METADATA_FILE).read_text())
    assert meta["objective"] == "sft" and meta["transitions"] == 2


def test_sft_that_selects_nothing_says_why(tiny, tmp_path):
    table = _table([0.5, 0.5], ["g", "g"])
    with pytest.raises(ValueError, match=r"selected none of 2 transitions.*give sft_min_reward"):
        train_policy(table, tiny, tmp_path, progress=False, objective="sft")
    with pytest.raises(ValueError, match="no reward reaches sft_min_reward"):
        train_policy(table, tiny, tmp_path, progress=False, objective="sft",
                     config=GRPOConfig(sft_select="threshold", sft_min_reward=0.9))
    with pytest.raises(ValueError, match="objective must be grpo or sft"):
        train_policy(table, tiny, tmp_path, progress=False, objective="ppo")  # type: ignore


def test_train_from_traces_and_the_cli_take_objective_sft(tiny, tmp_path):
    table = _table([1.0, 0.0, 1.0, 0.0], None)
    path = tmp_path / "transitions.parquet"
    import pyarrow.parquet as pq

    from agl_bridge.schema import TRANSITION_SCHEMA

    pq.write_table(table.cast(TRANSITION_SCHEMA), path)
    run = agl_bridge.train_from_traces(path, tiny, objective="sft", output_dir=tmp_path / "run",
                                       progress=False, sft_select="threshold",
                                       sft_min_reward=0.5)
    assert run.steps > 0
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["settings"]["train"]["objective"] == "sft"
    exe = Path(sys.executable).with_name("agl-bridge")
    out = subprocess.run([str(exe), "train", str(path), "--base-model", str(tiny),
                          "--objective", "sft", "--sft-select", "threshold",
                          "--sft-min-reward", "0.5", "--output-dir", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    meta = next((tmp_path / "cli" / "adapters" / "policy").glob(f"v*/{METADATA_FILE}"))
    saved = json.loads(meta.read_text())
    assert saved["objective"] == "sft" and saved["transitions"] == 2
    assert saved["config"]["sft_select"] == "threshold"
