"""Run under torchrun: per-agent LoRA training over the ranks (``ppo`` as a third argument: with
a critic). Each rank writes its final LoRA weights (and value heads), so the test can check
every rank ends with the same ones (the all-reduce worked), and the process group's backend
(gloo, nccl; none in a world of one, which starts no group)."""

import json
import sys
from pathlib import Path

import pyarrow as pa
import torch.distributed as dist
from safetensors.torch import save_file

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.training import GRPOConfig, train_policy

model_dir, out = sys.argv[1], Path(sys.argv[2])
algorithm = sys.argv[3] if len(sys.argv) > 3 else None  # ppo: its value heads are saved too
rows = []
for i, (agent, reward) in enumerate([("a", 1.0), ("a", 0.0), ("a", 0.5), ("a", 0.0),
                                     ("b", 1.0), ("b", 0.0), ("b", 0.2), ("b", 0.9)]):
    rows.append({"episode_id": f"e{i}", "task_id": "t", "agent_name": agent,
                 "prompt_ids": [257, 40 + i, 258], "completion_ids": [60 + i, 61, 62],
                 "completion_mask": [1, 1, 1], "behaviour_logprobs": None, "reward": reward,
                 "group_id": f"g_{agent}", "advantage": None, "merged_calls": 1,
                 "retokenized": False})
result = train_policy(pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA), model_dir,
                      out / "adapters", policy="per_agent_lora", progress=False, keep_model=True,
                      config=GRPOConfig(learning_rate=5e-2, per_device_train_batch_size=1),
                      algorithm=algorithm)
grouped = dist.is_initialized()
rank = dist.get_rank() if grouped else 0
lora = {k: v.detach().clone() for k, v in result.model.named_parameters() if "lora_" in k}
if result.critic is not None:
    lora |= {f"critic.{k}": v.detach().clone() for k, v in result.critic.named_parameters()}
save_file(lora, str(out / f"rank{rank}.safetensors"))  # tensors without pickle
(out / f"rank{rank}.json").write_text(json.dumps({
    "steps": result.steps, "adapters": sorted(result.adapters),
    "micro_batches": len(result.metrics), "backend": dist.get_backend() if grouped else None,
    "device": next(result.model.parameters()).device.type}))
if grouped:
    dist.barrier()
    dist.destroy_process_group()
