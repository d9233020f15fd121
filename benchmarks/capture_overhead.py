"""Added microseconds per ``client.chat.completions.create``: ours side by side with the peer.

What it measures and why: the capture instrumentor sits on every LLM call an agent makes, so
its cost is paid once per call in production. This script times ``chat.completions.create``
(sync, async and ``stream=True``) against an in-process mock server and prints the bare call's
own cost and what each variant adds to it:

* ``bare``: no instrumentation, in the dev venv and in the peer's venv. Its "added" row is an
  A/A control (bare against bare, same method): the noise floor of the measurement;
* ``SDK floor``: the bare call wrapped by hand in one SDK span with 8 ``gen_ai.*`` attributes,
  the least any tracing instrumentor can cost;
* ``ours``: ``agl_bridge``'s ``OpenAIInstrumentor().instrument(token_ids="always")`` exporting
  to a discarding exporter, then to our ``ParquetSpanExporter`` in a temp dir (behind the
  processor capture builds, which exports at least every 200 ms; and, as ``ours_parquet_5s``,
  behind the SDK's default 5 s delay that capture used before: what durability costs), and with
  ``token_ids="never"`` (the same span without asking the server for ids and logprobs, whose
  response is then several times smaller: the difference is what recording ids costs);
* ``peer``: ``opentelemetry-instrumentation-openai-v2`` 2.4b0 (the OpenTelemetry project's own
  OpenAI instrumentation, default settings), installed by this script in its own venv
  ``.cache/bench-peer-venv`` with the same openai / httpx2 / pydantic / opentelemetry versions
  as the dev venv (never in the dev venv: an instrumentation package there once downgraded
  opentelemetry-api). The peer does not ask for token ids, so its server response is the small
  one: compare it with ``ours, token_ids=never`` for like-for-like work.

Every span goes through a ``TracerProvider`` + ``BatchSpanProcessor``, as in production.

The mock transport (``httpx2.MockTransport``) answers like vLLM 0.32: ``prompt_token_ids``
top-level and ``choices[i].token_ids`` (lists when the request has ``return_token_ids``, null
otherwise), ``logprobs.content`` when the request asks ``logprobs``, and for streams Server-Sent
Events (a role chunk carrying ``prompt_token_ids``, one chunk per token, ``[DONE]``).

Method. Each (variant, mode) runs in fresh subprocesses (at least 5, in shuffled order). Inside
a process, blocks of calls alternate between instrumented and not (``instrument()`` /
``uninstrument()``, the order within each pair drawn at random), and the process's "added" figure
is the median over pairs of (instrumented block - bare block): the two blocks of a pair run
seconds apart, so the load of other work on this shared machine hits both alike, which
comparing separate processes cannot achieve. Every block starts with an empty span queue and
ends with a flush, so it pays for exporting exactly the spans it produced (the batch exporter
runs every 512 spans). Two figures per block: CPU time of the whole process per call
(``time.process_time``: all threads, so the export thread's work counts) and wall-clock time per
call. The table prints, per variant, the median over processes with the min..max. After timing,
spans exported per call are counted for the instrumented blocks (``0`` = not traced, printed as
"not traced" rather than a figure) and for the bare blocks (must be 0: uninstrument worked).

Run: ``.venv/bin/python benchmarks/capture_overhead.py [--quick] [--json PATH]``. The first run
creates the peer's venv (about half a minute, needs PyPI); ``--quick`` (one process per variant
for all three modes, 4 short pairs of blocks) takes under a minute after that.
"""


from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
PEER_VENV = REPO / ".cache" / "bench-peer-venv"
PEER_PACKAGE = "opentelemetry-instrumentation-openai-v2"
PEER_VERSION = "2.4b0"
# 2.4b0 imports httpx and needs the older util-genai to work with openai 3.x (field notes)
PEER_EXTRA = ["opentelemetry-util-genai==1.1b0", "httpx"]
# same versions as the dev venv, so the comparison is of the instrumentors alone
PINNED_FROM_DEV = ["openai", "httpx2", "pydantic", "opentelemetry-api", "opentelemetry-sdk",
                   "opentelemetry-instrumentation", "wrapt"]

MODES = ("sync", "async", "stream")
PROMPT_IDS = 200  # prompt length in tokens
COMPLETION_IDS = 16  # completion length: 16 tokens, so a stream is 16 token chunks
MODEL = "policy"
MESSAGES = [{"role": "system", "content": "You are the solver of a two-agent team."},
            {"role": "user", "content": "What is 17 + 25? Answer with the number only."}]

