"""A LoRA training step in bfloat16 on CUDA agrees with the float32 step on the CPU.

Both are the trainer's own step (``one_step.py``), each in its own process: the CPU reference
with ``CUDA_VISIBLE_DEVICES=""`` (float32, the trainer's CPU default), the GPU step as the
trainer runs by default there (bfloat16 base, float32 LoRA weights). Tolerances:
``one_step.TOLERANCE`` (per-token log-probability 0.05, mean NLL 1%, LoRA gradients 5% overall
and 10% for the worst tensor, cosine at least 0.998), about five times what bfloat16 on the CPU
gives, measured in CI by ``test_suite_cpu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from tests.gpu.one_step import TOLERANCE, compare, outside

pytestmark = pytest.mark.gpu


def _step(tiny, out, bf16: str, env: dict[str, str]) -> tuple[dict, dict]:
    done = subprocess.run([sys.executable, "-m", "tests.gpu.one_step", str(tiny), str(out), bf16],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(str(out)), json.loads(done.stdout.strip().splitlines()[-1])


def test_bf16_cuda_step_matches_the_fp32_cpu_step(cuda, tiny, tmp_path):
    ref, ref_info = _step(tiny, tmp_path / "cpu.safetensors", "auto", {"CUDA_VISIBLE_DEVICES": ""})
    got, got_info = _step(tiny, tmp_path / "gpu.safetensors", "auto", {})
    assert (ref_info["device"], ref_info["dtype"]) == ("cpu", "float32")
    assert (got_info["device"], got_info["dtype"]) == ("cuda", "bfloat16")
    assert got_info["loss"] == pytest.approx(ref_info["loss"], rel=1e-3)
    errors = compare(ref, ref_info["nll"], got, got_info["nll"])
    assert not outside(errors), f"past {TOLERANCE}: {errors}"


def test_fp32_cuda_step_matches_the_cpu_step_closely(cuda, tiny, tmp_path):
    """``bf16=False`` on the GPU: float32 there too, so only kernels differ (TF32 is off by
    default in torch for matmuls): a hundredth of the bfloat16 tolerances."""
    ref, ref_info = _step(tiny, tmp_path / "cpu.safetensors", "auto", {"CUDA_VISIBLE_DEVICES": ""})
    got, got_info = _step(tiny, tmp_path / "gpu.safetensors", "false", {})
    assert (got_info["device"], got_info["dtype"]) == ("cuda", "float32")
    errors = compare(ref, ref_info["nll"], got, got_info["nll"])
    assert errors["grad_rel"] < TOLERANCE["grad_rel"] / 100, errors
    assert errors["logp_abs"] < TOLERANCE["logp_abs"] / 100, errors
