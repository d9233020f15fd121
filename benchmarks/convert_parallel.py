"""Conversion in parallel: ``agl-bridge convert --workers 2`` against one process on the
synthetic 1M-span set of ``convert_vs_agentlightning.py``.

Each measurement runs in its own fresh process (imports untimed; the workers' start-up is
timed, it is part of what a user waits for); the configurations alternate within each repeat,
the first one rotating, so a change in the machine's load hits all. Two pairs: one process
against ``--workers 2`` as a user of this machine runs them, and the same split with one core
per process (one process on one core against two ``--part I/2`` processes on a core each, as
on two machines), which measures the split itself: one process alone already spreads over
about 1.7 cores with its reader and writer threads. Reported: wall seconds (median,
min..max), CPU seconds of the process and its workers, the speed-up of the medians over the
pair's one process, and the load average and host steal while each ran. Afterwards the
outputs are compared: the same transitions, row for row (sorted by span id: every column).

Run: ``.venv/bin/python benchmarks/convert_parallel.py [--quick] [--repeats 5] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import convert_recipe as recipe_bench  # noqa: E402
import convert_synthetic as syn  # noqa: E402
import convert_vs_agentlightning as bench  # noqa: E402

# name -> (processes, one core each): the unpinned pair is what a user of this machine gets; the
# pinned pair measures the split itself, one core per process (one process alone already spreads
# over about 1.7 cores with its reader and writer threads, which hides the split on 2 cores)
CONFIGS: dict[str, tuple[int, bool]] = {
    "1 process": (1, False), "2 workers": (2, False),
    "1 proc, 1 core": (1, True), "2 parts, 1 core each": (2, True)}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(src: str, out: str, config: str) -> dict[str, Any]:
    workers, pinned = CONFIGS[config]
    cores = sorted(os.sched_getaffinity(0))
    t0, c0 = time.perf_counter(), _cpu()
    if pinned and workers == 1:
        os.sched_setaffinity(0, {cores[0]})
    from agl_bridge.trainer.conversion import convert
    from agl_bridge.trainer.conversion.parallel import convert_parallel

    if pinned and workers > 1:  # ``--part I/N`` processes, as on N machines, one core each
        transitions = _pinned_parts(src, out, workers, cores)
    elif workers == 1:
        transitions = convert(src, out, tune_allocators=True).transitions
    else:
        transitions = convert_parallel(src, out, workers=workers).transitions
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0,
            "transitions": transitions}


def _pinned_parts(src: str, out: str, n: int, cores: list[int]) -> int:
    from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
    from agl_bridge.trainer.conversion.finish import finish_files

    Path(out).mkdir(parents=True, exist_ok=True)
    files = [Path(out) / f"part-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
    procs = [subprocess.Popen(
        [sys.executable, str(HERE), "--part-worker", src, str(files[i]), f"{i}/{n}"],
        stdout=subprocess.PIPE, text=True, env=bench._env(), cwd=bench.REPO,
        preexec_fn=_pin(cores[i % len(cores)]))
        for i in range(n)]
    stats = ConversionStats()
    for proc in procs:
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a part failed (exit {proc.returncode})")
        part = json.loads(stdout.strip().splitlines()[-1])
        stats.transitions += part["transitions"]
        for b, k in part["baselines"].items():
            stats.baselines[b] = stats.baselines.get(b, 0) + k
    finish_files(files, ConvertConfig(), stats)  # a no-op on the default (group) baselines
    return stats.transitions


def _pin(core: int) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, {core})


def part_worker(src: str, out: str, part: str) -> None:
    from agl_bridge.trainer.conversion import convert

    i, n = (int(x) for x in part.split("/"))
    stats = convert(src, out, tune_allocators=True, part=(i, n), finish=False)
    print(json.dumps({"transitions": stats.transitions, "baselines": stats.baselines}))


def same_rows(a: Path, b: Path) -> bool:
    from agl_bridge.trainer.training.data import read_transitions

    x, y = read_transitions(a), read_transitions(b)
    if x.num_rows != y.num_rows or not x.schema.equals(y.schema):
        return False
    return x.sort_by("span_id").equals(y.sort_by("span_id"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"~{bench.QUICK_SPANS:,} spans")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--worker", nargs=3, metavar=("SRC", "OUT", "CONFIG"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--part-worker", nargs=3, metavar=("SRC", "OUT", "I/N"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        src, out, config = a.worker
        print("RESULT " + json.dumps(worker(src, out, config)))
        return 0
    if a.part_worker:
        part_worker(*a.part_worker)
        return 0
    n = syn.episodes_for_spans(bench.QUICK_SPANS if a.quick else bench.FULL_SPANS, a.seed)
    manifest = bench.ensure_datasets([(n, "ours")], a.seed, Path(sys.executable))[(n, "ours")]
    assert manifest is not None
    src = bench.dataset(n, a.seed, "ours")
    names = list(CONFIGS)
    info: dict[str, Any] = {"spans": manifest["spans"], "episodes": n, "seed": a.seed,
                            "repeats": a.repeats, "machine": bench._machine(),
                            "commit": recipe_bench._commit(),
                            "started": _dt.datetime.now(_dt.timezone.utc).strftime(
                                "%Y-%m-%d %H:%M UTC"),
                            "runs": {name: [] for name in names}}
    with tempfile.TemporaryDirectory(prefix="parallel-bench-") as tmp:
        outs = {name: Path(tmp) / (f"{i}.parquet" if CONFIGS[name][0] == 1 else f"{i}-parts")
                for i, name in enumerate(names)}
        for r in range(a.repeats):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                res = recipe_bench.run(sys.executable,
                                       [str(src), str(outs[name]), name],
                                       script=HERE)
                info["runs"][name].append(res)
                bench.log(f"repeat {r + 1}/{a.repeats} {name}: "
                          + (f"{res['wall_s']:.2f} s wall, {res['cpu_s']:.2f} s CPU, "
                             f"steal {res.get('steal_pct', 0):.0f}%, load {res['load']:.1f}"
                             if "wall_s" in res else res["error"]))
        first = next(iter(outs.values()))
        info["same_rows"] = all(same_rows(first, o) for o in list(outs.values())[1:])
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))
    report(info)
    return 0


def report(info: dict[str, Any]) -> None:
    m = info["machine"]
    print(f"\n{info['spans']:,} spans ({info['episodes']:,} episodes, seed {info['seed']}), "
          f"commit {info['commit']}, {info['started']}; {m['cores']} x {m['cpu']}; "
          f"{info['repeats']} fresh processes per configuration, alternating")
    print(f"{'configuration':<22}{'wall s':>22}{'CPU s':>22}{'steal %':>12}{'load':>16}"
          f"{'speed-up':>10}{'transitions':>13}")
    def ref(name: str) -> list[float]:  # the same pinning, one process
        one = next(n for n, (w, pin) in CONFIGS.items() if w == 1 and pin == CONFIGS[name][1])
        return [r["wall_s"] for r in info["runs"].get(one, []) if "wall_s" in r]

    for name, runs in info["runs"].items():
        ok = [r for r in runs if "wall_s" in r]
        if not ok:
            print(f"{name:<22} failed: {runs[0].get('error')}")
            continue
        wall = [r["wall_s"] for r in ok]
        first = ref(name)
        speed = bench._med(first) / bench._med(wall) if first else float("nan")
        print(f"{name:<22}{bench._spread(wall, '{:.2f}'):>22}"
              f"{bench._spread([r['cpu_s'] for r in ok], '{:.2f}'):>22}"
              f"{bench._spread([r.get('steal_pct', 0) for r in ok], '{:.0f}'):>12}"
              f"{bench._spread([r['load'] for r in ok], '{:.1f}'):>16}"
              f"{speed:>9.2f}x{ok[0]['transitions']:>13,}")
    print(f"outputs the same rows (sorted by span id, every column): {info['same_rows']}")


if __name__ == "__main__":
    sys.exit(main())