# variant -> (venv, label)
VARIANTS = {
    "bare": ("dev", "bare (A/A control, dev venv)"),
    "sdk_floor": ("dev", "SDK floor: 1 span + 8 gen_ai attrs"),
    "ours": ("dev", "ours, token_ids=always, discard exporter"),
    "ours_parquet": ("dev", "ours, token_ids=always, ParquetSpanExporter"),
    "ours_parquet_5s": ("dev", "same, SDK default 5 s batch delay (before)"),
    "ours_never": ("dev", "ours, token_ids=never, discard exporter"),
    "peer_bare": ("peer", "bare (A/A control, peer venv)"),
    "peer": ("peer", f"peer: otel-instrumentation-openai-v2 {PEER_VERSION}"),
}
BARE_OF = {"dev": "bare", "peer": "peer_bare"}


# ---------------------------------------------------------------------------------------------
# worker side: runs in a fresh process, in the dev venv or the peer's venv
# ---------------------------------------------------------------------------------------------
def _logprob_entries(ids: list[int], start: int = 0) -> list[dict]:
    return [{"token": f"t{t}", "logprob": -0.5 - 0.01 * (start + i), "bytes": [116, 49],
             "top_logprobs": []} for i, t in enumerate(ids)]


def _completion_body(want_ids: bool, want_lp: bool) -> bytes:
    prompt = list(range(1000, 1000 + PROMPT_IDS))
    completion = list(range(2000, 2000 + COMPLETION_IDS))
    choice = {"index": 0, "message": {"role": "assistant", "content": "42" + " ok" * 14,
                                      "refusal": None, "annotations": None, "audio": None,
                                      "function_call": None, "tool_calls": [],
                                      "reasoning_content": None},
              "logprobs": {"content": _logprob_entries(completion)} if want_lp else None,
              "finish_reason": "stop", "stop_reason": None,
              "token_ids": completion if want_ids else None}
    body = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": PROMPT_IDS, "total_tokens": PROMPT_IDS + COMPLETION_IDS,
                      "completion_tokens": COMPLETION_IDS, "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": prompt if want_ids else None,
            "kv_transfer_params": None}
    return json.dumps(body).encode()


def _stream_body(want_ids: bool, want_lp: bool) -> bytes:
    prompt = list(range(1000, 1000 + PROMPT_IDS))
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": MODEL}
    events = [dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                   "logprobs": None, "finish_reason": None}],
                   prompt_token_ids=prompt if want_ids else None, prompt_text=None)]
    for k in range(COMPLETION_IDS):
        token = [2000 + k]
        choice = {"index": 0, "delta": {"content": "42" if k == 0 else " ok"},
                  "logprobs": {"content": _logprob_entries(token, k)} if want_lp else None,
                  "finish_reason": None, "token_ids": token if want_ids else None}
        chunk = dict(head, choices=[choice])
        if k == COMPLETION_IDS - 1:
            choice["finish_reason"] = "stop"
            choice["stop_reason"] = None
            chunk["system_fingerprint"] = None
        events.append(chunk)
    lines = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return b"".join(lines) + b"data: [DONE]\n\n"


def _mock_transport():
    import httpx2

    cache: dict[tuple[bool, bool, bool], bytes] = {}
    json_headers = {"content-type": "application/json"}
    sse_headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    def handler(request):
        body = json.loads(request.content)
        key = (bool(body.get("return_token_ids")), bool(body.get("logprobs")),
               bool(body.get("stream")))
        data = cache.get(key)
        if data is None:
            data = cache[key] = (_stream_body if key[2] else _completion_body)(key[0], key[1])
        return httpx2.Response(200, headers=sse_headers if key[2] else json_headers,
                               content=data)

    return httpx2.MockTransport(handler)


_LAST_KEYS: list = [None]  # attribute keys of the last span the discard exporter saw


def _last_keys_have_ids() -> bool | None:
    keys = _LAST_KEYS[0]
    return None if keys is None else "agl_bridge.llm.prompt_token_ids" in keys


