"""Instructions per ``chat.completions.create``, counted by callgrind, for the variants of
``capture_overhead.py``: timers on this shared 2-core machine do not resolve a few tens of us
per call, instruction counts repeat.

Each (variant, mode) runs in its own fresh process under ``valgrind --tool=callgrind
--instr-atstart=no``, with ``capture_overhead.py``'s mock transport (vLLM-shaped answers: 200
prompt ids, 16 completion tokens, a stream of 16 token chunks), its ``TracerProvider`` +
``BatchSpanProcessor`` and its variants:

* ``bare``: no instrumentation (``peer_bare``: the same in the peer's venv, the peer's baseline);
* ``bare_ids``: no instrumentation, but the call itself asks for what ``ours`` adds to the
  request (``extra_body={"return_token_ids": True}``, ``logprobs=True``): the SDK's cost of the
  larger request and answer, pydantic models of every logprob entry included, with no tracing;
* ``sdk_floor``: one SDK span + 8 ``gen_ai.*`` attributes around the bare call, by hand;
* ``ours`` (``token_ids="always"``) and ``ours_never`` (``token_ids="never"``);
* ``peer``: opentelemetry-instrumentation-openai-v2 (``capture_overhead.py`` makes its venv).

After ``--warmup`` calls outside the count, a client request (a tiny C helper built here with
``valgrind/callgrind.h``) zeroes and starts counting, ``--calls`` calls run, the span queue is
flushed once (so the export thread's work for those spans counts: callgrind counts every thread)
and the count is dumped. Per call = count / calls; added = variant - bare of the same venv.

    .venv/bin/python benchmarks/capture_callgrind.py
        [--variants bare,sdk_floor,ours_never,ours,peer] [--modes sync,async,stream]
        [--calls 30] [--warmup 10] [--repeats 1] [--jobs 2] [--keep DIR] [--json PATH]

``--keep DIR`` keeps each process's dump (``DIR/<variant>-<mode>-<repeat>.out``) for
``callgrind_annotate --inclusive=yes``. ``AGL_CALLGRIND_PATCH=FILE`` runs a Python file in the
worker before the count (to switch one piece off and count what it cost).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from callgrind_counts import Counter, run_counted

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
MODES = ("sync", "async", "stream")
DEV_VARIANTS = ("bare", "bare_ids", "sdk_floor", "ours_never", "ours")
PEER_VARIANTS = ("peer_bare", "peer")
BARE_OF = {v: "bare" for v in DEV_VARIANTS} | {v: "peer_bare" for v in PEER_VARIANTS}
NS_PER_INSTRUCTION = 0.27  # the 2026-11-25 rate (benchmarks/README.md), about +-25%


def worker(variant: str, mode: str, calls: int, warmup: int) -> None:
    sys.path.insert(0, str(HERE.parent))
    from capture_overhead import _Discard, _Variant, call_runner

    counter = Counter()
    tmp = tempfile.mkdtemp(prefix="agl-cg-capture-")
    v = _Variant("bare" if variant == "bare_ids" else variant, tmp)
    v.set(True)
    if os.environ.get("AGL_CALLGRIND_PATCH"):  # ablation: a file run here, e.g. a piece off
        exec(compile(Path(os.environ["AGL_CALLGRIND_PATCH"]).read_text(), "patch", "exec"), {})
    extra: dict = ({"extra_body": {"return_token_ids": True}, "logprobs": True}
                   if variant == "bare_ids" else {})
    run, close = call_runner(v, mode, extra)
    run(warmup)
    v.flush()
    before = v.exported()
    collections = [0, 0, 0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    counter.start()
    run(calls)
    v.flush()
    counter.stop()
    gc.callbacks.remove(on_gc)
    spans = (v.exported() - before) / calls
    keys = None
    if isinstance(v.exporter, _Discard):
        from capture_overhead import _LAST_KEYS

        keys = _LAST_KEYS[0]
    close()
    v.close()
    print(json.dumps({"spans_per_call": spans, "gc": collections,
                      "ids": None if keys is None
                      else "agl_bridge.llm.prompt_token_ids" in keys}))


def count(python: str, variant: str, mode: str, calls: int, warmup: int, repeat: int,
          keep: str | None) -> dict:
    cmd = [python, str(HERE), "--worker", variant, "--mode", mode, "--calls", str(calls),
           "--warmup", str(warmup)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "AGL_BRIDGE_", "PYTHON"))}
    if variant in ("bare", "peer_bare", "bare_ids"):  # the patch is for instrumented ones
        env.pop("AGL_CALLGRIND_PATCH", None)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r, total, texts = run_counted(cmd, env)
    if r.returncode != 0:
        return {"variant": variant, "mode": mode, "repeat": repeat,
                "error": f"rc {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}"}
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (Path(keep) / f"{variant}-{mode}-{repeat}{'-' + str(i) if i else ''}.out"
             ).write_text(text)
    info = json.loads(r.stdout.strip().splitlines()[-1])
    return {"variant": variant, "mode": mode, "repeat": repeat, "per_call": total / calls,
            **info}


def _k(x: float) -> str:
    return f"{x / 1e3:,.0f}k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="bare,sdk_floor,ours_never,ours,peer")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per cell")
    ap.add_argument("--jobs", type=int, default=2, help="processes at once (counts do not "
                    "depend on the load)")
    ap.add_argument("--keep", help="keep the dumps here, for callgrind_annotate")
    ap.add_argument("--json", help="also write the per-process figures here")
    ap.add_argument("--no-bare", action="store_true", help="do not add the bare baseline")
    ap.add_argument("--worker")
    ap.add_argument("--mode")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.calls, args.warmup)
        return
    variants = args.variants.split(",")
    if "peer" in variants and "peer_bare" not in variants and not args.no_bare:
        variants.append("peer_bare")
    if (any(v in DEV_VARIANTS for v in variants) and "bare" not in variants
            and not args.no_bare):
        variants.insert(0, "bare")
    pythons = {v: sys.executable for v in DEV_VARIANTS}
    if any(v in PEER_VARIANTS for v in variants):
        sys.path.insert(0, str(HERE.parent))
        from capture_overhead import ensure_peer_venv

        peer, why = ensure_peer_venv(lambda m: print(m, file=sys.stderr, flush=True))
        if peer is None:
            print(f"peer NOT MEASURED: {why}", file=sys.stderr)
            variants = [v for v in variants if v not in PEER_VARIANTS]
        else:
            pythons.update({v: str(peer) for v in PEER_VARIANTS})
    modes = args.modes.split(",")
    jobs = [(v, m, r) for r in range(args.repeats) for v in variants for m in modes]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: count(pythons[j[0]], j[0], j[1], args.calls,
                                                args.warmup, j[2], args.keep), jobs))
    for r in results:
        if "error" in r:
            print(f"error: {r['variant']} {r['mode']}: {r['error']}", file=sys.stderr)
    cell: dict = {}
    for r in results:
        if "per_call" in r:
            cell.setdefault((r["variant"], r["mode"]), []).append(r)

    def med(v: str, m: str) -> float | None:
        rows = cell.get((v, m))
        return statistics.median(x["per_call"] for x in rows) if rows else None

    print(f"\ninstructions per call ({args.calls} counted calls after {args.warmup} warm-up, "
          f"{args.repeats} process(es) per cell, median [min..max]); added = variant - bare "
          f"of its venv; x floor = added / the SDK floor's added; us at "
          f"{NS_PER_INSTRUCTION} ns per instruction")
    for m in modes:
        floor = None
        if med("sdk_floor", m) is not None and med("bare", m) is not None:
            floor = med("sdk_floor", m) - med("bare", m)
        print(f"\n{m}:")
        print(f"  {'variant':<12}{'per call':>26}{'added':>28}{'~us':>8}{'x floor':>9}"
              f"{'spans':>7}  ids  gc runs")
        for v in variants:
            rows = cell.get((v, m))
            if not rows:
                print(f"  {v:<12}{'failed':>26}")
                continue
            xs = [x["per_call"] for x in rows]
            base = med(BARE_OF[v], m)
            spread = f"{_k(statistics.median(xs))} [{_k(min(xs))}..{_k(max(xs))}]"
            added = ratio = us = ""
            if base is not None and v != BARE_OF[v]:
                ds = [x - base for x in xs]
                d = statistics.median(ds)
                added = f"{_k(d)} [{_k(min(ds))}..{_k(max(ds))}]"
                us = f"{d * NS_PER_INSTRUCTION / 1e3:+.0f}"
                ratio = f"{d / floor:.2f}x" if floor else ""
            print(f"  {v:<12}{spread:>26}{added:>28}{us:>8}{ratio:>9}"
                  f"{rows[0]['spans_per_call']:>7.2f}  {str(rows[0]['ids'])[0]:<4} "
                  f"{rows[0]['gc']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "warmup": args.warmup,
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
