"""Serving throughput with LoRA adapters on vLLM's CPU backend: vLLM's own torch ops vs
agl-bridge's grouped ops (``agl_bridge.trainer.serving.vllm_cpu_lora``), in one run.

For each setting a fresh server (SmolLM2-135M-Instruct, float32) gets the same load:
``--requests`` chat requests, all in flight at once, ``--max-tokens`` tokens each at temperature
0, spread over the adapters given (none: the base model, the floor). Prints completion tokens/s
and wall time per setting, and whether the greedy replies of the two LoRA settings agree.

    .venv/bin/python benchmarks/vllm_cpu_lora.py --adapter DIR [--adapter DIR2] [--requests 64]

Last seen (2026-11-21, 2 cores shared with other jobs, vllm-cpu 0.32.0, two rank-16 adapters on
q/k/v/o from the demo, 64 requests x 16 tokens):

    setting                               tokens  wall s  tokens/s
    base model, no adapter                   762    13.9      54.7
    adapters, vLLM's torch ops               638    58.9      10.8
    adapters, agl-bridge grouped ops         638    16.2      39.3
    greedy replies identical between the two LoRA settings: 64/64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai

from agl_bridge.trainer.serving.publisher import publish_adapter
from agl_bridge.trainer.serving.vllm_cpu_lora import ENV
from agl_bridge.trainer.serving.vllm_server import VLLMServer


async def load(base_url: str, models: list[str], n: int, max_tokens: int):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")

    async def one(i: int):
        r = await client.chat.completions.create(
            model=models[i % len(models)], temperature=0, max_tokens=max_tokens,
            messages=[{"role": "user", "content": f"Compute {i % 37 + 2} + {i % 8 + 2}. Reply "
                       f"with one line: a + b = <result>"}])
        return r.choices[0].message.content, r.usage.completion_tokens

    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    await client.close()
    return [o for o, _ in out], sum(k for _, k in out), wall


def measure(model: Path, adapters: list[Path], patched: bool, args) -> dict:
    os.environ[ENV] = "1" if patched else "0"
    with VLLMServer(model, served_model_name="base", max_model_len=1024, max_loras=4,
                    max_lora_rank=16, log_path=Path(args.log_dir) / f"vllm-{patched}.log") as s:
        names = [publish_adapter(s.base_url, d, name=f"a{i}") for i, d in enumerate(adapters)]
        names = names or ["base"]
        asyncio.run(load(s.base_url, names, 8, 4))  # warm-up
        replies, tokens, wall = asyncio.run(load(s.base_url, names, args.requests,
                                                 args.max_tokens))
    return {"replies": replies, "tokens": tokens, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", action="append", default=[], type=Path)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    from train_models import ensure_model

    model = ensure_model("smollm2")
    rows = [("base model, no adapter", measure(model, [], True, args))]
    if args.adapter:
        rows.append(("adapters, vLLM's torch ops", measure(model, args.adapter, False, args)))
        rows.append(("adapters, agl-bridge grouped ops", measure(model, args.adapter, True,
                                                               args)))
    print(f"{args.requests} requests at once, up to {args.max_tokens} tokens, "
          f"{len(args.adapter)} adapter(s)")
    print(f"{'setting':36} {'tokens':>7} {'wall s':>7} {'tokens/s':>9}")
    for name, r in rows:
        print(f"{name:36} {r['tokens']:7d} {r['wall']:7.1f} {r['tokens'] / r['wall']:9.1f}")
    if len(rows) == 3:
        same = sum(a == b for a, b in zip(rows[1][1]["replies"], rows[2][1]["replies"]))
        print(f"greedy replies identical between the two LoRA settings: {same}/{args.requests}")


if __name__ == "__main__":
    main()
