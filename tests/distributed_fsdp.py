"""Run under torchrun (or as one plain process): per-agent LoRA training with
``parallelism="fsdp"``. Writes each rank's per-micro-batch losses and, from rank 0, the
adapters; ``stop`` checkpoints every step and stops after 2, ``kill`` checkpoints every step
and rank 1 kills itself (SIGKILL) in the save of step 3, once its shards are on disk and before
rank 0 renames the checkpoint into place; ``resume`` continues the latest checkpoint. BF16
(``auto``, ``true``, ``false``: the setting unset, on, off) lets the GPU suite compare in float32
on CUDA. Each rank also writes the process group's backend (gloo, nccl; none in a world of one)
and the device it trained on. ALGORITHM ``ppo`` trains with a critic on two-turn episodes (a
tool result masked in the second turn; gamma and lam 0.9), and each rank writes its
micro-batches' value metrics too.
Usage: distributed_fsdp.py MODEL OUT {run,stop,kill,resume} ACCUMULATION [POLICY [BF16
[ALGORITHM]]]"""

import json
import os
import signal
import sys
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.training import GRPOConfig, train_policy

model_dir, out, mode, accumulation = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
policy = sys.argv[5] if len(sys.argv) > 5 else "per_agent_lora"
bf16 = {"auto": None, "true": True, "false": False}[sys.argv[6] if len(sys.argv) > 6 else "auto"]
algorithm = sys.argv[7] if len(sys.argv) > 7 else None
rows = []
# two agents, two groups each, completions of different lengths
for i in range(0 if algorithm == "ppo" else 16):
    agent = "ab"[i % 2]
    n = 2 + i % 5
    rows.append({"episode_id": f"e{i}", "task_id": "t", "agent_name": agent,
                 "prompt_ids": [257, 40 + i % 4, 258], "completion_ids": list(range(60, 60 + n)),
                 "completion_mask": [1] * n, "behaviour_logprobs": None,
                 "reward": [1.0, 0.0, 0.5, 0.2, 0.9, 0.1, 0.7, 0.3][i % 8],
                 "group_id": f"g_{agent}_{i // 8}", "advantage": None, "merged_calls": 1,
                 "retokenized": False})
for e in range(4 if algorithm == "ppo" else 0):  # each agent two turns per episode
    for agent in "ab":
        for turn in (0, 1):
            n = 2 + (e + turn) % 3
            rows.append({"episode_id": f"e{e}", "task_id": "t", "agent_name": agent,
                         "turn_index": turn,
                         "prompt_ids": [257, 40 + e, 50 + turn, 54 + "ab".index(agent)],
                         "completion_ids": ([70, 71] if turn else []) + list(range(60, 60 + n)),
                         "completion_mask": ([0, 0] if turn else []) + [1] * n,
                         "behaviour_logprobs": None, "group_id": f"task:t|agent:{agent}",
                         "reward": [1.0, 0.0, 0.5, 0.2][e] if turn else 0.1 * e,
                         "advantage": None, "merged_calls": 1 + turn, "retokenized": False})
rank = int(os.environ.get("RANK", "0"))
if mode == "kill":
    from agl_bridge.trainer.training import checkpoints

    written = checkpoints._fsync_dir_files

    def die_in_the_third_save(folder: Path, extra: list[Path]) -> None:
        written(folder, extra)
        if rank == 1 and ".tmp-checkpoint-3" in str(folder):
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoints._fsync_dir_files = die_in_the_third_save
cfg = GRPOConfig(learning_rate=5e-2, per_device_train_batch_size=2, num_train_epochs=2,
                 gradient_accumulation_steps=accumulation, parallelism="fsdp",
                 save_steps=1 if mode in ("stop", "kill") else None,
                 max_steps=2 if mode == "stop" else None, bf16=bf16,
                 **({"lam": 0.9, "critic_learning_rate": 5e-2, "cliprange_value": 1.0}
                    if algorithm == "ppo" else {}))
result = train_policy(pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA), model_dir,
                      out / "adapters", policy=policy, progress=False, config=cfg,
                      checkpoint_dir=out / "checkpoints",
                      resume_from_checkpoint=True if mode == "resume" else None,
                      algorithm=algorithm, gamma=0.9)
backend = dist.get_backend() if dist.is_initialized() else None
out.mkdir(parents=True, exist_ok=True)  # rank 1 may finish before rank 0 has saved into it
(out / f"{mode}-rank{rank}.json").write_text(json.dumps({
    "steps": result.steps, "adapters": {k: str(v) for k, v in result.adapters.items()},
    "losses": [m["loss"] for m in result.metrics],
    **{key: [m[key] for m in result.metrics] for key in
       ("policy_loss", "value_loss", "value_mean", "return_mean", "advantage_mean")
       if algorithm == "ppo"},
    "adapter_per_micro": [m["adapter"] for m in result.metrics], "backend": backend,
    "device": "cuda" if torch.cuda.is_available() else "cpu"}))
