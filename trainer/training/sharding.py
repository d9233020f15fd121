"""Fully sharded training (PyTorch FSDP2, ``fully_shard``) of the LoRA policies.

Why a wrapper module: ``completion_logprobs`` runs the decoder stack and then uses the LM
head's weight directly (the tiled log-softmax), never calling the whole model's ``forward``.
FSDP2 gathers a unit's parameters in that unit's forward hooks, so the computation itself is
made a module (``PolicyForward``) and sharded as the root unit: the embeddings, final norm and
head are gathered when it runs, each decoder block in its own unit when the block runs. The
root keeps its parameters gathered from forward to backward (FSDP2 does not reshard the root
after forward), which the head's recomputation in backward needs.

PPO's critic (``critic.ValueHeads``) is a unit of its own inside the root, sharded like the
rest rather than replicated. Why: its weights, gradients and optimizer state are then DTensors
like the LoRA weights', so the gradient reduction, the broadcast of rank 0's weights at load,
the sharded checkpoint (DCP, whose optimizer state dict refuses a parameter the sharded module
does not hold) and the gathered save cover the critic with no code of their own; replicated,
each of these would need a second mechanism for a few thousand numbers. Its own unit, not the
root's, so that it keeps computing in float32 under mixed precision, as in one process (the
root gathers its parameters in bfloat16 then). The heads are ``Linear(hidden, 1)``: a rank's
shard of one may be empty, which FSDP2 pads.

Why the same adapter on every rank in a step: FSDP2 reduce-scatters the gradients of the
parameters that have one; if ranks trained different agents' adapters in the same step, their
sets would differ and the collectives would not match. ``loop._train`` plans micro-batches in
units of ``world x gradient_accumulation_steps`` of one adapter under FSDP.

All functions here that touch the process group are collectives: every rank calls them.
"""

from __future__ import annotations

from typing import Any

import torch

from agl_bridge.trainer.training.critic import ValueHeads, load_value_heads
from agl_bridge.trainer.training.model import completion_hidden, completion_logprobs


class PolicyForward(torch.nn.Module):
    """``completion_logprobs`` of the wrapped (peft) model as a module call, and PPO's values
    from the same decoder pass; unsharded, calling it is calling the functions."""

    def __init__(self, model: torch.nn.Module, critic: ValueHeads | None = None) -> None:
        super().__init__()
        self.model: Any = model
        self.critic = critic

    def forward(self, batch: dict[str, torch.Tensor], values_of: str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probabilities [B, C], and with ``values_of`` (an adapter name) the values
        [B, C] of its head, read from the hidden state the log-probabilities came from)."""
        hidden = completion_hidden(self.model, batch)
        # a copy, not a view ([batch, completion]: small): FSDP2 hooks backward on the output,
        # and an in-place op on a view of it would drop that hook
        logp = completion_logprobs(self.model, batch, hidden).clone()
        if values_of is None:
            return logp, None
        if self.critic is None:
            raise ValueError(f"values of {values_of!r} asked of a policy without a critic")
        return logp, self.critic(values_of, hidden)


def blocks(model: Any) -> list[torch.nn.Module]:
    """The decoder blocks of a (peft-wrapped) transformers causal LM: the units FSDP shards
    one by one (gathered only while their block runs)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(lm, lm.base_model_prefix)
    layers = getattr(body, "layers", None) or getattr(body, "h", None)
    if layers is None:
        raise ValueError(f"{type(lm).__name__}: no decoder blocks found (.layers or .h) to "
                         "shard; use parallelism='data'")
    return list(layers)


def shard(model: Any, device: torch.device, mixed_precision: bool,
          critic: ValueHeads | None = None) -> PolicyForward:
    """``fully_shard`` each decoder block, then ``critic`` (PPO's value heads), then the rest
    as the root unit. On a GPU with ``mixed_precision``, blocks compute in bfloat16 and
    gradients are reduced in float32 while the sharded parameters (and so the optimizer) stay
    float32; the critic computes in float32 throughout."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, **kwargs)
    if critic is not None:
        fully_shard(critic, mesh=mesh)
    forward = PolicyForward(model, critic)
    fully_shard(forward, **kwargs)
    return forward


def load_sharded(base_model: Any, cfg: Any, names: list[str], init_adapters: dict[str, Any],
                 mixed_precision: bool, critic: bool = False,
                 start: dict[str, float] | None = None
                 ) -> tuple[Any, PolicyForward, torch.device]:
    """The policy, sharded, with the base read once per job: rank 0 reads the weights into
    CPU memory; the other ranks build the structure on the meta device (no memory); all
    shard it, and rank 0's weights (base, adapters, buffers) are broadcast, each rank keeping
    its shard. Host memory: one copy of the model on rank 0's host, not one per rank.
    ``critic``: PPO's value heads too (``forward.critic``), rank 0's read beside the adapters
    they continue (``init_adapters``; a new one's bias at ``start``: ``critic.mean_returns``)
    and broadcast with the rest."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from agl_bridge.trainer.training.model import load_policy

    rank = dist.get_rank()
    model, device = load_policy(base_model, cfg, names, init_adapters,
                                placement="cpu" if rank == 0 else "meta")
    heads = (load_value_heads(names, model.config.hidden_size,
                              init_adapters if rank == 0 else {}, torch.device("cpu"),
                              start if rank == 0 else None)
             if critic else None)
    # rank 0's whole weights, held until broadcast (the sharded module's keys: "model." ...)
    full = PolicyForward(model, heads).state_dict() if rank == 0 else {}
    forward = shard(model, device, mixed_precision, heads)  # rank 0's buffers move with data
    if rank != 0:
        forward.to_empty(device=device)
    set_model_state_dict(forward, full, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    del full
    # buffers outside the state dict (e.g. rotary frequencies) are garbage after to_empty
    for buf in model.buffers():
        dist.broadcast(buf, src=0)
    return model, forward, device


def all_lora_trainable(module: torch.nn.Module) -> None:
    """Every adapter's LoRA weights trainable again: peft's ``set_adapter`` freezes the
    inactive adapters, and under FSDP every rank must keep the same trainable set (and a state
    dict must hold every adapter)."""
    for n, p in module.named_parameters():
        if "lora_" in n:
            p.requires_grad_(True)


def local_value(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective), a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return x.full_tensor() if isinstance(x, DTensor) else x


def full_state(forward: PolicyForward
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every adapter's LoRA weights, whole, on the CPU, keyed as the peft model's own
    ``state_dict`` (what ``save_pretrained(state_dict=...)`` takes), and the critic's heads
    keyed as ``ValueHeads``' own (empty without one). A collective: every rank calls it; each
    gets the full tensors (LoRA weights and heads are small next to the base)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    all_lora_trainable(forward)
    state: dict[str, Any] = get_model_state_dict(forward, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))
    lora = {k.removeprefix("model."): v for k, v in state.items() if "lora_" in k}
    critic = {k.removeprefix("critic."): v for k, v in state.items()
              if k.startswith("critic.")}
    return lora, critic
