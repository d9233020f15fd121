"""Data parallel training under torchrun: the process group, and gradient averaging."""

from __future__ import annotations

import os

import torch


def world_and_rank() -> tuple[int, int]:
    """(world size, rank); under torchrun the process group is started here (gloo on CPU,
    nccl on GPU)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 1, 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_world_size(), dist.get_rank()


def all_reduce_grads(params: list[torch.nn.Parameter], world: int) -> None:
    """Average gradients over the ranks. Parameters with no gradient on any rank keep None, so
    the optimizer leaves them exactly as they are (per-agent adapters: ranks may be training
    different agents in the same step)."""
    import torch.distributed as dist

    had = torch.tensor([p.grad is not None for p in params], dtype=torch.float32,
                       device=params[0].device)
    dist.all_reduce(had)
    for p, n in zip(params, had.tolist()):
        if n == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world