class _Discard:
    """Exporter that drops spans but counts them and keeps the last one's attribute keys."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._ok = SpanExportResult.SUCCESS
        self.count = 0

    def export(self, spans):
        if spans:
            _LAST_KEYS[0] = list(spans[-1].attributes or {})
        self.count += len(spans)
        return self._ok

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class _Variant:
    """The variant's instrumentation, switchable on and off inside one process."""

    def __init__(self, variant: str, tmp: str) -> None:
        self.variant = variant
        self.provider = self.exporter = self.tracer = None
        self.floor = False  # sdk_floor: wrap calls by hand while on
        self._inst = None
        self._inst_kwargs: dict = {}
        if variant in ("bare", "peer_bare"):
            return
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
        if variant in ("ours_parquet", "ours_parquet_5s"):
            from agl_bridge.otel.parquet_exporter import ParquetSpanExporter
            from agl_bridge.otel.setup import _processor

            self.exporter = ParquetSpanExporter(tmp)
            self._count_exports(self.exporter)
            # ours_parquet: the processor capture builds (exports at least every 200 ms, the
            # durability bound); ours_parquet_5s: the SDK default it used before
            processor = (_processor(self.exporter, batch=True) if variant == "ours_parquet"
                         else BatchSpanProcessor(self.exporter))
        else:
            self.exporter = _Discard()
            processor = BatchSpanProcessor(self.exporter)
        self.provider.add_span_processor(processor)
        trace.set_tracer_provider(self.provider)
        if variant == "sdk_floor":
            self.tracer = self.provider.get_tracer("bench.sdk_floor")
        elif variant in ("ours", "ours_parquet", "ours_parquet_5s", "ours_never"):
            from agl_bridge.integrations.openai import OpenAIInstrumentor

            self._inst = OpenAIInstrumentor()
            self._inst_kwargs = {"token_ids": "never" if variant == "ours_never" else "always"}
        elif variant == "peer":
            from opentelemetry.instrumentation.openai_v2 import (
                OpenAIInstrumentor as PeerInstrumentor,
            )

            self._inst = PeerInstrumentor()
        else:
            raise SystemExit(f"unknown variant {variant}")

    def _count_exports(self, exporter) -> None:
        """Count the spans handed to ``exporter.export`` (the Parquet exporter's own counter
        only counts rows once they reach a Parquet file, at rotation)."""
        self.parquet_count = 0
        export = exporter.export

        def counting(spans):
            self.parquet_count += len(spans)
            return export(spans)

        exporter.export = counting

    def set(self, on: bool) -> None:
        if self.tracer is not None:
            self.floor = on
        elif self._inst is not None and on != self._inst.is_instrumented_by_opentelemetry:
            if on:
                self._inst.instrument(tracer_provider=self.provider, **self._inst_kwargs)
            else:
                self._inst.uninstrument()

    def flush(self) -> None:
        if self.provider is not None:
            self.provider.force_flush()

    def exported(self) -> int:
        if self.provider is None:
            return 0
        self.provider.force_flush()
        if isinstance(self.exporter, _Discard):
            return self.exporter.count
        return self.parquet_count

    def close(self) -> None:
        self.set(False)
        if self.provider is not None:
            self.provider.shutdown()


def _floor_sync(tracer, client, stream: bool):
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span(f"chat {MODEL}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": MODEL, "gen_ai.request.temperature": 0.7,
            "gen_ai.request.max_tokens": 64}) as span:
        # ``stream`` only when true, as the bare call passes it: an explicit ``stream=False``
        # costs the SDK's request transform about 150k instructions a call (capture_callgrind)
        result = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0.7,
                                                max_tokens=64, **({"stream": True} if stream
                                                                  else {}))
        if stream:
            last = None
            for last in result:  # noqa: B007 - drain the stream, keep its last chunk
                pass
            result = last
        span.set_attribute("gen_ai.response.id", result.id)
        span.set_attribute("gen_ai.response.model", result.model)
        span.set_attribute("gen_ai.response.finish_reasons", [result.choices[0].finish_reason])


async def _floor_async(tracer, client):
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span(f"chat {MODEL}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": MODEL, "gen_ai.request.temperature": 0.7,
            "gen_ai.request.max_tokens": 64}) as span:
        result = await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                      temperature=0.7, max_tokens=64)
        span.set_attribute("gen_ai.response.id", result.id)
        span.set_attribute("gen_ai.response.model", result.model)
        span.set_attribute("gen_ai.response.finish_reasons", [result.choices[0].finish_reason])


