"""Instructions per agent-team step, counted by callgrind: timers do not resolve the integrations
on a shared 2-core machine, instruction counts repeat.

The steps are ``integration_overhead.py``'s (LangGraph: 2 ChatOpenAI nodes; AutoGen: a
RoundRobin of 2 agents, 2 turns; both answered by an in-process mock transport), each in three
modes, one fresh process per mode under ``valgrind --tool=callgrind --instr-atstart=no``:

* ``bare``: nothing instrumented (the provider with ``ScopeSpanProcessor`` and a discarding
  ``BatchSpanProcessor`` is installed in every mode, as ``AGL_BRIDGE_AUTO`` would);
* ``openai``: the OpenAI instrumentor alone (``token_ids="always"``);
* ``full``: the OpenAI instrumentor and the framework's integration.

After ``--warmup`` steps outside the count, instrumentation is switched on (a client request
through a tiny C helper built here with ``valgrind/callgrind.h``), ``--steps`` steps run with a
flush of the span queue after each (so export is counted), and the count is dumped. Per LLM call
(2 a step): (openai - bare) / 2 is the instrumentor's own cost, (full - openai) / 2 the
integration's on top. Instructions are converted to us in the README at a measured ns per
instruction; the counts are the figure.

    .venv/bin/python benchmarks/integration_callgrind.py [--frameworks autogen,langgraph]
        [--modes bare,openai,full] [--steps 20] [--warmup 5]

``AGL_CALLGRIND_PATCH=FILE`` runs a Python file in the instrumented workers before the steps
(to switch one piece off and count what it cost).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from callgrind_counts import Counter, run_counted


def worker(framework: str, mode: str, steps: int, warmup: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from discard_spans import install_discarding_provider
    from integration_overhead import _autogen_step, _langgraph_step

    counter = Counter()
    provider, Discard = install_discarding_provider()
    if mode in ("openai", "full"):
        from agl_bridge.integrations.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(token_ids="always")
    if mode == "full":
        if framework == "langgraph":
            from agl_bridge.integrations.langchain import LangChainInstrumentor as Integration
        else:
            from agl_bridge.integrations.autogen import AutoGenInstrumentor as Integration
        Integration().instrument()
    if os.environ.get("AGL_CALLGRIND_PATCH"):  # ablation: a file run here, e.g. a piece off
        exec(compile(Path(os.environ["AGL_CALLGRIND_PATCH"]).read_text(), "patch", "exec"), {})
    step = (_langgraph_step if framework == "langgraph" else _autogen_step)()
    for _ in range(warmup):
        step()
    provider.force_flush()
    before = Discard.spans
    collections = [0, 0, 0]  # the cyclic GC's runs per generation during the counted steps

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1
    gc.callbacks.append(on_gc)
    counter.start()
    for _ in range(steps):
        step()
        provider.force_flush()
    counter.stop()
    gc.callbacks.remove(on_gc)
    print(json.dumps({"spans_per_step": (Discard.spans - before) / steps, "gc": collections}))


def count(framework: str, mode: str, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", framework, "--mode", mode, "--steps",
           str(steps), "--warmup", str(warmup)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    if mode == "bare":  # the patch is for the instrumented modes
        env.pop("AGL_CALLGRIND_PATCH", None)
    env["PYTHONHASHSEED"] = "0"
    r, total, texts = run_counted(cmd, env)
    if r.returncode != 0:
        raise SystemExit(f"{framework}/{mode} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    if os.environ.get("AGL_CALLGRIND_KEEP"):  # for callgrind_annotate
        keep = Path(os.environ["AGL_CALLGRIND_KEEP"])
        keep.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (keep / f"{framework}-{mode}{'-' + str(i) if i else ''}.out").write_text(text)
    info = json.loads(r.stdout.strip().splitlines()[-1])
    return {"framework": framework, "mode": mode, "per_step": total / steps, **info}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", default="autogen,langgraph")
    ap.add_argument("--modes", default="bare,openai,full")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--worker")
    ap.add_argument("--mode")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.steps, args.warmup)
        return
    for fw in args.frameworks.split(","):
        modes = args.modes.split(",")
        with ThreadPoolExecutor(len(modes)) as pool:  # counts do not depend on the load
            rows = dict(zip(modes, pool.map(count, [fw] * len(modes), modes,
                                            [args.steps] * len(modes),
                                            [args.warmup] * len(modes))))
        for m, r in rows.items():
            print(f"{fw:<10}{m:<8}{r['per_step'] / 1e3:12,.0f}k instructions/step"
                  f"{r['spans_per_step']:8.1f} spans/step  gc runs by generation {r['gc']}",
                  flush=True)
        if "openai" in rows and "full" in rows:
            d = (rows["full"]["per_step"] - rows["openai"]["per_step"]) / 2
            print(f"{fw:<10}integration per LLM call: {d / 1e3:,.0f}k instructions")
        if "openai" in rows and "bare" in rows:
            d = (rows["openai"]["per_step"] - rows["bare"]["per_step"]) / 2
            print(f"{fw:<10}openai instrumentor per LLM call: {d / 1e3:,.0f}k instructions")


if __name__ == "__main__":
    main()
