"""The GPU benchmarks in one command (``make bench-gpu``), each figure printed beside its peer.

What runs, each in its own process, on the one GPU of the machine (refused where there is no
CUDA: these are the GPU figures; the CPU ones are in ``benchmarks/README*.md``):

* ``train``: ``train_vs_trl.py --device cuda`` on SmolLM2-135M-Instruct: our trainer's trained
  tokens/s and peak CUDA memory next to TRL's ``GRPOTrainer`` (1.16, its own venv) on the same
  GPU and shapes (8 prompts x 4 completions x 16 tokens per step, LoRA r=16 on q/k/v/o,
  bfloat16), gradient checkpointing off and on;
* ``serve``: ``publish_latency.py`` on SmolLM2 with vLLM's CUDA build: serving tokens/s with 0,
  1, 2 and 4 adapters live (128 concurrent requests of 64 tokens), and the time to publish a
  version (save, validate, load, probe, switch) next to vLLM's own in-place reload;
* ``demo``: ``agl-bridge demo`` (the README's job: SmolLM2, the arithmetic team) for ``--rounds``
  rounds (1), its wall time by stage next to the CPU demo's recorded figure.

The summary at the end puts them side by side, with the CPU figures this repository recorded
(2 cores, no GPU) as the last column. Everything each step printed, and its JSON, is kept in
``--out`` (``runs/bench-gpu``).

    .venv/bin/python benchmarks/gpu_bench.py [--quick] [--only train,serve,demo] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STEPS = ("train", "serve", "demo")

# what this repository recorded on its 2-core CPU machines (benchmarks/README.md, README.md)
CPU: dict[str, Any] = {
    "train": {"trl tokens/s (checkpointing off / on)": "23.2 / 19.6",
              "ours / TRL tokens/s": "2.20x / 2.13x", "TRL peak RSS MB": "2506 / 1985",
              "ours / TRL peak RSS": "0.65x / 0.69x"},
    "serve": {"0 adapters": 80.6, "1 adapter(s)": 35.7, "2 adapter(s)": 44.5,
              "4 adapter(s)": 34.3, "requests": 16},
    "publish_ms": {"ours": 622, "in_place": 574},
    "demo": "8 rounds in 27.4 min (README, a fresh clone of 4d50707)",
}


def run(name: str, cmd: list[str], out: Path, timeout: float) -> tuple[int, float]:
    """One step as a subprocess; its output goes to the terminal and to ``out/<name>.log``."""
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    return rc, time.perf_counter() - t0


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def side_by_side(train: dict | None, serve: dict | None, demo: dict | None,
                 device: str) -> list[str]:
    """The summary: each GPU figure beside its peer and the CPU figure recorded here."""
    lines = [f"GPU benchmarks on {device}", ""]
    lines.append("trainer, SmolLM2-135M, 512 trained tokens per step (tokens/s; peak CUDA MB)")
    if train:
        rows = {(r["trainer"], r["gradient_checkpointing"]): r for r in train.get("rows", [])}
        lines.append(f"  {'checkpointing':<14}{'ours':>16}{'TRL':>16}{'ours/TRL':>10}"
                     f"{'GPU MB ours':>12}{'GPU MB TRL':>12}")
        for gc in (False, True):
            o, t = rows.get(("ours", gc)), rows.get(("trl", gc))
            ratio = (f"{o['tokens_per_s'] / t['tokens_per_s']:.2f}x"
                     if o and t and t.get("tokens_per_s") else "-")

            def fmt(r: dict | None, key: str, spec: str) -> str:
                return "-" if not r or r.get(key) is None else format(r[key], spec)

            lines.append(f"  {'on' if gc else 'off':<14}{fmt(o, 'tokens_per_s', '.1f'):>16}"
                         f"{fmt(t, 'tokens_per_s', '.1f'):>16}{ratio:>10}"
                         f"{fmt(o, 'cuda_peak_mb', '.0f'):>12}{fmt(t, 'cuda_peak_mb', '.0f'):>12}")
    else:
        lines.append("  (not run, or failed: see train.log)")
    lines.append("  CPU, recorded: " + "; ".join(f"{k} {v}" for k, v in CPU["train"].items()))
    lines.append("")
    lines.append("serving, SmolLM2-135M, vLLM (tokens/s with adapters live)")
    if serve:
        n = serve.get("requests", "?")
        lines.append(f"  {'live adapters':<32}{f'GPU, {n} requests':>18}"
                     f"{'CPU, 16 requests':>18}")
        for key, value in serve.get("tokens_per_s", {}).items():
            cpu = CPU["serve"].get(key)
            lines.append(f"  {key:<32}{value:>18.1f}{'-' if cpu is None else cpu:>18}")
        lines.append("")
        lines.append("publish a version (ms, median)")
        lines.append(f"  {'path':<32}{'GPU':>18}{'CPU':>18}")
        for key, label in (("ours", "ours: new name per version"),
                           ("in_place", "peer: vLLM in-place reload")):
            totals = sorted(r["total"] for r in serve.get(key, []))
            med = totals[len(totals) // 2] * 1000 if totals else None
            lines.append(f"  {label:<32}{'-' if med is None else f'{med:.0f}':>18}"
                         f"{CPU['publish_ms'][key]:>18}")
    else:
        lines.append("  (not run, or failed: see serve.log)")
    lines.append("")
    lines.append("the README's demo (SmolLM2, arithmetic team)")
    if demo:
        secs = demo.get("seconds", {})
        total = sum(secs.values())
        lines.append(f"  GPU: {len(demo.get('rounds', []))} round(s) in {total / 60:.1f} min: "
                     + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items()))
    else:
        lines.append("  (not run, or failed: see demo.log)")
    lines.append(f"  CPU, recorded: {CPU['demo']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer steps, versions and repeats: about 10 minutes on one H100")
    ap.add_argument("--only", default=",".join(STEPS),
                    help=f"comma-separated steps of {', '.join(STEPS)} (default: all)")
    ap.add_argument("--rounds", type=int, default=1, help="demo rounds (default 1)")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-gpu"),
                    help="logs, JSON and the summary (default runs/bench-gpu)")
    args = ap.parse_args(argv)
    steps = [s for s in args.only.split(",") if s]
    if unknown := [s for s in steps if s not in STEPS]:
        ap.error(f"--only: unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    import torch

    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here (torch.cuda.is_available() is False): these "
              "are the GPU benchmarks; the CPU ones are train_vs_trl.py, publish_latency.py "
              "and the demo as benchmarks/README.md runs them", file=sys.stderr)
        return 2
    device = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, torch " \
             f"{torch.__version__}, {torch.cuda.device_count()} GPU(s))"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    quick = ["--quick"] if args.quick else []
    timings = {}
    if "train" in steps:
        timings["train"] = run("train", [py, str(HERE / "train_vs_trl.py"), "--device", "cuda",
                                         "--model", "smollm2", *quick,
                                         "--json", str(out / "train.json")], out, 3600)
    if "serve" in steps:
        timings["serve"] = run("serve", [py, str(HERE / "publish_latency.py"), "--model",
                                         "smollm2", "--requests", "128", *quick,
                                         "--json", str(out / "serve.json")], out, 3600)
    if "demo" in steps:
        work = out / "demo"
        timings["demo"] = run("demo", [str(Path(py).with_name("agl-bridge")), "demo",
                                       "--workdir", str(work), "--fresh",
                                       "--rounds", str(args.rounds)], out, 3600)
    summary = side_by_side(_json(out / "train.json") if "train" in steps else None,
                           _json(out / "serve.json") if "serve" in steps else None,
                           _json(out / "demo" / "state.json") if "demo" in steps else None,
                           device)
    summary += ["", "steps: " + ", ".join(f"{k} rc {rc} in {s / 60:.1f} min"
                                          for k, (rc, s) in timings.items())]
    text = "\n".join(summary)
    print("\n" + text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "machine.json").write_text(json.dumps({
        "device": device, "host": os.uname().nodename, "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, indent=1))
    return 0 if all(rc == 0 for rc, _ in timings.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
