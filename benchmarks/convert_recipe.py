"""What a reward recipe costs the converter: conversion time with and without a recipe on the
synthetic 1M-span set of ``convert_vs_agentlightning.py``.

Why: a recipe makes the converter read more columns (terms that look at span names, tool
status and, above all, the ``attributes`` JSON, where vote, DAG and token-usage attributes
live) and run the terms on every unit. Re-rewarding stored traces with a new recipe is the
point of recipes, so that cost must stay small next to the conversion itself.

The synthetic set (``convert_synthetic.py``) has tool calls (none failed), token usage on every
LLM call and a task reward per episode, but no votes, coordination or DAG spans: the vote,
coordination and DAG terms find nothing to reward there, so what they cost is reading their
columns and finding no rows of theirs. ``cost`` rewards every LLM call. Configurations:

* ``none``: no recipe (the baseline);
* ``tool_failure``: a term that reads only small columns (``status_code``; no ``attributes``);
* ``structure``: tool_failure + votes + coordination + dag (they read ``name``, ``attributes``,
  ``parent_span_id``, ...), which derive nothing here;
* ``all``: structure + cost (a regular expression over every LLM call's attributes, and one
  reward per call: 477k rewards).

Each measurement runs in its own fresh process (imports untimed); the configurations alternate
within each repeat, the first one rotating, so a change in the machine's load hits all of them.
Reported: medians with min..max, CPU seconds, peak RSS, and the host steal and load average
while each ran (this is a shared 2-vCPU guest). The input is generated once and cached under
``.cache/convert-bench/<N>/seed-<S>/ours`` (shared with the peer benchmark).

Run: ``.venv/bin/python benchmarks/convert_recipe.py [--quick] [--repeats 5] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import convert_synthetic as syn  # noqa: E402
import convert_vs_agentlightning as bench  # noqa: E402

RECIPES = {
    "none": None,
    "tool_failure": "[terms.tool_failure]\n",
    "structure": "[terms.tool_failure]\n[terms.votes]\n[terms.coordination]\n[terms.dag]\n",
    "all": "[terms.tool_failure]\n[terms.votes]\n[terms.coordination]\n[terms.dag]\n"
           "[terms.cost]\n",
}


READS = ("none", "structure")  # also timed reading their columns only


def worker(src: str, out: str, recipe: str) -> dict[str, Any]:
    from agl_bridge.trainer.conversion import ConvertConfig, convert
    from agl_bridge.trainer.conversion.columns import columns_to_read
    from agl_bridge.trainer.rewards.recipes import load_recipe

    cfg = ConvertConfig(recipe=load_recipe(recipe) if recipe else None)
    rss0 = bench._rss_kb()
    c0 = bench._cpu_s()
    t0 = time.perf_counter()
    stats = convert(src, out, cfg)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": bench._cpu_s() - c0, "maxrss_kb": bench._maxrss_kb(),
            "rss_after_import_kb": rss0, "spans": stats.spans,
            "transitions": stats.transitions,
            "recipe_rewards": sum(stats.recipe_rewards.values()),
            "recipe_total": sum(stats.recipe.values()),
            "columns": columns_to_read(False, cfg.extra_columns)}


def read_worker(src: str, recipe: str) -> dict[str, Any]:
    """Only decode the columns a conversion with ``recipe`` reads, batch by batch as the
    streaming converter does: what the extra columns cost before any term runs."""
    import pyarrow.parquet as pq

    from agl_bridge.parquet_io import iter_parquet_files
    from agl_bridge.trainer.conversion.columns import columns_to_read
    from agl_bridge.trainer.rewards.recipes import load_recipe

    extra = load_recipe(recipe).columns if recipe else ()
    columns = columns_to_read(False, extra)
    c0, t0, rows = bench._cpu_s(), time.perf_counter(), 0
    for path in iter_parquet_files(src):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=16_384, columns=columns,
                                                       use_threads=False):
            rows += batch.num_rows
    return {"wall_s": time.perf_counter() - t0, "cpu_s": bench._cpu_s() - c0, "rows": rows}


def run(python: str, args: list[str], worker: str = "--worker", script: Path = HERE
        ) -> dict[str, Any]:
    """One measurement in a fresh process (``script worker args``: it prints ``RESULT
    {json}``), with the host steal and load average meanwhile."""
    t0, load0 = bench._cpu_ticks(), os.getloadavg()[0]
    r = subprocess.run([python, str(script), worker, *args], check=False,
                       capture_output=True, text=True, env=bench._env(), cwd=bench.REPO)
    t1, load1 = bench._cpu_ticks(), os.getloadavg()[0]
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        return {"error": f"rc {r.returncode}: {r.stderr.strip()[-400:]}"}
    res = json.loads(lines[-1][len("RESULT "):])
    if t0 and t1 and t1[1] > t0[1]:
        res["steal_pct"] = 100.0 * (t1[0] - t0[0]) / (t1[1] - t0[1])
    res["load"] = max(load0, load1)
    return res


def _commit() -> str:
    """HEAD, marked ``+dirty`` when the converter or the terms differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], check=False, capture_output=True, text=True,
                              cwd=bench.REPO).stdout.strip()

    dirty = git("status", "--porcelain", "trainer/conversion", "trainer/rewards")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def report(info: dict[str, Any]) -> None:
    m = info["machine"]
    print(f"\n{info['spans']:,} spans ({info['episodes']:,} episodes, seed {info['seed']}), "
          f"commit {info['commit']}, {info['started']}; {m['cores']} x {m['cpu']}, "
          f"Python {m['python']}; {info['repeats']} fresh processes per configuration, "
          f"alternating")
    print(f"{'recipe':<14}{'wall s':>22}{'CPU s':>22}{'peak RSS MiB':>18}{'steal %':>12}"
          f"{'load':>16}{'wall vs none':>14}{'CPU vs none':>13}{'rewards':>10}")
    base = {k: bench._med([r[k] for r in info["runs"]["none"] if k in r])
            for k in ("wall_s", "cpu_s")} if "none" in info["runs"] else {}
    for name, runs in info["runs"].items():
        ok = [r for r in runs if "wall_s" in r]
        if not ok:
            print(f"{name:<14} failed: {runs[0].get('error')}")
            continue
        wall, cpu = [r["wall_s"] for r in ok], [r["cpu_s"] for r in ok]
        rel = "".join(f"{100 * (bench._med(xs) / base[k] - 1):>+{w}.0f}%" if base else
                      f"{'-':>{w + 1}}" for xs, k, w in ((wall, "wall_s", 13), (cpu, "cpu_s", 12)))
        print(f"{name:<14}{bench._spread(wall, '{:.2f}'):>22}"
              f"{bench._spread(cpu, '{:.2f}'):>22}"
              f"{bench._spread([r['maxrss_kb'] / 1024 for r in ok], '{:.0f}'):>18}"
              f"{bench._spread([r.get('steal_pct', 0) for r in ok], '{:.0f}'):>12}"
              f"{bench._spread([r['load'] for r in ok], '{:.1f}'):>16}"
              f"{rel}{ok[0]['recipe_rewards']:>10,}")
    plain = next((r["columns"] for r in info["runs"].get("none", []) if "columns" in r), [])
    for name, runs in info["runs"].items():
        ok = [r for r in runs if "columns" in r]
        if ok and name != "none":
            extra = [c for c in ok[0]["columns"] if c not in plain]
            print(f"  {name} reads besides: {', '.join(extra) or 'nothing'}")
    reads = info.get("reads", {})
    if reads:
        print("reading the columns only (every batch of every file, nothing converted):")
        for name, runs in reads.items():
            ok = [r for r in runs if "cpu_s" in r]
            if ok:
                print(f"  {name:<12} CPU s {bench._spread([r['cpu_s'] for r in ok], '{:.2f}')}"
                      f", wall s {bench._spread([r['wall_s'] for r in ok], '{:.2f}')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"~{bench.QUICK_SPANS:,} spans")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=list(RECIPES), help="these configurations")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the report of a --json "
                    "file and exit")
    ap.add_argument("--worker", nargs=3, metavar=("SRC", "OUT", "RECIPE"), help=argparse.SUPPRESS)
    ap.add_argument("--read-worker", nargs=2, metavar=("SRC", "RECIPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        src, out, recipe = a.worker
        print("RESULT " + json.dumps(worker(src, out, recipe if recipe != "-" else "")))
        return 0
    if a.read_worker:
        src, recipe = a.read_worker
        print("RESULT " + json.dumps(read_worker(src, recipe if recipe != "-" else "")))
        return 0
    if a.report:
        report(json.loads(a.report.read_text()))
        return 0
    n = syn.episodes_for_spans(bench.QUICK_SPANS if a.quick else bench.FULL_SPANS, a.seed)
    manifest = bench.ensure_datasets([(n, "ours")], a.seed, Path(sys.executable))[(n, "ours")]
    assert manifest is not None
    src = bench.dataset(n, a.seed, "ours")
    names = a.only or list(RECIPES)
    info: dict[str, Any] = {"spans": manifest["spans"], "episodes": n, "seed": a.seed,
                            "repeats": a.repeats, "machine": bench._machine(),
                            "commit": _commit(),
                            "started": _dt.datetime.now(_dt.timezone.utc).strftime(
                                "%Y-%m-%d %H:%M UTC"),
                            "runs": {name: [] for name in names}, "reads": {}}
    with tempfile.TemporaryDirectory(prefix="recipe-bench-") as tmp:
        files = {}
        for name in names:
            if RECIPES[name] is not None:
                files[name] = Path(tmp) / f"{name}.toml"
                files[name].write_text(RECIPES[name] or "")
        for r in range(a.repeats):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                res = run(sys.executable, [str(src), str(Path(tmp) / "t.parquet"),
                                           str(files.get(name, "-"))])
                info["runs"][name].append(res)
                if name in READS:
                    read = run(sys.executable, [str(src), str(files.get(name, "-"))],
                               worker="--read-worker")
                    info["reads"].setdefault(name, []).append(read)
                bench.log(f"repeat {r + 1}/{a.repeats} {name}: "
                          + (f"{res['wall_s']:.2f} s wall, {res['cpu_s']:.2f} s CPU, "
                             f"steal {res.get('steal_pct', 0):.0f}%, load {res['load']:.1f}"
                             if "wall_s" in res else res["error"]))
    if a.json:
        a.json.write_text(json.dumps(info, indent=1))
    report(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
