"""Spans per second, bytes on disk and peak memory of the span export path, ours next to the
SDK's own file exporter.

Why: every LLM call becomes a ``chat`` span carrying a few hundred token ids and logprobs, and
those spans leave the process through a ``BatchSpanProcessor`` into an exporter. If the exporter
is slower than the agents produce spans, the processor's queue fills and spans are dropped (or
memory grows); if files are large, disks fill. This measures, for N synthetic ``chat`` spans
shaped like ours (200 prompt ids, 50 completion ids, 50 logprobs, the usual ``gen_ai.*`` and
scope attributes), each exporter in its own fresh subprocess:

* ``discard``: an exporter that drops spans (the floor: span creation + batch processor);
* ``ours``: ``ParquetSpanExporter`` into a temp dir (write-ahead log fsynced per batch, one
  Parquet file at shutdown);
* ``peer``: the SDK's ``ConsoleSpanExporter(out=open(path, "w"))``, i.e. span JSON to a file,
  the simplest way the SDK itself writes spans to disk.

Each exporter runs two ways, each in fresh processes:

* ``free``: the producer creates spans as fast as it can and the processor's queue is sized to
  N, so that no span is dropped (checked: every span must reach the exporter and the disk).
  This gives throughput; a slower exporter leaves more spans queued, so its peak RSS here
  mostly measures the backlog of queued spans (about 10 KiB each), not the exporter.
* ``bounded``: the queue has the SDK's default size (2048) and the producer calls
  ``force_flush`` every 2048 spans, so the backlog never exceeds 2048 spans; peak RSS here is
  the exporter's own footprint plus at most 2048 spans.

Reported: spans/s end to end (first span started to ``provider.shutdown()`` returned, so the
final flush and file write are included), the time spent inside ``export()`` alone (as
spans/s), bytes on disk per span after shutdown, and peak RSS (``resource.getrusage``) with its
increase over the RSS measured after imports and set-up.

What durability costs. ``ours`` runs behind the processor capture uses (a batch processor
exporting at least every ``ParquetSpanExporter.MAX_EXPORT_DELAY_MS`` = 200 ms, so a kill loses
about the last 200 ms of finished spans); ``ours_5s`` behind the SDK's default 5 s delay, which
zero-code capture used before. Fast producers fill 512-span batches long before either delay,
so the difference shows at the rates agents actually produce spans: two more pacings,
``paced20`` and ``paced200`` (20 and 200 spans/s for ``PACED_SECONDS``), report CPU per span of
the whole process (all threads: the export worker included), of the exporting thread inside
``export()`` and of the caller's thread inside ``span.end()`` (``time.thread_time``: what the
application's own thread pays), with the number of ``export()`` calls. A paced run first
makes pyarrow's one-time import of pandas, untimed. All exporters run in shuffled order, each
in fresh processes, so old and new alternate in the same run.

The allocator. ``ours`` and ``ours_5s`` start with the environment zero-code capture gives the
process (``auto.ARROW_ALLOCATOR_ENV``: mimalloc, Arrow's default allocator, with its arena
eager commit off); ``ours_lib`` is the same exporter without it, as in a program that
configures capture itself and leaves the variable unset.

Run: ``.venv/bin/python benchmarks/parquet_export.py [--quick] [--json PATH] [-n N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
EXPORTERS = {
    "discard": "floor: discard exporter (span creation + BatchSpanProcessor)",
    "ours": "ours: ParquetSpanExporter (200 ms batch delay and Arrow's allocator option, as "
            "zero-code capture sets them)",
    "ours_lib": "ours, without the allocator option (a program that configures capture itself)",
    "ours_5s": "ours, behind the SDK's default 5 s batch delay (zero-code capture before)",
    "peer": "peer: SDK ConsoleSpanExporter -> JSON file",
}
PROMPT_IDS, COMPLETION_IDS = 200, 50
BOUNDED_QUEUE = 2048  # the SDK's default max_queue_size
PACINGS = {
    "free": "free-running producer, queue sized to N (throughput)",
    "bounded": f"producer flushes every {BOUNDED_QUEUE} spans, queue {BOUNDED_QUEUE} (memory)",
    "paced20": "20 spans/s, queue 2048 (CPU per span at an agent team's rate)",
    "paced200": "200 spans/s, queue 2048 (CPU per span at a busy team's rate)",
}
PACED_RATE = {"paced20": 20, "paced200": 200}
PACED_SECONDS = 12  # --quick: 4


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(kind: str, n: int, pacing: str) -> dict:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.trace import SpanKind

    # torch-free, pyarrow-free: capture's own way of storing number lists (every exporter
    # gets the same spans)
    from agl_bridge.otel.attributes import set_number_lists

    tmp = Path(tempfile.mkdtemp(prefix="agl-bench-export-"))
    # seconds inside export(), spans exported, export() calls, ns of CPU of the exporting thread
    spent = [0.0, 0, 0, 0]

    def counted(cls):
        class Counted(cls):
            def export(self, spans):
                t0, c0 = time.perf_counter(), time.thread_time_ns()
                result = super().export(spans)
                spent[0] += time.perf_counter() - t0
                spent[1] += len(spans)
                spent[2] += 1
                spent[3] += time.thread_time_ns() - c0
                return result
        return Counted

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    out_file = None
    if kind == "discard":
        exporter = counted(Discard)()
    elif kind in ("ours", "ours_5s", "ours_lib"):
        from agl_bridge.otel.parquet_exporter import ParquetSpanExporter

        exporter = counted(ParquetSpanExporter)(tmp / "traces")
    elif kind == "peer":
        out_file = open(tmp / "spans.json", "w")
        exporter = counted(ConsoleSpanExporter)(out=out_file)
    else:
        raise SystemExit(f"unknown exporter {kind}")
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-team"}))
    bounded = pacing == "bounded"
    rate = PACED_RATE.get(pacing)
    # "ours" gets the delay capture gives it (setup._processor); the others the SDK default
    delay = (getattr(exporter, "MAX_EXPORT_DELAY_MS", None) if kind in ("ours", "ours_lib")
             else None)
    provider.add_span_processor(BatchSpanProcessor(
        exporter, max_queue_size=max(BOUNDED_QUEUE, n) if pacing == "free" else BOUNDED_QUEUE,
        schedule_delay_millis=delay))
    tracer = provider.get_tracer("bench.parquet_export")

    # Token ids drawn uniformly from a 150k vocabulary and logprobs uniform in (-5, 0], read as
    # windows at random offsets of 1M-long pools: no two spans share a sequence, so Parquet
    # cannot compress repeats that real traces would not have (real prompts share prefixes and
    # token frequencies are skewed, so real files compress better than these).
    rng = random.Random(7)
    pool_len = 1 << 20
    pool = array("i", (rng.randrange(3, 150_000) for _ in range(pool_len)))
    lp_pool = array("d", (-rng.random() * 5 for _ in range(pool_len)))
    offsets = [rng.randrange(0, pool_len - PROMPT_IDS - 1) for _ in range(n)]
    episodes = [f"ep-{i:06d}" for i in range(max(1, n // 8))]
    rss_setup = _rss_mib()

    if rate:
        # steady state: pyarrow's first conversion of Python objects imports pandas (about
        # 0.4 s of CPU, once per process); paid here, untimed, so it does not swamp the
        # per-span figures of a 12 s paced run (free and bounded runs still include it)
        import pyarrow as pa

        pa.array([0])
    end_cpu = 0  # ns of the caller's thread inside span.end()
    t0, cpu0 = time.perf_counter(), time.process_time_ns()
    for i in range(n):
        if rate:  # paced: span i ends at t0 + i / rate
            lag = t0 + i / rate - time.perf_counter()
            if lag > 0:
                time.sleep(lag)
        o = offsets[i]
        attrs = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "team@v3", "gen_ai.request.temperature": 1.0,
            "gen_ai.request.max_tokens": 64, "gen_ai.response.id": f"chatcmpl-{i:08x}",
            "gen_ai.response.model": "team@v3", "gen_ai.response.finish_reasons": ("stop",),
            "gen_ai.usage.input_tokens": PROMPT_IDS, "gen_ai.usage.output_tokens": COMPLETION_IDS,
            "server.address": "127.0.0.1", "server.port": 8000,
            "gen_ai.agent.name": "solver" if i % 2 else "critic",
            "agl_bridge.agent.role": "worker", "agl_bridge.episode.id": episodes[i // 8],
            "agl_bridge.task.id": f"task-{(i // 64):05d}", "agl_bridge.turn.index": (i % 8) // 2,
            "agl_bridge.policy.version": "team@v3", "agl_bridge.llm.server": "vllm",
            "agl_bridge.llm.stream": False, "agl_bridge.llm.token_ids": "recorded",
        }
        span = tracer.start_span("chat team@v3", kind=SpanKind.CLIENT, attributes=attrs)
        # the number lists as capture records them (integrations/openai/response.py)
        set_number_lists(span, {
            "agl_bridge.llm.prompt_token_ids": pool[o:o + PROMPT_IDS].tolist(),
            "agl_bridge.llm.completion_token_ids":
                pool[o + PROMPT_IDS - COMPLETION_IDS:o + PROMPT_IDS].tolist(),
            "agl_bridge.llm.completion_logprobs": lp_pool[o:o + COMPLETION_IDS].tolist()})
        c = time.thread_time_ns()
        span.end()
        end_cpu += time.thread_time_ns() - c
        if bounded and (i + 1) % BOUNDED_QUEUE == 0:
            provider.force_flush()  # the queue never holds more than BOUNDED_QUEUE spans
    t_produced = time.perf_counter()
    provider.shutdown()  # drains the queue; ours writes its Parquet file here
    if out_file is not None:
        out_file.close()
    t_done, cpu_done = time.perf_counter(), time.process_time_ns()

    if kind in ("ours", "ours_5s", "ours_lib"):
        files = [p for p in (tmp / "traces").rglob("*") if p.is_file()]
        wal_left = [p for p in files if "_wal" in p.parts]
        data = [p for p in files if p.suffix == ".parquet"]
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrow_peak = pa.default_memory_pool().max_memory() / 2**20
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in data)
        size = sum(p.stat().st_size for p in data)
        check = (f"{rows} rows in {len(data)} Parquet file(s), {len(wal_left)} WAL files left, "
                 f"Arrow memory pool peak {arrow_peak:.0f} MiB")
    elif kind == "peer":
        size = (tmp / "spans.json").stat().st_size
        check = f"{size} bytes of JSON"
        rows = spent[1]
    else:
        size, rows, check = 0, spent[1], ""
    shutil.rmtree(tmp, ignore_errors=True)
    total = t_done - t0
    return {"exporter": kind, "pacing": pacing, "spans": n, "exported": spent[1],
            "rows_on_disk": rows,
            "seconds_total": total, "seconds_producing": t_produced - t0,
            "seconds_draining": t_done - t_produced, "seconds_in_export": spent[0],
            "spans_per_s": n / total,
            "export_only_spans_per_s": spent[1] / spent[0] if spent[0] else None,
            "bytes_per_span": size / n, "rss_after_setup_mib": rss_setup,
            "cpu_per_span_us": (cpu_done - cpu0) / n / 1e3,
            "end_cpu_per_span_us": end_cpu / n / 1e3, "exports": spent[2],
            "export_cpu_per_span_us": spent[3] / n / 1e3,
            "peak_rss_mib": _rss_mib(), "check": check}


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("AGL_BRIDGE_", "OTEL_", "PYTHON", "MIMALLOC_"))}


def run_worker(kind: str, n: int, pacing: str) -> dict:
    env = _clean_env()
    if kind in ("ours", "ours_5s"):  # the process as zero-code capture starts it
        from agl_bridge.otel.auto import ARROW_ALLOCATOR_ENV

        env.update(ARROW_ALLOCATOR_ENV)
    r = subprocess.run([sys.executable, str(HERE), "--worker", kind, str(n), pacing],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        err = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"exporter": kind, "pacing": pacing, "error": f"rc {r.returncode}: {err}"}
    return json.loads(lines[-1])


def summarize(results: list[dict]) -> dict:
    out: dict = {}
    for pacing in PACINGS:
        out[pacing] = {}
        for kind in EXPORTERS:
            mine = [r for r in results if r["exporter"] == kind and r["pacing"] == pacing]
            ok = [r for r in mine if "error" not in r]
            cell: dict = {"processes": len(ok),
                          "errors": sorted({r["error"] for r in mine if "error" in r})}
            for key in ("spans_per_s", "export_only_spans_per_s", "bytes_per_span",
                        "peak_rss_mib", "rss_after_setup_mib", "seconds_producing",
                        "seconds_draining", "cpu_per_span_us", "end_cpu_per_span_us",
                        "export_cpu_per_span_us", "exports"):
                xs = [r[key] for r in ok if r.get(key) is not None]
                if xs:
                    cell[key] = {"median": statistics.median(xs), "min": min(xs),
                                 "max": max(xs)}
            over = [r["peak_rss_mib"] - r["rss_after_setup_mib"] for r in ok]
            if over:
                cell["rss_over_setup_mib"] = {"median": statistics.median(over),
                                              "min": min(over), "max": max(over)}
            cell["all_exported"] = bool(ok) and all(r["exported"] == r["spans"]
                                                    and r["rows_on_disk"] == r["spans"]
                                                    for r in ok)
            cell["check"] = ok[0]["check"] if ok else ""
            out[pacing][kind] = cell
    return out


def _ran(cells: dict) -> bool:
    return any(c["processes"] or c["errors"] for c in cells.values())


def print_table(summary: dict, meta: dict) -> None:
    print(f"\nspan export path: {meta['spans']} chat spans ({PROMPT_IDS} prompt ids, "
          f"{COMPLETION_IDS} completion ids, {COMPLETION_IDS} logprobs, 23 attributes) through "
          f"BatchSpanProcessor; {meta['processes']} fresh process(es) per cell, medians "
          f"[min..max]")
    print(f"machine: {meta['machine']}")
    cols = ("spans/s end to end", "export() only, spans/s", "bytes/span", "peak RSS MiB",
            "RSS over set-up, MiB")
    w = 44

    def cell(c: dict, key: str, fmt: str, sign: str = "") -> str:
        s = c.get(key)
        if not s:
            return "-"
        return (f"{s['median']:{sign}{fmt}} [{s['min']:{sign}{fmt}}..{s['max']:{sign}{fmt}}]")

    short = {"discard": "floor: discard exporter", "ours": "ours: ParquetSpanExporter",
             "ours_5s": "ours, SDK default 5 s delay (before)",
             "ours_lib": "ours, without the allocator option",
             "peer": "peer: SDK ConsoleSpanExporter, file"}
    for pacing, what in PACINGS.items():
        if pacing in PACED_RATE or not _ran(summary[pacing]):
            continue
        print(f"\n{pacing}: {what}")
        print(f"{'':{w}}" + "".join(f"{c:>24}" for c in cols))
        for kind in EXPORTERS:
            c = summary[pacing][kind]
            if not c["processes"] and not c["errors"]:
                continue  # not run (--exporters / --pacings)
            if not c["processes"]:
                print(f"{short[kind]:{w}}failed: {c['errors'][0] if c['errors'] else '?'}")
                continue
            print(f"{short[kind]:{w}}"
                  f"{cell(c, 'spans_per_s', '.0f'):>24}"
                  f"{cell(c, 'export_only_spans_per_s', '.0f') if kind != 'discard' else '-':>24}"
                  f"{cell(c, 'bytes_per_span', '.0f') if kind != 'discard' else '-':>24}"
                  f"{cell(c, 'peak_rss_mib', '.0f'):>24}"
                  f"{cell(c, 'rss_over_setup_mib', '.0f', '+'):>24}")
    paced_cols = ("CPU us/span, all threads", "in export(), us/span", "caller's end(), us/span",
                  "export() calls")
    for pacing, what in PACINGS.items():
        if pacing not in PACED_RATE or not _ran(summary[pacing]):
            continue
        print(f"\n{pacing}: {what}, {meta['paced_seconds']} s")
        print(f"{'':{w}}" + "".join(f"{c:>28}" for c in paced_cols))
        for kind in EXPORTERS:
            c = summary[pacing][kind]
            if not c["processes"] and not c["errors"]:
                continue  # not run (--exporters / --pacings)
            if not c["processes"]:
                print(f"{short[kind]:{w}}failed: {c['errors'][0] if c['errors'] else '?'}")
                continue
            print(f"{short[kind]:{w}}"
                  f"{cell(c, 'cpu_per_span_us', '.0f'):>28}"
                  f"{cell(c, 'export_cpu_per_span_us', '.0f'):>28}"
                  f"{cell(c, 'end_cpu_per_span_us', '.1f'):>28}"
                  f"{cell(c, 'exports', '.0f'):>28}")
    print()
    for pacing in PACINGS:
        for kind in EXPORTERS:
            c = summary[pacing][kind]
            if c["processes"]:
                prod, drain = c["seconds_producing"]["median"], c["seconds_draining"]["median"]
                print(f"  {pacing} {kind}: producing {prod:.2f} s + draining at shutdown "
                      f"{drain:.2f} s; every span exported and on disk: {c['all_exported']}"
                      + (f" ({c['check']})" if c["check"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="5,000 spans, 1 process per exporter and pacing")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    ap.add_argument("-n", type=int, help="spans per process (default 40,000: "
                    "ours rotates one file at 64 MiB of Arrow data, about 38k spans)")
    ap.add_argument("--processes", type=int,
                    help="fresh processes per exporter and pacing (default 3)")
    ap.add_argument("--exporters", help=f"comma-separated subset of {','.join(EXPORTERS)}")
    ap.add_argument("--pacings", help=f"comma-separated subset of {','.join(PACINGS)}")
    ap.add_argument("--worker", nargs=3, metavar=("EXPORTER", "N", "PACING"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.worker[2])),
              flush=True)
        return
    n = args.n or (5_000 if args.quick else 40_000)
    processes = args.processes or (1 if args.quick else 3)
    paced_seconds = 4 if args.quick else PACED_SECONDS
    kinds = args.exporters.split(",") if args.exporters else list(EXPORTERS)
    pacings = args.pacings.split(",") if args.pacings else list(PACINGS)
    t0 = time.monotonic()
    meta = {"spans": n, "processes": processes, "paced_seconds": paced_seconds,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                       f"{platform.python_version()}, load avg at start {os.getloadavg()[0]:.1f}"}
    results = []
    for rnd in range(processes):
        order = [(kind, pacing) for kind in kinds for pacing in pacings]
        random.shuffle(order)
        for kind, pacing in order:
            count = PACED_RATE[pacing] * paced_seconds if pacing in PACED_RATE else n
            results.append(run_worker(kind, count, pacing))
        print(f"round {rnd + 1}/{processes} done ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    meta["seconds"] = round(time.monotonic() - t0)
    summary = summarize(results)
    print_table(summary, meta)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": "parquet_export", "meta": meta, "labels": EXPORTERS, "pacings": PACINGS,
             "summary": summary, "processes": results}, indent=1))


if __name__ == "__main__":
    main()
