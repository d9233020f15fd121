"""What each framework integration adds per agent step, on top of the framework's own cost.

For LangGraph (a two-node graph of ChatOpenAI agents, one ``invoke``) and AutoGen (a
RoundRobinGroupChat of two AssistantAgents, ``run`` with two turns), each in fresh processes:
blocks of runs alternate between the integration on (with the OpenAI instrumentor, as
``AGL_BRIDGE_AUTO`` would switch on) and everything off, and the figure is the added process
CPU time per run (export thread included: spans go to a discarding exporter, flushed per block).
The model answers through an in-process mock transport (a vLLM-like JSON body), so the network
and a server do not drown the difference. MassGen runs in its own venv (it pins openai 2.2.0)
and is not measured here; the Flow API is a few spans per task.

    .venv/bin/python benchmarks/integration_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

RESPONSE = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": None,
                 "message": {"role": "assistant", "content": "five"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    "prompt_token_ids": None,
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

    def client():
        return OpenAIChatCompletionClient(
            model="m", base_url="http://vllm.bench/v1", api_key="k", model_info=info,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(_respond)))

    agents = [AssistantAgent(n, model_client=client()) for n in ("solver", "checker")]

    def run():
        team = RoundRobinGroupChat(agents, max_turns=2)
        asyncio.run(team.run(task="2+3?"))
    return run


def worker(framework: str, runs: int, blocks: int) -> dict:
    """In one process: alternate blocks with the integration on and off; CPU seconds per run."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from agl_bridge.integrations.openai import OpenAIInstrumentor
    from agl_bridge.otel.processors import ScopeSpanProcessor

    class Discard(SpanExporter):
        spans = 0

        def export(self, spans):
            Discard.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(ScopeSpanProcessor())
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)
    if framework == "langgraph":
        from agl_bridge.integrations.langchain import LangChainInstrumentor as Integration
        step = _langgraph_step()
    else:
        from agl_bridge.integrations.autogen import AutoGenInstrumentor as Integration
        step = _autogen_step()
    for _ in range(3):
        step()  # warm up both paths' imports and caches
    on, off = [], []
    for b in range(blocks):
        instrumented = b % 2 == 0
        if instrumented:
            OpenAIInstrumentor().instrument(token_ids="always")
            Integration().instrument()
        t0 = time.process_time()
        for _ in range(runs):
            step()
        provider.force_flush()
        (on if instrumented else off).append((time.process_time() - t0) / runs)
        if instrumented:
            Integration().uninstrument()
            OpenAIInstrumentor().uninstrument()
    return {"on": statistics.median(on), "off": statistics.median(off),
            "spans_per_run": Discard.spans / (runs * len(on))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--processes", type=int, default=5)
    args = ap.parse_args()
    runs, blocks = (10, 4) if args.quick else (30, 6)
    if args.worker:
        print(json.dumps(worker(args.worker, runs, blocks)))
        return
    processes = 2 if args.quick else args.processes
    print(f"added CPU per agent-team step (median over {processes} fresh processes; each "
          f"alternates {blocks} blocks of {runs} runs on/off)")
    print(f"{'framework':<44}{'bare ms':>9}{'added us':>10}{'added %':>9}{'spans/run':>11}")
    for framework, label in (("langgraph", "LangGraph: 2 ChatOpenAI nodes, one invoke"),
                             ("autogen", "AutoGen: RoundRobin of 2 agents, 2 turns")):
        results = []
        for _ in range(processes):
            out = subprocess.run([sys.executable, __file__, "--worker", framework],
                                 capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise SystemExit(f"{framework} worker failed:\n{out.stderr[-2000:]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        bare = statistics.median(r["off"] for r in results)
        added = statistics.median(r["on"] - r["off"] for r in results)
        spans = statistics.median(r["spans_per_run"] for r in results)
        print(f"{label:<44}{bare * 1e3:9.2f}{added * 1e6:10.0f}{100 * added / bare:9.1f}"
              f"{spans:11.1f}")


if __name__ == "__main__":
    main()
