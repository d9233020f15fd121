"""Memory per GPU for training and serving a 7B and a 70B model with 2 agents' LoRA adapters,
computed from the models' shapes (docs/scaling.md prints this table).

Shapes are the published configs of Qwen2.5-7B-Instruct and Llama-3.1-70B-Instruct. The
trainer's defaults: LoRA r=8 on q/k/v/o, one adapter per agent (``per_agent_lora``), AdamW;
on GPU the base in bfloat16, LoRA weights, gradients and optimizer state in float32. FSDP
(``parallelism="fsdp"``) shards all of them over the ranks; data parallel keeps a whole copy
on each. Activations: gradient checkpointing on, a micro-batch of ``TOKENS`` tokens per rank;
the layer inputs kept for backward (bfloat16) plus one layer's recomputation, estimated as
``tokens x (12 hidden + 4 intermediate) x 2 bytes`` (q, k, v, o, norms, residuals, MLP gate,
up, activation, down; sdpa attention keeps no score matrix); the LM head's log-probabilities
are computed in tiles (no tokens x vocabulary logits kept). FSDP also holds one block gathered
while it runs and the next prefetched. Serving (vLLM) keeps the bfloat16 weights split by
tensor parallelism, plus the KV cache: ``2 x layers x kv_heads x head_dim x 2 bytes`` per
token. Estimates within about 20%: the allocator's fragmentation and CUDA context (about
1 GiB per GPU) come on top.

Run: ``python benchmarks/scaling_memory.py [--tokens 8192] [--gpu-gib 80]``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def block_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attention = h * h + 2 * h * kv + h * h  # q, k, v, o
        return attention + 3 * h * self.intermediate + 2 * h  # + MLP, 2 norms

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.block_params() + self.hidden

    def lora_params(self, r: int = 8) -> int:
        """One adapter on q, k, v, o: r x (in + out) per projection."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return self.layers * r * ((h + h) + 2 * (h + kv) + (h + h))

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS = [
    Shape("Qwen2.5-7B", vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4,
          intermediate=18944),
    Shape("Llama-3.1-70B", vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8,
          intermediate=28672),
]
AGENTS = 2


def training(m: Shape, ranks: int, sharded: bool, tokens: int) -> dict[str, float]:
    share = ranks if sharded else 1
    base = 2 * m.params() / share
    lora = AGENTS * m.lora_params()
    lora_state = 16 * lora / share  # float32 weights, gradients, Adam's two moments
    kept = m.layers * tokens * m.hidden * 2
    layer = tokens * (12 * m.hidden + 4 * m.intermediate) * 2
    gathered = 2 * 2 * m.block_params() if sharded else 0
    total = base + lora_state + kept + layer + gathered
    return {"base": base / GIB, "lora": lora_state / GIB, "activations": (kept + layer) / GIB,
            "gathered": gathered / GIB, "total": total / GIB}


def serving(m: Shape, tp: int, gpu_gib: float, context: int) -> dict[str, float]:
    weights = 2 * m.params() / tp
    adapters = 4 * 2 * AGENTS * m.lora_params() / tp  # 4 versions loaded (max_loras), bf16
    free = gpu_gib * GIB * 0.9 - weights - adapters  # vLLM's default 0.9 utilisation
    per_seq = m.kv_bytes_per_token() * context / tp
    return {"weights": weights / GIB, "adapters": adapters / GIB,
            "kv_free": max(0.0, free) / GIB, "sequences": max(0.0, free) / per_seq}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="micro-batch tokens per rank")
    ap.add_argument("--gpu-gib", type=float, default=80.0)
    ap.add_argument("--context", type=int, default=4096, help="tokens per served sequence")
    a = ap.parse_args()
    for m in MODELS:
        print(f"\n{m.name}: {m.params() / 1e9:.2f} B parameters, one LoRA adapter "
              f"(r=8, q/k/v/o) {m.lora_params() / 1e6:.1f} M; {AGENTS} agents; "
              f"{a.tokens} tokens per rank per micro-batch; GiB per GPU")
        print(f"  {'training':<22}{'base':>8}{'LoRA+opt':>10}{'activ.':>8}{'gathered':>10}"
              f"{'total':>8}  fits {a.gpu_gib:.0f} GiB")
        for ranks, sharded in [(1, False), (2, True), (4, True), (8, True)]:
            t = training(m, ranks, sharded, a.tokens)
            label = "1 GPU" if ranks == 1 else f"FSDP over {ranks}"
            print(f"  {label:<22}{t['base']:>8.1f}{t['lora']:>10.2f}{t['activations']:>8.1f}"
                  f"{t['gathered']:>10.1f}{t['total']:>8.1f}  "
                  f"{'yes' if t['total'] < a.gpu_gib * 0.92 else 'no'}")
        print(f"  {'serving (vLLM)':<22}{'weights':>8}{'adapters':>10}{'KV free':>9}"
              f"  sequences of {a.context} tokens")
        for tp in (1, 2, 4, 8):
            s = serving(m, tp, a.gpu_gib, a.context)
            print(f"  {f'tensor parallel {tp}':<22}{s['weights']:>8.1f}{s['adapters']:>10.2f}"
                  f"{s['kv_free']:>9.1f}  {int(s['sequences'])}")


if __name__ == "__main__":
    main()
