"""What each framework integration adds per agent-team step, on top of the framework's own cost.

Three teams, each driven through the real framework with the model answering from a script:

* **LangGraph**: a two-node graph of ChatOpenAI agents, one ``invoke`` (2 LLM calls).
* **AutoGen** (autogen-agentchat 0.7): a RoundRobinGroupChat of two AssistantAgents, ``run``
  with two turns (2 LLM calls). The agents are created fresh for every run: an AssistantAgent
  keeps its conversation, so reusing them made every run send a longer history than the one
  before (the cost of a step grew run after run, and the on/off difference drowned in that
  drift: the "+-20%" of the first version of this script).
* **MassGen** 0.1.97 (in its own venv, ``.cache/venv-massgen``, built by
  ``tests/integrations/test_massgen_integration.py``: it pins openai 2.2.0): ``massgen.run`` of a
  2-agent team, 5 LLM calls (2 answers, 2 votes, 1 final presentation), worker
  ``benchmarks/overhead_massgen.py``; MassGen's pricing download is patched out as the test does.

LangGraph and AutoGen answer through an in-process mock transport (a vLLM-like JSON body), so
the network and a server do not drown the difference. MassGen builds its own openai client, so
it talks to ``tests/scripted_server.py`` (vLLM-like, streaming) over localhost, run in this
driver process: the server's CPU time is not in the worker's.

Method: fresh processes, in shuffled order across frameworks. Inside each, after warm-up of
both paths, ``pairs`` pairs of blocks of ``runs`` steps: one block with the integration on
(with the OpenAI instrumentor, ``token_ids="always"``, as ``AGL_BRIDGE_AUTO`` would switch on)
and one with everything off (``uninstrument()``), in random order per pair; each block starts
after a ``gc.collect()`` and ends with a flush, so it pays for exporting its own spans (to a
discarding exporter through a ``BatchSpanProcessor``). A process's figure is the median over
its pairs of (on - off), in process CPU time (all threads: the export thread counts); the
headline is the median over processes with [min..max]; wall-clock is printed too. The A/A
rows are the same method with both blocks off: the noise floor.

    .venv/bin/python benchmarks/integration_overhead.py [--quick] [--json PATH]
        [--processes N] [--frameworks langgraph,autogen,massgen]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MASSGEN_PYTHON = ROOT / ".cache" / "venv-massgen" / "bin" / "python"
MASSGEN_WORKER = Path(__file__).resolve().parent / "overhead_massgen.py"

RESPONSE = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": None,
                 "message": {"role": "assistant", "content": "five"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    "prompt_token_ids": None,
}

FRAMEWORKS = {  # name: (label, (pairs, runs per block) full, quick)
    "langgraph": ("LangGraph: 2 ChatOpenAI nodes, one invoke", (30, 10), (4, 10)),
    "autogen": ("AutoGen: RoundRobin of 2 agents, 2 turns", (30, 10), (4, 10)),
    "massgen": ("MassGen 0.1.97: massgen.run, 2 agents", (15, 2), (3, 2)),
}


def _respond(request):
    import httpx2

    body = json.loads(request.content)
    out = json.loads(json.dumps(RESPONSE))
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = list(range(12))
        out["choices"][0]["token_ids"] = [5, 6, 7]
    if body.get("logprobs"):
        out["choices"][0]["logprobs"] = {"content": [
            {"token": "x", "logprob": -0.5, "bytes": [], "top_logprobs": []}] * 3}
    return httpx2.Response(200, json=out)


def _langgraph_step():
    import httpx2
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    llm = ChatOpenAI(model="m", base_url="http://vllm.bench/v1", api_key="k", max_retries=0,
                     http_client=httpx2.Client(transport=httpx2.MockTransport(_respond)))

    class S(TypedDict):
        q: str
        a: str
        v: str

    g = StateGraph(S)
    g.add_node("solver", lambda s: {"a": llm.invoke(s["q"]).content})
    g.add_node("checker", lambda s: {"v": llm.invoke(s["a"]).content})
    g.add_edge(START, "solver")
    g.add_edge("solver", "checker")
    g.add_edge("checker", END)
    graph = g.compile()
    return lambda: graph.invoke({"q": "2+3?"})


def _autogen_step():
    import httpx2
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.teams import RoundRobinGroupChat
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = {"vision": False, "function_calling": True, "json_output": False,
            "family": "unknown", "structured_output": False}
    clients = [OpenAIChatCompletionClient(
        model="m", base_url="http://vllm.bench/v1", api_key="k", model_info=info,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(_respond)))
        for _ in range(2)]

    def run():
        # fresh agents per run: an AssistantAgent keeps its conversation across runs
        agents = [AssistantAgent(n, model_client=c)
                  for n, c in zip(("solver", "checker"), clients)]
        asyncio.run(RoundRobinGroupChat(agents, max_turns=2).run(task="2+3?"))
    return run


def worker(framework: str, pairs: int, runs: int, aa: bool) -> dict:
    """In one process: pairs of blocks on/off in random order; CPU and wall seconds per run."""

    from discard_spans import install_discarding_provider

    from agl_bridge.integrations.openai import OpenAIInstrumentor

    provider, Discard = install_discarding_provider()
    if framework == "langgraph":
        from agl_bridge.integrations.langchain import LangChainInstrumentor as Integration
        make_step = _langgraph_step
    else:
        from agl_bridge.integrations.autogen import AutoGenInstrumentor as Integration
        make_step = _autogen_step

    def set_on(on: bool) -> None:
        if on:
            OpenAIInstrumentor().instrument(token_ids="always")
            Integration().instrument()
        else:
            Integration().uninstrument()
            OpenAIInstrumentor().uninstrument()

    # A new step (clients, graph) after every switch, outside the timing: an openai client
    # first used while instrumented keeps emitting `chat` spans after uninstrument(), and one
    # first used before instrument() emits none (seen with ChatOpenAI), so reused clients made
    # the LangGraph "off" blocks pay for 2 chat spans per run.
    for on in (True, False):  # warm up both paths' imports and caches
        if on:
            set_on(True)
        step = make_step()
        for _ in range(5):
            step()
        if on:
            set_on(False)
    provider.force_flush()
    Discard.spans = 0
    out: dict = {"on_cpu": [], "off_cpu": [], "on_wall": [], "off_wall": []}
    spans = {True: 0, False: 0}  # exported in the blocks on / off (each block ends flushed)
    for _ in range(pairs):
        order = [True, False]
        random.shuffle(order)
        for on in order:
            instrumented = on and not aa
            if instrumented:
                set_on(True)
            step = make_step()
            step()  # the new clients' first call (lazy set-up) stays out of the timing
            provider.force_flush()
            gc.collect()
            before = Discard.spans
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(runs):
                step()
            provider.force_flush()
            side = "on" if on else "off"
            out[f"{side}_cpu"].append((time.process_time() - c0) / runs)
            out[f"{side}_wall"].append((time.perf_counter() - w0) / runs)
            spans[on] += Discard.spans - before
            if instrumented:
                set_on(False)
    out["spans_per_run"] = spans[True] / (runs * pairs)
    out["spans_per_bare_run"] = spans[False] / (runs * pairs)
    return out


def _massgen_call(name, **arguments):
    return {"id": f"call_{name}", "name": name, "arguments": json.dumps(arguments)}


def massgen_script(body):
    """As tests/integrations/test_massgen_integration.py: answer while no answer exists, then
    vote for agent1; the winner presents."""
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    text = json.dumps(body.get("messages"))
    if "vote" in tools:
        if "(no answers available yet)" in text:
            return "", [_massgen_call("new_answer", content="2 + 3 = 5")]
        return "", [_massgen_call("vote", agent_id="agent1", reason="agent1 shows the sum")]
    if "new_answer" in tools:
        return "", [_massgen_call("new_answer", content="The answer is 5.")]
    return "5", []


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(OPENAI_API_KEY="unused", LITELLM_LOCAL_MODEL_COST_MAP="True")
    return env


def run_process(framework: str, pairs: int, runs: int, aa: bool, base_url: str | None) -> dict:
    if framework == "massgen":
        cmd = [str(MASSGEN_PYTHON), str(MASSGEN_WORKER), base_url, "--pairs", str(pairs),
               "--runs", str(runs)]
    else:
        cmd = [sys.executable, __file__, "--worker", framework, "--pairs", str(pairs),
               "--runs", str(runs)]
    if aa:
        cmd.append("--aa")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=_clean_env(),
                         cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{framework} worker failed:\n{out.stdout[-1000:]}\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(framework=framework, aa=aa)
    for kind in ("cpu", "wall"):
        diffs = [a - b for a, b in zip(r[f"on_{kind}"], r[f"off_{kind}"])]
        r[f"added_{kind}"] = statistics.median(diffs)
        r[f"bare_{kind}"] = statistics.median(r[f"off_{kind}"])
        r[f"diffs_{kind}"] = diffs
    return r


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarize(results: list[dict], framework: str, aa: bool) -> dict | None:
    mine = [r for r in results if r["framework"] == framework and r["aa"] == aa]
    if not mine:
        return None
    cell: dict = {"processes": len(mine),
                  "spans_per_run": statistics.median(r["spans_per_run"] for r in mine),
                  "spans_per_bare_run": statistics.median(r["spans_per_bare_run"] for r in mine)}
    for kind in ("cpu", "wall"):
        added = [r[f"added_{kind}"] for r in mine]
        pooled = [d for r in mine for d in r[f"diffs_{kind}"]]
        bare = statistics.median(r[f"bare_{kind}"] for r in mine)
        cell[kind] = {"bare": bare, "added": statistics.median(added), "min": min(added),
                      "max": max(added), "pairs": len(pooled),
                      "pair_p10": _q(pooled, 0.1), "pair_p90": _q(pooled, 0.9),
                      "added_pct": 100 * statistics.median(added) / bare}
    return cell


def _us(x: float) -> str:
    return f"{x * 1e6:+,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--processes", type=int, help="fresh processes per row (default 5, quick 2)")
    ap.add_argument("--frameworks", default="langgraph,autogen,massgen")
    ap.add_argument("--no-aa", action="store_true", help="skip the A/A control rows")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--runs", type=int)
    ap.add_argument("--aa", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.pairs, args.runs, args.aa)))
        return
    processes = args.processes or (2 if args.quick else 5)
    frameworks = [f for f in args.frameworks.split(",") if f]
    notes = []
    if "massgen" in frameworks and not MASSGEN_PYTHON.exists():
        frameworks.remove("massgen")
        notes.append(f"MassGen NOT MEASURED: no {MASSGEN_PYTHON} (run "
                     "tests/integrations/test_massgen_integration.py once to build it)")
    jobs = [(f, aa) for f in frameworks for aa in ((False,) if args.no_aa else (False, True))]

    def shape(f):
        pairs, runs = FRAMEWORKS[f][2 if args.quick else 1]
        return args.pairs or pairs, args.runs or runs

    sys.path.insert(0, str(ROOT))  # tests.scripted_server
    from tests.scripted_server import ScriptedServer

    load_start = os.getloadavg()[0]
    t_start = time.monotonic()
    results = []
    with ScriptedServer(vllm=True, script=massgen_script, completion_ids=[21, 22]) as server:
        for rnd in range(processes):
            order = jobs[:]
            random.shuffle(order)
            for f, aa in order:
                results.append(run_process(f, *shape(f), aa, server.base_url))
            print(f"round {rnd + 1}/{processes} done ({time.monotonic() - t_start:.0f} s)",
                  file=sys.stderr, flush=True)
    import platform

    meta = {"processes": processes, "shape": {f: shape(f) for f in frameworks},
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                       f"{platform.python_version()}, load avg {load_start:.1f} at start, "
                       f"{os.getloadavg()[0]:.1f} at end",
            "seconds": round(time.monotonic() - t_start)}
    summary = {f"{f}{' A/A' if aa else ''}": summarize(results, f, aa) for f, aa in jobs}
    print(f"\nadded per agent-team step: {processes} fresh processes per row; each alternates "
          "pairs of blocks on/off (random order per pair); median over processes [min..max] of "
          "each process's median paired difference; p10..p90 over all pairs")
    print(f"machine: {meta['machine']}; {meta['seconds']} s")
    print(f"{'row':<48}{'pairs x runs':>13}{'bare CPU ms':>12}{'added CPU us':>26}"
          f"{'%':>7}{'pairs p10..p90':>20}{'bare wall ms':>13}{'added wall us':>15}"
          f"{'spans on/off':>13}")
    for f, aa in jobs:
        c = summary[f"{f}{' A/A' if aa else ''}"]
        cpu, wall = c["cpu"], c["wall"]
        label = f"A/A control ({f}: both blocks off)" if aa else FRAMEWORKS[f][0]
        p, r = meta["shape"][f]
        added = f"{_us(cpu['added'])} [{_us(cpu['min'])}..{_us(cpu['max'])}]"
        spread = f"{_us(cpu['pair_p10'])}..{_us(cpu['pair_p90'])}"
        spans = f"{c['spans_per_run']:.1f}/{c['spans_per_bare_run']:.1f}"
        print(f"{label:<48}{f'{p} x {r}':>13}{cpu['bare'] * 1e3:12.2f}{added:>26}"
              f"{cpu['added_pct']:+7.1f}{spread:>20}{wall['bare'] * 1e3:13.2f}"
              f"{_us(wall['added']):>15}{spans:>13}")
    for n in notes:
        print(n)
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "integration_overhead",
                                               "meta": meta, "notes": notes,
                                               "summary": summary, "processes": results},
                                              indent=1))


if __name__ == "__main__":
    main()
