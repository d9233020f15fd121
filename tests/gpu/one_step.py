"""One LoRA training step of the trainer, on the device and in the dtype the trainer picks,
written out so that two runs can be compared (the GPU suite's bfloat16 check).

The trainer chooses by itself (``trainer/training/model.py``, ``device_and_dtype``): CUDA when
a GPU is visible, in bfloat16 unless ``bf16=False``; the CPU otherwise, in float32 unless
``bf16=True``. There is no device setting: ``CUDA_VISIBLE_DEVICES=""`` is how a GPU machine
trains on its CPU, and how the GPU test gets its float32 CPU reference, in its own process.

The step is the trainer's: ``load_policy``, ``collate`` (prompts shared, packed as in training),
``completion_logprobs`` with its tiled LM head, ``grpo_clip_loss``, backward. The LoRA weights are
set from a CPU random generator (peft's init draws from the device's generator, and B starts at
zero, which leaves A without a gradient), so every run starts from the same weights.

The on-policy loss of a first step does not depend on the model's values (the ratio is 1), so
the forward is compared through the completion tokens' log-probabilities and their mean
negative log-likelihood (``nll``); the backward through every LoRA gradient.

Usage: one_step.py MODEL OUT.safetensors {auto,true,false}   (bf16: unset, on, off)
Writes OUT (``grad.<param>`` and ``logp`` tensors, float32) and prints one JSON line:
device, dtype, loss, nll.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import save_file

from agl_bridge.trainer.training import GRPOConfig
from agl_bridge.trainer.training.data import collate, pack_rows
from agl_bridge.trainer.training.losses import grpo_clip_loss
from agl_bridge.trainer.training.model import load_policy, packing_support, trainable
from agl_bridge.trainer.training.sharding import PolicyForward

ADVANTAGES = [1.0, -0.5, 0.25, -0.75, 0.5, -0.5]
# bfloat16 against float32, stated: about 5x what bfloat16 on the CPU gave against float32 on
# the CPU with this step (tests/gpu/test_suite_cpu.py measures that on every CI run: per-token
# log-probability 0.0024, gradients 1.0% overall and 2.0% for the worst tensor, cosine 0.99995)
TOLERANCE = {"logp_abs": 0.05, "nll_rel": 0.01, "grad_rel": 0.05, "grad_rel_worst": 0.1,
             "grad_cos_min": 0.998}


def rows() -> list[dict]:
    """Six transitions in two groups (a shared prompt each), completions of mixed lengths."""
    out = []
    for i, adv in enumerate(ADVANTAGES):
        n = 3 + i % 4
        out.append({"prompt_ids": [257, 40 + i // 3, 41, 42, 258],
                    "completion_ids": [(60 + 7 * i + k) % 250 for k in range(n)],
                    "completion_mask": [1] * n, "behaviour_logprobs": None, "advantage": adv})
    return out


def set_lora_weights(model: torch.nn.Module) -> None:
    """A and B from one CPU generator, the same on every device (B non-zero: A gets a
    gradient too)."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_" in name:
                scale = 0.05 if "lora_B" in name else p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def step(model_dir: str, bf16: bool | None) -> tuple[dict[str, torch.Tensor], dict]:
    """One step: (the tensors to compare, on the CPU in float32; device, dtype, loss, nll)."""
    cfg = GRPOConfig(bf16=bf16)
    model, device = load_policy(model_dir, cfg, ["a"], {})
    set_lora_weights(model)
    data = rows()
    _, hidden, window = packing_support(model)
    packing = pack_rows([r["prompt_ids"] for r in data], [len(r["completion_ids"]) for r in data],
                        hidden, window)
    pad_id = model.config.pad_token_id or 0
    batch = collate(data, pad_id, device, packing, model.dtype)
    logp, _ = PolicyForward(model)(batch)
    adv = torch.tensor([r["advantage"] for r in data], device=device)
    loss, _ = grpo_clip_loss(logp, logp.detach(), adv, batch["loss_mask"])
    loss.backward()
    mask = batch["loss_mask"]
    nll = -float((logp.detach().float() * mask).sum() / mask.sum())
    named = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(named) == len(trainable(model)) > 0
    tensors = {f"grad.{n}": p.grad.detach().float().cpu().contiguous()
               for n, p in named.items()}
    tensors["logp"] = (logp.detach().float() * mask).cpu().contiguous()
    return tensors, {"device": device.type, "dtype": str(model.dtype).removeprefix("torch."),
                     "loss": float(loss.detach()), "nll": nll}


def compare(ref: dict[str, torch.Tensor], ref_nll: float, got: dict[str, torch.Tensor],
            got_nll: float) -> dict[str, float]:
    """How far ``got`` is from ``ref``, in ``TOLERANCE``'s terms."""
    names = sorted(k for k in ref if k.startswith("grad."))
    assert names and sorted(k for k in got if k.startswith("grad.")) == names
    a = torch.cat([ref[k].flatten() for k in names])
    b = torch.cat([got[k].flatten() for k in names])
    return {
        "logp_abs": float((ref["logp"] - got["logp"]).abs().max()),
        "nll_rel": abs(got_nll - ref_nll) / abs(ref_nll),
        "grad_rel": float((a - b).norm() / a.norm()),
        "grad_rel_worst": max(float((ref[k] - got[k]).norm() / ref[k].norm()) for k in names),
        "grad_cos_min": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
    }


def outside(errors: dict[str, float]) -> dict[str, float]:
    """The figures past their tolerance (``grad_cos_min`` is a floor, the others ceilings)."""
    return {k: v for k, v in errors.items()
            if (v < TOLERANCE[k] if k == "grad_cos_min" else not v <= TOLERANCE[k])}


def main(model_dir: str, out: str, bf16: str) -> None:
    tensors, info = step(model_dir, {"auto": None, "true": True, "false": False}[bf16])
    save_file(tensors, out)
    print(json.dumps(info))


if __name__ == "__main__":
    main(*sys.argv[1:4])
