"""Data parallel training under torchrun: the process group, and gradient averaging."""

from __future__ import annotations

import atexit
import os
import time

import torch

# how long the exit handler lets gloo's workers run before the interpreter ends (seconds):
# one pause, then more while a worker is still running, up to the cap
_DRAIN_S = 0.1
_DRAIN_CAP_S = 1.0


def world_and_rank() -> tuple[int, int]:
    """(world size, rank); under torchrun the process group is started here (gloo on CPU,
    nccl on GPU)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 1, 0
    if not dist.is_initialized():
        # before the group exists: torch's ShardedGradScaler takes ``dist.group.WORLD`` as a
        # default argument when its module is imported (torch.distributed.fsdp and .checkpoint
        # import it), and that reference would keep the group, and gloo's threads, alive
        # past destroy_process_group into interpreter finalization
        import torch.distributed.fsdp.sharded_grad_scaler

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_end_process_group)
    return dist.get_world_size(), dist.get_rank()


def _end_process_group() -> None:
    """Let the group's workers finish, then destroy the group this module started, while the
    interpreter is whole. When ``wait()`` returns, a gloo worker thread still holds the work it
    ran; dropping it releases the work's tensors, which takes the GIL. A thread that takes the
    GIL once finalization has begun is ended with a forced unwind, and the process dies of
    SIGABRT after its work is done ("terminate called without an active exception", twice in
    CI; a core dump shows ``~AsyncAllreduceWork`` in ``ProcessGroupGloo::runLoop`` calling
    ``take_gil``; pytorch/pytorch#179291). Sleeping hands the GIL to such a worker (longer while
    one is still running). Destroying the group alone does not: FSDP's meshes, kept by
    DTensor's caches, hold the group, so its workers outlive ``destroy_process_group``. A
    group the caller destroyed already is not destroyed again, but the pause is kept."""
    import torch.distributed as dist

    waited = 0.0  # also when the caller destroyed the group: a holder may keep its workers
    while waited < _DRAIN_CAP_S:
        time.sleep(_DRAIN_S)
        waited += _DRAIN_S
        if not running_workers():
            break
    if dist.is_initialized():
        dist.destroy_process_group()


def running_workers(tasks: str = "/proc/self/task") -> int:
    """This process's gloo worker threads (``pt_gloo*``) that are running or runnable, from
    ``/proc`` (0 where there is none): one preempted on a loaded machine may not have reached
    the GIL during the first pause. Idle workers, and ones waiting for the GIL, sleep."""
    busy = 0
    try:
        tids = os.listdir(tasks)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name.startswith("pt_gloo") and rest.split()[:1] in (["R"], ["D"]):
            busy += 1
    return busy


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


def share_old_logprobs(old: dict[int, torch.Tensor], new: list[int], device: torch.device
                       ) -> None:
    """Give every rank the pre-update log-probabilities each rank recorded since the last call
    (``new``: the transitions it saw first). A later epoch may put a transition on another
    rank than its first visit; its clipped ratio must still be against that first visit's
    log-probabilities, as in one process. Two all-gathers of padded float tensors."""
    import torch.distributed as dist

    world = dist.get_world_size()
    width = max((old[i].numel() for i in new), default=0)
    sizes = torch.tensor([len(new), width], dtype=torch.int64, device=device)
    every = [torch.zeros_like(sizes) for _ in range(world)]
    dist.all_gather(every, sizes)
    rows = max(int(s[0]) for s in every)
    cols = max(int(s[1]) for s in every)
    if rows == 0:
        return
    # per row: transition index, length, then the values (float64 holds an index exactly)
    mine = torch.zeros(rows, cols + 2, dtype=torch.float64, device=device)
    mine[:, 0] = -1
    for r, i in enumerate(new):
        lp = old[i].detach().reshape(-1)
        mine[r, 0], mine[r, 1] = i, lp.numel()
        mine[r, 2:2 + lp.numel()] = lp.to(torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for block in gathered:
        for row in block:
            i = int(row[0])
            if i >= 0 and i not in old:
                old[i] = row[2:2 + int(row[1])].to(torch.float32)
