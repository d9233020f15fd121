"""The policy model: loading the base with its LoRA adapters, and completion log-probabilities."""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from agl_bridge.trainer.training.config import GRPOConfig
from agl_bridge.trainer.training.losses import linear_token_logprobs, token_logprobs


def completion_hidden(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The decoder's last hidden state [B, C, H] at the positions that predict each completion
    token (``batch["index"]``): what the LM head, and PPO's value head, read."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(lm, lm.base_model_prefix)  # the decoder stack without its LM head
    hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch.get("position_ids"), use_cache=False).last_hidden_state
    b, c = batch["index"].shape
    picked = hidden.reshape(-1, hidden.size(-1)).index_select(0, batch["index"].reshape(-1))
    return picked.view(b, c, -1)


def completion_logprobs(model, batch: dict[str, torch.Tensor],
                        hidden: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities of the completion tokens. The LM head runs on completion positions only,
    and (a plain linear head, the usual case) in tiles whose logits are recomputed in backward
    (``linear_token_logprobs``): no [batch, completion, vocabulary] logits tensor is kept for
    backward, which with gradient checkpointing was most of the step's live memory.
    ``hidden``: ``completion_hidden``'s output when the caller has it (PPO's value head reads
    it too: one decoder pass for both)."""
    picked = completion_hidden(model, batch) if hidden is None else hidden
    b, c = batch["index"].shape
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:  # e.g. a LoRA-wrapped head: its own forward
        return token_logprobs(head(picked), batch["targets"])
    return linear_token_logprobs(picked.reshape(b * c, -1), head.weight,
                                 batch["targets"].reshape(b * c), head.bias).view(b, c)


def packing_support(model) -> tuple[bool, int, int | None]:
    """Whether this model takes packed rows (a custom 4-D additive mask: the ``sdpa`` and
    ``eager`` attention of transformers; flash-attention kernels take no arbitrary mask), its
    hidden size (for ``data.row_cost``) and the longest packed row it allows (a sliding window
    would otherwise cut differently in a long packed row than in each sequence's own)."""
    config = model.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    return impl in ("sdpa", "eager") and hidden > 0, hidden, window


def device_and_dtype(cfg: GRPOConfig) -> tuple[torch.device, torch.dtype]:
    """The device (under torchrun, each process its own GPU: ``LOCAL_RANK``) and the dtype the
    base weights load in (peft keeps LoRA weights in float32 beside a bfloat16 base)."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        wanted = cfg.bf16 in (None, True)
        return torch.device("cuda", index), torch.bfloat16 if wanted else torch.float32
    return torch.device("cpu"), torch.bfloat16 if cfg.bf16 else torch.float32


def load_policy(base_model, cfg: GRPOConfig, adapter_names: list[str],
          init_adapters: dict[str, str | os.PathLike[str]], *, placement: str = "device"):
    """The base model with one LoRA adapter per name (from ``init_adapters`` or new).
    ``placement``: ``device`` (the training device), ``cpu`` (weights read, left on the CPU:
    FSDP's rank 0, which shards and broadcasts them), or ``meta`` (the structure only, no
    weights read: FSDP's other ranks, filled from rank 0)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    device, dtype = device_and_dtype(cfg)
    model: Any
    if placement == "meta":
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_model),
                                                     dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
        if placement == "device":
            model = model.to(device)
    if cfg.gradient_checkpointing:
        # non-reentrant (the default of transformers 5, not of 4.x): it needs no inputs that
        # require grad, and recomputes only what backward asks for
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()  # what peft does anyway, and harmless
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    first, *rest = adapter_names
    if placement == "meta":  # the adapters' shapes only (their configs); rank 0 has values
        def config(name: str) -> Any:
            return (LoraConfig.from_pretrained(str(init_adapters[name]))
                    if name in init_adapters else lora)

        model = get_peft_model(model, config(first), adapter_name=peft_name(first))
        for name in rest:
            model.add_adapter(peft_name(name), config(name))
        model.train()
        return model, device
    if first in init_adapters:
        model = PeftModel.from_pretrained(model, str(init_adapters[first]),
                                          adapter_name=peft_name(first), is_trainable=True)
    else:
        model = get_peft_model(model, lora, adapter_name=peft_name(first))
    for name in rest:
        if name in init_adapters:
            model.load_adapter(str(init_adapters[name]), adapter_name=peft_name(name),
                               is_trainable=True)
        else:
            model.add_adapter(peft_name(name), lora)
    model.train()
    return model, device


def peft_name(name: str) -> str:
    """Agent names are user data; PEFT adapter names become module keys and must not be part of
    the ``lora_`` prefix (an adapter called ``a`` is reinitialised on load)."""
    return "agl_" + re.sub(r"[^0-9A-Za-z_]", "_", name)


def trainable(model) -> list[torch.nn.Parameter]:
    # every adapter's LoRA weights (set_adapter marks only the active one trainable)
    return [p for n, p in model.named_parameters() if "lora_" in n]


