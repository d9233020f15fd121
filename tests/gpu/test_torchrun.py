"""FSDP2 and data parallel under torchrun with NCCL, on the GPUs present.

Ranks: 4 where 4 GPUs or more are present, else 2 where 2 are, else 1 (one GPU is a valid
world of one; NCCL refuses two ranks on one GPU). The trainer starts a process group only for a
world of two or more (``distributed.world_and_rank``), so on one GPU these tests check that
torchrun's world of one trains on CUDA what a plain process does, and NCCL itself is checked
by one all-reduce in a group of the GPUs present.

FSDP: one process with gradient accumulation N and N processes with accumulation 1 take the
same micro-batches into each optimizer step (as ``tests/trainer/training/test_fsdp.py`` does
on the CPU with gloo). Compared in float32 on CUDA (``bf16=False``: only the order of the
reductions differs; tolerance 1e-4 on losses and final LoRA weights, ten times the CPU test's),
and run once more in bfloat16 mixed precision (FSDP's ``MixedPrecisionPolicy``: bfloat16
compute, float32 reduction): it trains, its losses within 0.05 of the float32 run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import load_file

from tests.paths import TESTS
from tests.trainer.training.test_fsdp import _interleave, _lora, _run

pytestmark = pytest.mark.gpu


def ranks() -> int:
    import torch

    n = torch.cuda.device_count()
    return 4 if n >= 4 else 2 if n >= 2 else 1


def test_nccl_all_reduce_over_the_gpus_present(cuda, tmp_path):
    script = tmp_path / "reduce.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import torch
        import torch.distributed as dist
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        x = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        open(f"{sys.argv[1]}/rank{rank}", "w").write(f"{dist.get_backend()} {x[0].item()}")
        dist.destroy_process_group()
    """))
    n = ranks()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={n}", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = f"nccl {float(n * (n + 1) // 2)}"
    assert [(tmp_path / f"rank{r}").read_text() for r in range(n)] == [expected] * n


def test_fsdp_over_the_gpus_present_trains_what_one_process_does(cuda, tiny, tmp_path):
    n = ranks()
    one = _run(tiny, tmp_path / "one", "run", 1, n, backend="nccl", bf16="false")
    many = _run(tiny, tmp_path / "many", "run", n, 1, backend="nccl", bf16="false")
    assert all(r["device"] == "cuda" for r in one + many)
    assert [r["backend"] for r in many] == (["nccl"] * n if n > 1 else [None])
    assert one[0]["steps"] == many[0]["steps"] > 0
    assert _interleave(many) == pytest.approx(one[0]["losses"], abs=1e-4)
    assert len({tuple(r["adapter_per_micro"]) for r in many}) == 1  # one adapter per step
    for name in ("a", "b"):
        a = _lora(tmp_path / "one" / "adapters", name, "v0001")
        b = _lora(tmp_path / "many" / "adapters", name, "v0001")
        assert a.keys() == b.keys() and a
        assert all((a[k] - b[k]).abs().max() < 1e-4 for k in a)
        assert any(v.abs().sum() > 0 for k, v in b.items() if "lora_B" in k)
    mixed = _run(tiny, tmp_path / "mixed", "run", n, 1, backend="nccl", bf16="auto")
    assert mixed[0]["steps"] == many[0]["steps"]
    assert _interleave(mixed) == pytest.approx(_interleave(many), abs=0.05)


def test_fsdp_checkpoint_resumes_under_nccl(cuda, tiny, tmp_path):
    """Sharded checkpoints written and read through NCCL (each rank's shard of a CUDA tensor)."""
    n = ranks()
    whole = _run(tiny, tmp_path / "whole", "run", n, 1, backend="nccl", bf16="false")
    stopped = _run(tiny, tmp_path / "resumed", "stop", n, 1, backend="nccl", bf16="false")
    assert stopped[0]["steps"] == 2
    resumed = _run(tiny, tmp_path / "resumed", "resume", n, 1, backend="nccl", bf16="false")
    for r in range(n):
        assert resumed[r]["losses"] == pytest.approx(whole[r]["losses"], abs=1e-4)


def test_data_parallel_over_the_gpus_present(cuda, tiny, tmp_path):
    """Every rank ends with the same LoRA weights (the gradients were all-reduced over NCCL)."""
    n = ranks()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={n}", str(TESTS / "distributed_train.py"),
                           str(tiny), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    lora = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(n)]
    assert all(o["device"] == "cuda" for o in out)
    assert [o["backend"] for o in out] == (["nccl"] * n if n > 1 else [None])
    assert sum(o["micro_batches"] for o in out) == 8  # 8 transitions, batch 1, over the ranks
    assert out[0]["adapters"] == ["a", "b"] and all(o["adapters"] == [] for o in out[1:])
    for other in lora[1:]:
        assert other.keys() == lora[0].keys()
        assert all((other[k] == lora[0][k]).all() for k in other)
    assert any(v.abs().sum() > 0 for k, v in lora[0].items() if "lora_B" in k)
