"""Does multi-agent credit assignment change what a team learns? The relay task, arm by arm.

Every arm is ``agl-bridge demo --task relay`` (a reader passes the numbers of a noisy word problem
to a solver that never sees it; SmolLM2-135M-Instruct on vLLM) with the same budget, tasks,
held-out set and seeds; only the training choice differs:

=====================  =========================================================================
``at_grpo``            AT-GRPO, one LoRA adapter per agent (the demo's default): r = alpha * team
                       + the agent's own reward, groups (task, agent, turn)
``shared``             AT-GRPO with one LoRA adapter shared by both roles
``lightning_rl``       LightningRL: the team reward to every transition, groups by task
``reader_only``        AT-GRPO training the reader's adapter only (the solver stays the base)
``solver_only``        AT-GRPO training the solver's adapter only
``dr_mas``             AT-GRPO with advantages normalised per agent (Dr. MAS)
``tree``               AT-GRPO with tree sampling: the reader's turn sampled 4 ways in one request
                       (``--branch 4``), one episode per task, against ``at_grpo``'s 4 repeated
                       rollouts: the same number of reader samples
``sft``                SFT on the best rollout of each (task, agent, turn) group
``sft_threshold``      SFT on every transition with reward >= 1 (rejection sampling: a reader
                       that passed the right pair, a solver that summed its pair right, or a
                       team success)
=====================  =========================================================================

Per arm and seed: held-out team success before and after (greedy, ``--eval-tasks``), each role's
own success before and after, 95% Wilson intervals; pooled over seeds, each arm's difference
from ``at_grpo`` after training with a 95% interval (normal approximation of two proportions).
Nothing is tuned on the held-out set: every arm runs the demo's defaults but its own switch.

Run: ``.venv/bin/python benchmarks/credit_ablation.py [--arms a,b,...] [--seeds 0,1]
[--rounds 4 | --rounds 0 --minutes 20] [--eval-tasks 200] [--workdir runs/ablation] [--json PATH]``;
a run whose record is in ``--results`` (default ``benchmarks/results/ablation/<arm>-seed<k>.json``,
committed: the runs outlive a machine) or whose ``state.json`` says it finished is not run again.
``--quick``: the tiny random model, one round, 20 held-out tasks: the plumbing only.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARMS: dict[str, list[str]] = {
    "at_grpo": [],
    "shared": ["--train.policy", "shared"],
    "lightning_rl": ["--convert.algorithm", "lightning_rl"],
    "reader_only": ["--train.train-agents", "reader"],
    "solver_only": ["--train.train-agents", "solver"],
    "dr_mas": ["--convert.per-agent-advantages"],
    "tree": ["--branch", "4", "--rollouts", "1"],
    "sft": ["--train.objective", "sft"],
    "sft_threshold": ["--train.objective", "sft", "--train.sft-select", "threshold",
                      "--train.sft-min-reward", "1.0"],
}
ROLES = ("reader", "solver")
Z95 = 1.959964


RECORD_KEYS = ("baseline", "final", "rounds", "ablation_seconds")


def record(data: dict, arm: str, seed: int, args: argparse.Namespace) -> dict:
    """What the table needs of a finished run, small enough to commit: its evaluations before
    and after, its rounds, its wall time, and what produced it."""
    out = {k: data[k] for k in RECORD_KEYS if k in data}
    out.update(arm=arm, seed=seed, eval_tasks=args.eval_tasks, budget_rounds=args.rounds,
               commit=_commit(), finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    return out


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO)
    return proc.stdout.strip() or "unknown"


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict | None:
    kept = (Path(args.results) / f"{arm}-seed{seed}.json"
            if args.results and not args.quick else None)
    if kept is not None and kept.exists():
        return json.loads(kept.read_text())
    work = Path(args.workdir) / f"{arm}-seed{seed}"
    state = work / "state.json"
    if state.exists():
        data = json.loads(state.read_text())
        if "final" in data:
            return data
    if args.report:
        return None
    # A budget in rounds is the same training for every arm whatever else the machine runs; a
    # budget in minutes is what a user has, but the machine's load then decides the rounds.
    minutes = 24 * 60 if args.rounds else args.minutes
    cmd = [str(Path(sys.executable).with_name("agl-bridge")), "demo", "--task", "relay",
           "--workdir", str(work), "--seed", str(seed), "--minutes", str(minutes),
           "--eval-size", str(args.eval_tasks), *ARMS[arm]]
    if args.rounds:
        cmd += ["--rounds", str(args.rounds)]
    if args.quick:
        cmd += ["--model", "tiny", "--rounds", "1", "--tasks-per-round", "4",
                "--gate-size", "4"]
    t0 = time.monotonic()
    print(f"[{arm} seed {seed}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    with open(work.parent / f"{arm}-seed{seed}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:  # the other arms still run; the table leaves this one out
        print(f"[{arm} seed {seed}] failed (exit {proc.returncode}); see "
              f"{work.parent / f'{arm}-seed{seed}.log'}", file=sys.stderr, flush=True)
        return None
    data = json.loads(state.read_text())
    data["ablation_seconds"] = time.monotonic() - t0
    if kept is not None and not args.quick:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(record(data, arm, seed, args), indent=1))
    return data


def _rounds(data: dict) -> int:
    rounds = data.get("rounds", [])
    return rounds if isinstance(rounds, int) else len(rounds)


def counts(stats: dict) -> tuple[int, int]:
    k = stats.get("k")
    return (int(k) if k is not None else round(stats["rate"] * stats["n"])), int(stats["n"])


def wilson(k: int, n: int) -> tuple[float, float, float]:
    if n == 0:
        return math.nan, math.nan, math.nan
    p = k / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def difference(k1: int, n1: int, k0: int, n0: int) -> tuple[float, float, float]:
    """p1 - p0 with a 95% normal-approximation interval."""
    p1, p0 = k1 / n1, k0 / n0
    half = Z95 * math.sqrt(p1 * (1 - p1) / n1 + p0 * (1 - p0) / n0)
    return p1 - p0, p1 - p0 - half, p1 - p0 + half


def summarize(results: dict[str, list[dict]]) -> dict:
    out: dict = {}
    for arm, runs in results.items():
        pooled = {"team": [0, 0, 0, 0]}  # before k, n, after k, n
        pooled.update({r: [0, 0, 0, 0] for r in ROLES})
        for data in runs:
            for key, before, after in [("team", data["baseline"]["success"],
                                        data["final"]["success"])] + [
                    (r, data["baseline"]["agents"][r], data["final"]["agents"][r])
                    for r in ROLES]:
                kb, nb = counts(before)
                ka, na = counts(after)
                pooled[key] = [pooled[key][0] + kb, pooled[key][1] + nb,
                               pooled[key][2] + ka, pooled[key][3] + na]
        out[arm] = {"seeds": len(runs), "pooled": pooled,
                    "rounds": [_rounds(d) for d in runs],
                    "minutes": [round(d.get("ablation_seconds", 0) / 60, 1) for d in runs]}
    ref = out.get("at_grpo")
    for arm, s in out.items():
        if ref and arm != "at_grpo":
            k1, n1 = s["pooled"]["team"][2:]
            k0, n0 = ref["pooled"]["team"][2:]
            if n1 and n0:
                s["team_after_minus_at_grpo"] = difference(k1, n1, k0, n0)
    return out


def print_table(summary: dict) -> None:
    def cell(k: int, n: int) -> str:
        p, lo, hi = wilson(k, n)
        return f"{p:6.1%} [{lo:.1%}, {hi:.1%}]" if n else "-"

    def role(c: list[int]) -> str:
        return f"{c[0] / c[1]:.1%} -> {c[2] / c[3]:.1%}" if c[1] and c[3] else "-"

    head = (f"{'arm':<14}{'seeds':>6}{'team before':>24}{'team after':>24}"
            f"{'reader before->after':>24}{'solver before->after':>24}{'after - at_grpo':>26}")
    print(head)
    print("-" * len(head))
    for arm, s in summary.items():
        t, rd, sv = s["pooled"]["team"], s["pooled"]["reader"], s["pooled"]["solver"]
        diff = s.get("team_after_minus_at_grpo")
        d = f"{diff[0] * 100:+.1f} [{diff[1] * 100:+.1f}, {diff[2] * 100:+.1f}]" if diff else "-"
        print(f"{arm:<14}{s['seeds']:>6}{cell(t[0], t[1]):>24}{cell(t[2], t[3]):>24}"
              f"{role(rd):>24}"
              f"{role(sv):>24}{d:>26}")


def markdown_table(summary: dict) -> str:
    """The pooled table as Markdown, for the READMEs (generated, not typed)."""
    def pct(k: int, n: int) -> str:
        return f"{k / n:.1%}" if n else "-"

    def team(k: int, n: int) -> str:
        p, lo, hi = wilson(k, n)
        return f"{p:.1%} [{lo * 100:.1f}, {hi * 100:.1f}]" if n else "-"

    rows = ["| arm | seeds | team before -> after (pooled) | reader's own | solver's own "
            "| after - `at_grpo`, points |", "| --- | ---: | --- | --- | --- | --- |"]
    for arm, s in summary.items():
        if not s["seeds"]:
            continue
        t, rd, sv = s["pooled"]["team"], s["pooled"]["reader"], s["pooled"]["solver"]
        diff = s.get("team_after_minus_at_grpo")
        d = (f"{diff[0] * 100:+.1f} [{diff[1] * 100:+.1f}, {diff[2] * 100:+.1f}]" if diff
             else "-")
        after = team(t[2], t[3])
        rows.append(f"| `{arm}` | {s['seeds']} | {team(t[0], t[1])} -> "
                    f"{f'**{after}**' if arm == 'at_grpo' else after} | "
                    f"{pct(rd[0], rd[1])} -> {pct(rd[2], rd[3])} | "
                    f"{pct(sv[0], sv[1])} -> {pct(sv[2], sv[3])} | {d} |")
    return "\n".join(rows)


def plot(results: dict[str, list[dict]], path: str) -> None:
    """Team, reader and solver success per arm: each run after training (filled, 95% Wilson
    interval) beside its own before (hollow), so the spread between seeds shows next to the
    differences between arms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a, runs in results.items() if runs]
    panels = [("team", "team success"), ("reader", "reader's own success"),
              ("solver", "solver's own success")]
    fig, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 0.55 * len(arms) + 1.6), sharey=True)
    for ax, (key, title) in zip(axes, panels):
        for y, arm in enumerate(arms):
            runs = results[arm]
            for j, data in enumerate(runs):
                dy = (j - (len(runs) - 1) / 2) * 0.22
                for when, style in (("baseline", dict(mfc="white", color="0.55")),
                                    ("final", dict(color=f"C{j}"))):
                    stats = (data[when]["success"] if key == "team"
                             else data[when]["agents"][key])
                    p, lo, hi = wilson(*counts(stats))
                    ax.errorbar([p * 100], [y + dy], xerr=[[(p - lo) * 100], [(hi - p) * 100]],
                                fmt="o", ms=5, capsize=2, lw=1,
                                label=(f"seed {data.get('seed', j)}, after" if when == "final"
                                       else "before"), **style)
        ax.set_title(title)
        ax.set_xlabel("held-out success, %")
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(left=0)
    axes[0].set_yticks(range(len(arms)), arms)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    fig.legend(seen.values(), seen.keys(), loc="lower center", ncol=len(seen), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated: {','.join(ARMS)}")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="per run, with --rounds 0 (the demo's budget)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="the budget in training rounds (the same for every arm whatever the "
                         "machine's load); 0: a budget of --minutes instead")
    ap.add_argument("--eval-tasks", type=int, default=200)
    ap.add_argument("--workdir", default=str(REPO / "runs" / "ablation"))
    ap.add_argument("--quick", action="store_true",
                    help="the tiny random model, one round: checks the plumbing, no figures")
    ap.add_argument("--json", help="also write the per-arm figures here")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: the table of the runs already recorded")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the pooled table as Markdown (the READMEs' table)")
    ap.add_argument("--plot", help="also draw each run's before and after, per arm and role, "
                                   "into this image (PNG)")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "ablation"),
                    help="one small JSON record per finished run, kept (committed) so that a "
                         "later session's table includes it; '' keeps none")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; known: {list(ARMS)}")
    if args.quick:
        args.eval_tasks = min(args.eval_tasks, 20)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results: dict[str, list[dict]] = {a: [] for a in arms}
    for seed in seeds:  # arms alternate within each seed: the machine's load hits all alike
        for arm in arms:
            data = run_arm(arm, seed, args)
            if data is not None:
                results[arm].append(data)
    summary = summarize(results)
    # the budget the runs had: the records' own (a report reads runs made with other flags)
    rounds = {d.get("budget_rounds") or 0 for runs in results.values() for d in runs}
    budget = ", ".join(f"{r} rounds" if r else f"{args.minutes} min"
                       for r in sorted(rounds or {args.rounds}))
    print(f"\nrelay task, {'tiny model (plumbing only)' if args.quick else 'SmolLM2-135M'}; "
          f"seeds {seeds}; {budget} per run; held-out {args.eval_tasks} tasks, "
          f"greedy; pooled over seeds, 95% Wilson intervals\n")
    print_table(summary)
    if args.markdown:
        print("\n" + markdown_table(summary))
    if args.plot:
        plot(results, args.plot)
        print(f"\nplot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