def call_runner(v: _Variant, mode: str, extra: dict | None = None
                ) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(run(n): n calls of ``mode`` through the variant's client or floor, close). ``extra``:
    more ``create()`` keyword arguments (``capture_callgrind.py``'s ``bare_ids``)."""
    import httpx2
    import openai

    kw = extra or {}
    if mode == "async":
        client = openai.AsyncOpenAI(api_key="x", base_url="http://mock.local/v1", max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=_mock_transport()))

        async def block(n: int) -> None:
            for _ in range(n):
                if v.floor:
                    await _floor_async(v.tracer, client)
                else:
                    await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                         temperature=0.7, max_tokens=64, **kw)

        loop = asyncio.new_event_loop()

        def run_async(n: int) -> None:
            loop.run_until_complete(block(n))
        return run_async, loop.close
    stream = mode == "stream"
    client = openai.OpenAI(api_key="x", base_url="http://mock.local/v1", max_retries=0,
                           http_client=httpx2.Client(transport=_mock_transport()))

    def run(n: int) -> None:
        create = client.chat.completions.create
        for _ in range(n):
            if v.floor:
                _floor_sync(v.tracer, client, stream)
            elif stream:
                for _ in create(model=MODEL, messages=MESSAGES, temperature=0.7, max_tokens=64,
                                stream=True, **kw):
                    pass
            else:
                create(model=MODEL, messages=MESSAGES, temperature=0.7, max_tokens=64, **kw)
    return run, lambda: None


def _time_mode(v: _Variant, mode: str, calls: int, pairs: int, warmup: int) -> dict:
    """``pairs`` pairs of blocks of ``calls`` calls, one block bare and one instrumented, in
    random order within each pair."""
    perf, cpu = time.perf_counter_ns, time.process_time_ns
    phases: dict[bool, list[tuple[float, float]]] = {False: [], True: []}  # (cpu us, wall us)
    spans = {False: 0, True: 0}
    run, close = call_runner(v, mode)
    for on in (False, True):
        v.set(on)
        run(warmup)
    v.flush()
    for _ in range(pairs):
        order = [False, True]
        random.shuffle(order)
        for on in order:
            v.set(on)
            before = v.exported()
            c0, w0 = cpu(), perf()
            run(calls)
            v.flush()
            c1, w1 = cpu(), perf()
            spans[on] += v.exported() - before
            phases[on].append(((c1 - c0) / calls / 1e3, (w1 - w0) / calls / 1e3))
    close()
    on_, off = phases[True], phases[False]
    return {
        "variant": v.variant, "mode": mode, "calls_per_block": calls, "pairs": pairs,
        "bare_cpu_us": statistics.median(c for c, _ in off),
        "bare_wall_us": statistics.median(w for _, w in off),
        "on_cpu_us": statistics.median(c for c, _ in on_),
        "on_wall_us": statistics.median(w for _, w in on_),
        "added_cpu_us": statistics.median(a[0] - b[0] for a, b in zip(on_, off)),
        "added_wall_us": statistics.median(a[1] - b[1] for a, b in zip(on_, off)),
        "blocks": {"bare": off, "instrumented": on_},
        "spans_per_call": spans[True] / (calls * pairs) if v.provider is not None else None,
        "spans_per_bare_call": spans[False] / (calls * pairs) if v.provider is not None else None,
        "ids_recorded": None,
    }


def worker(variant: str, modes: list[str], calls: int, stream_calls: int, pairs: int,
           warmup: int) -> list[dict]:
    tmp = tempfile.mkdtemp(prefix="agl-bench-capture-")
    v = _Variant(variant, tmp)
    out = []
    try:
        for mode in modes:
            _LAST_KEYS[0] = None
            r = _time_mode(v, mode, stream_calls if mode == "stream" else calls, pairs, warmup)
            r["ids_recorded"] = _last_keys_have_ids()
            out.append(r)
    finally:
        v.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# driver side: dev venv
