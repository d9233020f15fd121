"""Conversion in parallel: ``agl-bridge convert --workers 2`` against one process on the
synthetic 1M-span set of ``convert_vs_agentlightning.py``.

Each measurement runs in its own fresh process (imports untimed; the workers' start-up is
timed, it is part of what a user waits for); the two configurations alternate within each
repeat, the first one rotating, so a change in the machine's load hits both. Reported: wall
seconds (median, min..max), CPU seconds of the process and its workers, the speed-up of the
medians, and the load average and host steal while each ran. Afterwards the two outputs are
compared: the same transitions, row for row (sorted by span id: every column).

Run: ``.venv/bin/python benchmarks/convert_parallel.py [--quick] [--repeats 5] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import convert_recipe as recipe_bench  # noqa: E402
import convert_synthetic as syn  # noqa: E402
import convert_vs_agentlightning as bench  # noqa: E402

CONFIGS = {"1 process": 1, "2 workers": 2}


def worker(src: str, out: str, workers: int) -> dict[str, Any]:
    from agl_bridge.trainer.conversion import convert
    from agl_bridge.trainer.conversion.parallel import convert_parallel

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    if workers == 1:
        stats = convert(src, out, tune_allocators=True)
    else:
        stats = convert_parallel(src, out, workers=workers)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu() - c0,
            "transitions": stats.transitions}


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
    ap.add_argument("--worker", nargs=3, metavar=("SRC", "OUT", "WORKERS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        src, out, workers = a.worker
        print("RESULT " + json.dumps(worker(src, out, int(workers))))
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
        outs = {name: Path(tmp) / (f"{CONFIGS[name]}.parquet" if CONFIGS[name] == 1
                                   else f"{CONFIGS[name]}-parts") for name in names}
        for r in range(a.repeats):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                res = recipe_bench.run(sys.executable,
                                       [str(src), str(outs[name]), str(CONFIGS[name])],
                                       script=HERE)
                info["runs"][name].append(res)
                bench.log(f"repeat {r + 1}/{a.repeats} {name}: "
                          + (f"{res['wall_s']:.2f} s wall, {res['cpu_s']:.2f} s CPU, "
                             f"steal {res.get('steal_pct', 0):.0f}%, load {res['load']:.1f}"
                             if "wall_s" in res else res["error"]))
        info["same_rows"] = same_rows(*outs.values())
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))
    report(info)
    return 0


def report(info: dict[str, Any]) -> None:
    m = info["machine"]
    print(f"\n{info['spans']:,} spans ({info['episodes']:,} episodes, seed {info['seed']}), "
          f"commit {info['commit']}, {info['started']}; {m['cores']} x {m['cpu']}; "
          f"{info['repeats']} fresh processes per configuration, alternating")
    print(f"{'configuration':<14}{'wall s':>22}{'CPU s':>22}{'steal %':>12}{'load':>16}"
          f"{'speed-up':>10}{'transitions':>13}")
    first = [r["wall_s"] for r in info["runs"]["1 process"] if "wall_s" in r]
    for name, runs in info["runs"].items():
        ok = [r for r in runs if "wall_s" in r]
        if not ok:
            print(f"{name:<14} failed: {runs[0].get('error')}")
            continue
        wall = [r["wall_s"] for r in ok]
        speed = bench._med(first) / bench._med(wall) if first else float("nan")
        print(f"{name:<14}{bench._spread(wall, '{:.2f}'):>22}"
              f"{bench._spread([r['cpu_s'] for r in ok], '{:.2f}'):>22}"
              f"{bench._spread([r.get('steal_pct', 0) for r in ok], '{:.0f}'):>12}"
              f"{bench._spread([r['load'] for r in ok], '{:.1f}'):>16}"
              f"{speed:>9.2f}x{ok[0]['transitions']:>13,}")
    print(f"outputs the same rows (sorted by span id, every column): {info['same_rows']}")


if __name__ == "__main__":
    sys.exit(main())
