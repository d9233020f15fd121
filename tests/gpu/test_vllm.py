"""The CUDA build of vLLM serving with runtime LoRA: the tiny model and SmolLM2-135M-Instruct,
an adapter loaded at run time answering as transformers+peft compute it, and the publisher's
hot swap with 16 agents calling through five versions (the CPU suite's e2e test, on CUDA).

Agreement with transformers: vLLM computes in bfloat16, the reference in float32, so vLLM's
greedy token need not be the reference's argmax where two are close; what must hold is that
the reference gives vLLM's token about vLLM's log-probability (within 0.15) and that token is
within 0.15 of the best, with the adapter and without, and that the adapter changed the
answer's log-probabilities (by more than 0.15 somewhere): served LoRA is the trained LoRA.
"""

from __future__ import annotations

import functools

import openai
import pytest

from tests.gpu.vllm_gpu import GPU_ARGS, hf_logprob, random_adapter

pytestmark = pytest.mark.gpu
PROMPTS = ["What is 3 + 4?", "Name a colour.", "Write the word 'blue' backwards."]
CLOSE = 0.15


def _first_tokens(base_url: str, model: str) -> list[tuple[list[int], int, float]]:
    """Per prompt: the prompt's token ids, the greedy first token and its log-probability."""
    client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
    out = []
    for p in PROMPTS:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=1,
            logprobs=True, extra_body={"return_token_ids": True})
        raw = r.model_dump()
        out.append((raw["prompt_token_ids"], raw["choices"][0]["token_ids"][0],
                    raw["choices"][0]["logprobs"]["content"][0]["logprob"]))
    return out


def _serves_runtime_lora_as_peft_computes_it(model_dir, tmp_path, scale: float) -> None:
    from agl_bridge.trainer.serving.publisher import publish_adapter
    from agl_bridge.trainer.serving.vllm_server import VLLMServer

    adapter = random_adapter(model_dir, tmp_path / "adapters", seed=0, scale=scale)
    with VLLMServer(model_dir, served_model_name="base", max_model_len=512,
                    extra_args=GPU_ARGS, log_path=tmp_path / "vllm.log") as server:
        assert server.dtype == "bfloat16"
        name = publish_adapter(server.base_url, adapter)
        base = _first_tokens(server.base_url, "base")
        tuned = _first_tokens(server.base_url, name)
    log = (tmp_path / "vllm.log").read_text(errors="replace")
    assert "cuda" in log.lower(), log[-2000:]
    moved = 0.0
    for (ids, token, logprob), (ids2, token2, logprob2) in zip(base, tuned):
        assert ids == ids2
        for adapter_dir, t, lp in ((None, token, logprob), (adapter, token2, logprob2)):
            ref, best = hf_logprob(model_dir, adapter_dir, ids, t)
            assert abs(ref - lp) < CLOSE and best - ref < CLOSE, (adapter_dir, t, lp, ref, best)
        moved = max(moved, abs(logprob - logprob2) if token == token2 else 1.0)
    assert moved > CLOSE, "the adapter changed nothing: was it applied?"


def test_tiny_model_with_runtime_lora(cuda, tiny, tmp_path):
    _serves_runtime_lora_as_peft_computes_it(tiny, tmp_path, scale=0.5)


def test_smollm2_with_runtime_lora(cuda, tmp_path):
    from agl_bridge.trainer.models.smollm2 import smollm2_instruct

    _serves_runtime_lora_as_peft_computes_it(smollm2_instruct(), tmp_path, scale=0.05)


def test_hot_swap_with_running_agents_on_cuda(cuda, tmp_path, spans, instrumented, monkeypatch):
    """tests/trainer/serving/test_e2e_hot_swap.py's 16 clients through 5 swaps, unchanged but
    for the server's share of GPU memory (its adapters train on the GPU in this process)."""
    from agl_bridge.trainer.serving.vllm_server import VLLMServer
    from tests.trainer.serving import test_e2e_hot_swap as e2e

    monkeypatch.setattr(e2e, "VLLMServer", functools.partial(VLLMServer, extra_args=GPU_ARGS))
    e2e.test_sixteen_clients_through_five_swaps(tmp_path, spans, instrumented, monkeypatch)