# ---------------------------------------------------------------------------------------------
def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGL_BRIDGE_", "OTEL_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def ensure_peer_venv(log) -> tuple[Path | None, str]:
    """(python of the peer venv, description) or (None, why it is unavailable)."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for name in PINNED_FROM_DEV:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pins.append(name)
    spec = sorted(pins + [f"{PEER_PACKAGE}=={PEER_VERSION}", *PEER_EXTRA])
    python = PEER_VENV / "bin" / "python"
    marker = PEER_VENV / ".bench-ready.json"
    if python.exists() and marker.exists():
        try:
            if json.loads(marker.read_text()).get("spec") == spec:
                return python, f"{PEER_VENV.relative_to(REPO)} (reused)"
        except ValueError:
            pass
    log(f"creating the peer venv {PEER_VENV} ({' '.join(spec)}) ...")
    if PEER_VENV.exists():
        shutil.rmtree(PEER_VENV)
    steps = [
        [sys.executable, "-m", "venv", str(PEER_VENV)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *spec],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "-e", str(REPO)],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), cwd=REPO)
        if r.returncode != 0:
            tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-3:])[-300:]
            return None, f"`{' '.join(cmd[2:5])} ...` failed (rc {r.returncode}): {tail}"
    r = subprocess.run([str(python), "-c", "import opentelemetry.instrumentation.openai_v2, "
                        "openai, httpx2"], capture_output=True, text=True, env=_clean_env())
    if r.returncode != 0:
        return None, "installed but not importable: " + r.stderr.strip().splitlines()[-1]
    marker.write_text(json.dumps({"spec": spec}))
    return python, f"{PEER_VENV.relative_to(REPO)} (created)"


def run_worker(python: Path, variant: str, modes: list[str], calls: int, stream_calls: int,
               pairs: int, warmup: int) -> list[dict]:
    cmd = [str(python), str(HERE), "--worker", variant, ",".join(modes), str(calls),
           str(stream_calls), str(pairs), str(warmup)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), cwd=REPO,
                       timeout=900)
    lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
    if r.returncode != 0 or not lines:
        err = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return [{"variant": variant, "mode": m, "error": f"rc {r.returncode}: {err}"}
                for m in modes]
    return json.loads(lines[-1])


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.0f}" if signed else f"{x:.0f}"


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(results: list[dict], variants: list[str]) -> dict:
    """Per variant and mode: each per-process figure's median and min..max over processes."""
    out: dict = {}
    keys = ("bare_cpu_us", "bare_wall_us", "on_cpu_us", "on_wall_us", "added_cpu_us",
            "added_wall_us")
    for v in variants:
        out[v] = {}
        for mode in MODES:
            mine = [r for r in results if r["variant"] == v and r["mode"] == mode]
            ok = [r for r in mine if "error" not in r]
            cell: dict = {"processes": len(ok),
                          "errors": sorted({r["error"] for r in mine if "error" in r})}
            if ok:
                for key in keys:
                    cell[key] = _spread([r[key] for r in ok])
                spc = [r["spans_per_call"] for r in ok if r["spans_per_call"] is not None]
                off = [r["spans_per_bare_call"] for r in ok
                       if r["spans_per_bare_call"] is not None]
                cell["spans_per_call"] = statistics.median(spc) if spc else None
                cell["spans_per_bare_call"] = max(off) if off else None
                cell["traced"] = None if not spc else cell["spans_per_call"] > 0.5
                ids = [r["ids_recorded"] for r in ok if r.get("ids_recorded") is not None]
                cell["ids_recorded"] = all(ids) if ids else None
            out[v][mode] = cell
    return out


def _span(d: dict, signed: bool = False) -> str:
    return f"{_fmt(d['median'], signed)} [{_fmt(d['min'], signed)}..{_fmt(d['max'], signed)}]"


