"""MassGen worker for ``integration_overhead.py``: runs inside MassGen's own venv.

MassGen 0.1.97 pins openai 2.2.0, so it cannot share the dev venv; ``integration_overhead.py`` runs
this file with ``.cache/venv-massgen/bin/python`` (built by
``tests/integrations/test_massgen_integration.py``) against a scripted vLLM-like server that it runs
in its own process (so the server's CPU time is not in ours). One process: warm up, then ``pairs``
pairs of blocks of ``runs`` ``massgen.run`` calls (a 2-agent team: 2 answers, 2 votes, 1 final
presentation = 5 LLM calls), one block with the integration on (MassGen + OpenAI instrumentors, as
``AGL_BRIDGE_AUTO`` switches on) and one with everything off, in random order per pair. With
``--aa`` both blocks are off: the A/A control. Prints one JSON line: per-pair CPU and wall seconds
per run for each side, and spans exported per run.

    .cache/venv-massgen/bin/python benchmarks/overhead_massgen.py BASE_URL [--pairs N] [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--aa", action="store_true", help="A/A control: both blocks off")
    ap.add_argument("--fresh-tls", action="store_true",
                    help="let every httpx client load the CA bundle again (MassGen's own way)")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.chdir(tempfile.mkdtemp(prefix="massgen-bench-"))  # MassGen writes ./.massgen

    import massgen
    from massgen.token_manager.token_manager import TokenCostCalculator

    from agl_bridge.integrations.massgen import MassGenInstrumentor
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    # No network here: MassGen would try to download a pricing file after every LLM call.
    TokenCostCalculator._fetch_litellm_pricing = lambda self: None
    if not args.fresh_tls:
        # MassGen builds new AsyncOpenAI clients on every run, and each httpx transport loads
        # certifi's CA bundle into a new TLS context: about 27 ms of CPU per client, half of a
        # run's CPU and its most variable part, though the server is plain HTTP. One context
        # is built once and shared, in both blocks alike, so the difference is not drowned.
        import httpx._transports.default as transports

        make_context, shared = transports.create_ssl_context, {}

        def create_ssl_context(verify=True, cert=None, trust_env=True):
            if verify is not True or cert is not None:
                return make_context(verify=verify, cert=cert, trust_env=trust_env)
            if trust_env not in shared:
                shared[trust_env] = make_context(verify=True, trust_env=trust_env)
            return shared[trust_env]

        transports.create_ssl_context = create_ssl_context
    logging.disable(logging.WARNING)

    from discard_spans import install_discarding_provider

    provider, Discard = install_discarding_provider()

    config = {"agents": [
        {"id": agent, "backend": {"type": "chatcompletion", "model": f"m-{agent}",
                                  "base_url": args.base_url}}
        for agent in ("agent_a", "agent_b")]}

    def one() -> None:
        result = asyncio.run(massgen.run(query="What is 2+3?", config_dict=config))
        if result.get("selected_agent") != "agent_a":  # a failed backend still returns
            raise SystemExit(f"massgen run failed: {result}")

    def set_on(on: bool) -> None:
        if on:
            OpenAIInstrumentor().instrument(token_ids="always")
            MassGenInstrumentor().instrument()
        else:
            MassGenInstrumentor().uninstrument()
            OpenAIInstrumentor().uninstrument()

    for on in (True, False):  # warm both paths
        if on:
            set_on(True)
        for _ in range(args.warmup):
            one()
        if on:
            set_on(False)
    provider.force_flush()
    Discard.spans = 0

    on_cpu, off_cpu, on_wall, off_wall, sequence = [], [], [], [], []
    spans = {True: 0, False: 0}  # exported in the blocks on / off (each block ends flushed)
    for _ in range(args.pairs):
        order = [True, False]
        random.shuffle(order)
        for on in order:
            instrumented = on and not args.aa
            if instrumented:
                set_on(True)
            gc.collect()
            before = Discard.spans
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.runs):
                one()
            provider.force_flush()  # each block pays for exporting its own spans
            cpu = (time.process_time() - c0) / args.runs
            wall = (time.perf_counter() - w0) / args.runs
            spans[on] += Discard.spans - before
            if instrumented:
                set_on(False)
            sequence.append([on, round(cpu, 6)])
            (on_cpu if on else off_cpu).append(cpu)
            (on_wall if on else off_wall).append(wall)
    print(json.dumps({"on_cpu": on_cpu, "off_cpu": off_cpu, "on_wall": on_wall,
                      "off_wall": off_wall, "sequence": sequence,
                      "spans_per_run": spans[True] / (args.runs * args.pairs),
                      "spans_per_bare_run": spans[False] / (args.runs * args.pairs)}))


if __name__ == "__main__":
    main()