def print_table(summary: dict, variants: list[str], peer_note: str, meta: dict) -> None:
    w, cw = 46, 22
    print()
    print(f"capture overhead per chat.completions.create: {meta['rounds']} fresh processes per "
          f"cell ({meta['process_per']}), each {meta['pairs']} pairs of blocks (bare, "
          f"instrumented) of {meta['calls']} calls after {meta['warmup']} warm-up; prompt "
          f"{PROMPT_IDS} ids, completion {COMPLETION_IDS} tokens, stream = {COMPLETION_IDS} "
          f"token chunks; every block ends with a flush, so it pays for its spans' export")
    print(f"machine: {meta['machine']}")
    print(f"\n{'bare call, us per call (median [min..max])':{w}}"
          + "".join(f"{m + ' CPU':>{cw}}{m + ' wall':>{cw}}" for m in MODES))
    for v in variants:
        if v not in BARE_OF.values():
            continue
        row = ""
        for mode in MODES:
            c = summary[v][mode]
            row += (f"{_span(c['bare_cpu_us']):>{cw}}{_span(c['bare_wall_us']):>{cw}}"
                    if c["processes"] else f"{'failed':>{cw}}{'':>{cw}}")
        print(f"{VARIANTS[v][1]:{w}}" + row)
    for metric, title in (("added_cpu_us", "added CPU us per call (process CPU time, all "
                                           "threads)"),
                          ("added_wall_us", "added wall-clock us per call")):
        print(f"\n{title}: per process the median over pairs of (instrumented - bare); "
              f"median [min..max] over processes")
        print(f"{'':{w}}" + "".join(f"{m:>{cw}}" for m in MODES))
        for v in variants:
            row = ""
            for mode in MODES:
                c = summary[v][mode]
                if not c["processes"]:
                    cell = "failed"
                elif c.get("traced") is False:
                    cell = "not traced"
                else:
                    cell = _span(c[metric], True)
                row += f"{cell:>{cw}}"
            print(f"{VARIANTS[v][1]:{w}}" + row)
        if peer_note:
            print(f"{'peer: ' + PEER_PACKAGE:{w}}{peer_note}")
    print("\ncheck: spans exported per instrumented call / per bare call (sync, async, stream); "
          "ids = token ids on the span")
    for v in variants:
        if v in BARE_OF.values():
            continue
        cells = []
        for mode in MODES:
            c = summary[v][mode]
            if not c["processes"]:
                cells.append("failed")
                continue
            tag = f"{c['spans_per_call']:.2f}/{c['spans_per_bare_call']:.2f}"
            if c.get("ids_recorded"):
                tag += " ids"
            cells.append(tag)
        print(f"  {VARIANTS[v][1]:{w - 2}}" + ", ".join(cells))
    for v in variants:
        for m in MODES:
            if summary[v][m].get("errors"):
                print(f"  error in {v} {m}: {summary[v][m]['errors'][0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 process per variant (all modes in one), short blocks")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    ap.add_argument("--rounds", type=int, help="fresh processes per cell (default 5)")
    ap.add_argument("--pairs", type=int, help="pairs of blocks per process (default 8)")
    ap.add_argument("--calls", type=int, help="calls per block (default 120)")
    ap.add_argument("--stream-calls", type=int, help="stream calls per block (default 60)")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer (says so in the table)")
    ap.add_argument("--variants", help=f"comma-separated subset of the dev venv's variants "
                    f"({','.join(v for v in VARIANTS if VARIANTS[v][0] == 'dev')})")
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS,
                    metavar=("VARIANT", "MODES", "CALLS", "STREAM_CALLS", "PAIRS", "WARMUP"))
    args = ap.parse_args()
    if args.worker:
        v, modes, calls, stream_calls, pairs, warmup = args.worker
        print(json.dumps(worker(v, modes.split(","), int(calls), int(stream_calls), int(pairs),
                                int(warmup))), flush=True)
        return

    rounds = args.rounds or (1 if args.quick else 5)
    pairs = args.pairs or (4 if args.quick else 8)
    calls = args.calls or (50 if args.quick else 120)
    stream_calls = args.stream_calls or (25 if args.quick else 60)
    warmup = 20 if args.quick else 100

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    variants = [v for v in VARIANTS if VARIANTS[v][0] == "dev"
                and (not args.variants or v in args.variants.split(","))]
    pythons = {"dev": Path(sys.executable)}
    peer_note = ""
    if args.no_peer:
        peer_note = "not run (--no-peer)"
    else:
        peer_python, why = ensure_peer_venv(log)
        if peer_python is None:
            peer_note = f"NOT MEASURED: {why}"
        else:
            pythons["peer"] = peer_python
            variants += [v for v in VARIANTS if VARIANTS[v][0] == "peer"]
            log(f"peer venv: {why}")

    # full: one process per (variant, mode); quick: one process per variant runs all modes
    jobs = ([(v, [m]) for v in variants for m in MODES] if not args.quick
            else [(v, list(MODES)) for v in variants])
    results: list[dict] = []
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]
    for rnd in range(rounds):
        order = jobs[:]
        random.shuffle(order)
        for v, modes in order:
            for r in run_worker(pythons[VARIANTS[v][0]], v, modes, calls, stream_calls, pairs,
                                warmup):
                r["round"] = rnd
                results.append(r)
        log(f"round {rnd + 1}/{rounds} done ({time.monotonic() - t_start:.0f} s)")

    import platform

    meta = {"rounds": rounds, "pairs": pairs, "calls": f"{calls} (stream {stream_calls})",
            "warmup": warmup,
            "process_per": "one per variant, all modes" if args.quick else "one per mode",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                       f"{platform.python_version()}, load avg {load_start:.1f} at start, "
                       f"{os.getloadavg()[0]:.1f} at end",
            "seconds": round(time.monotonic() - t_start)}
    summary = summarize(results, variants)
    print_table(summary, variants, peer_note, meta)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": "capture_overhead", "meta": meta, "peer_note": peer_note,
             "labels": {v: VARIANTS[v][1] for v in variants}, "summary": summary,
             "processes": results}, indent=1))


if __name__ == "__main__":
    main()
