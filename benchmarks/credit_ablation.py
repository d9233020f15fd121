"""Does credit assignment change what a team learns? The relay and retry tasks, arm by arm.

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
``ppo``                PPO-GAE: each reward at the end of its turn, a critic (a value head per
                       adapter) and GAE advantages over the agent's turns (``--convert.algorithm
                       ppo``; the demo's lam, vf_coef, cliprange_value and critic learning rate)
=====================  =========================================================================

``--task retry`` (issue 34) runs ``agl-bridge demo --task retry`` instead: one solver over up to
three turns of one conversation, told too high or too low until right, rewarded once at the end;
its arms are ``at_grpo``, ``lightning_rl`` and ``ppo`` (the same switches), and besides team
success (the solver's own is the same there) the table gives the demo's own measures of the
task, right at the first reply and replies per task, before and after with 95% intervals.
Its runs and records go under ``retry/`` of ``--workdir`` and ``--results``.

Per arm and seed: held-out team success before and after (greedy, ``--eval-tasks``), each role's
own success before and after, the task's own measures, 95% intervals (Wilson's for rates);
pooled over seeds, each arm's difference from ``at_grpo`` after training with a 95% interval
(normal approximation of two proportions). Nothing is tuned on the held-out set: every arm runs
the demo's defaults but its own switch.

Run: ``.venv/bin/python benchmarks/credit_ablation.py [--task relay|retry] [--arms a,b,...]
[--seeds 0,1] [--rounds 4 | --rounds 0 --minutes 20] [--eval-tasks 200] [--workdir runs/ablation]
[--json PATH]``; a run whose record is in ``--results`` (default
``benchmarks/results/ablation/[retry/]<arm>-seed<k>.json``, committed: the runs outlive a
machine) or whose ``state.json`` says it finished is not run again. ``--quick``: the tiny random
model, one round, 20 held-out tasks: the plumbing only; it keeps records only in a ``--results``
given explicitly (never the committed ones), marked ``"model": "tiny"``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AT_GRPO: list[str] = []  # the demo's defaults
LIGHTNING_RL = ["--convert.algorithm", "lightning_rl"]
PPO = ["--convert.algorithm", "ppo"]  # the critic's settings stay the demo's ([train] lam, ...)


@dataclass(frozen=True)
class Task:
    """One ``agl-bridge demo --task``: its arms (name -> the demo flags the arm adds), the roles
    whose own success the demo reports (``agents``), the team's own measures it reports by name
    (``measures``: a rate or a mean, each with its interval), and the folder under
    ``--workdir`` and ``--results`` its runs and records go to ('' for the top: relay's, as
    they were before there was a second task)."""

    name: str
    arms: dict[str, list[str]]
    roles: tuple[str, ...]
    measures: tuple[str, ...] = ()
    folder: str = ""
    reference: str = "at_grpo"  # the arm every other is compared with


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("relay", {
        "at_grpo": AT_GRPO,
        "shared": ["--train.policy", "shared"],
        "lightning_rl": LIGHTNING_RL,
        "reader_only": ["--train.train-agents", "reader"],
        "solver_only": ["--train.train-agents", "solver"],
        "dr_mas": ["--convert.per-agent-advantages"],
        "tree": ["--branch", "4", "--rollouts", "1"],
        "sft": ["--train.objective", "sft"],
        "sft_threshold": ["--train.objective", "sft", "--train.sft-select", "threshold",
                          "--train.sft-min-reward", "1.0"],
        "ppo": PPO,
    }, ("reader", "solver")),
    # trainer/loop/teams/retry.py: measures() names these; the solver's own success is the team's
    Task("retry", {"at_grpo": AT_GRPO, "lightning_rl": LIGHTNING_RL, "ppo": PPO}, ("solver",),
         ("right at the first reply", "replies per task"), folder="retry"),
)}
Z95 = 1.959964


RECORD_KEYS = ("baseline", "final", "rounds", "ablation_seconds")


def record(data: dict, task: Task, arm: str, seed: int, args: argparse.Namespace) -> dict:
    """What the table needs of a finished run, small enough to commit: its evaluations before
    and after, its rounds, its wall time, and what produced it."""
    out = {k: data[k] for k in RECORD_KEYS if k in data}
    out.update(task=task.name, arm=arm, seed=seed, model=_model(args), eval_tasks=args.eval_tasks,
               budget_rounds=1 if args.quick else args.rounds, commit=_commit(),
               finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    return out


def _model(args: argparse.Namespace) -> str:
    return "tiny" if args.quick else "smollm2"


def arm_flags(task: Task, arm: str, seed: int, args: argparse.Namespace, work: Path
              ) -> list[str]:
    """The ``agl-bridge demo`` arguments of one run: the task, the seed, the budget, the
    held-out size and the arm's own switch."""
    # A budget in rounds is the same training for every arm whatever else the machine runs; a
    # budget in minutes is what a user has, but the machine's load then decides the rounds.
    minutes = 24 * 60 if args.rounds else args.minutes
    flags = ["demo", "--task", task.name, "--workdir", str(work), "--seed", str(seed),
             "--minutes", str(minutes), "--eval-size", str(args.eval_tasks), *task.arms[arm]]
    if args.rounds:
        flags += ["--rounds", str(args.rounds)]
    if args.quick:
        flags += ["--model", "tiny", "--rounds", "1", "--tasks-per-round", "4",
                  "--gate-size", "4"]
    return flags


def kept_record(task: Task, arm: str, seed: int, args: argparse.Namespace) -> Path | None:
    """Where the run's record is kept: ``--results[/folder]/<arm>-seed<k>.json``; none for a
    quick run unless ``--results`` was given."""
    if not args.results or (args.quick and not args.results_given):
        return None
    return Path(args.results) / task.folder / f"{arm}-seed{seed}.json"


def read_record(path: Path, task: Task, args: argparse.Namespace) -> dict:
    """A kept record, refused when it is another task's or another model's (records written
    before there was a second task, or a model in them, are relay's on SmolLM2)."""
    data = json.loads(path.read_text())
    got = (data.get("task", "relay"), data.get("model", "smollm2"))
    if got != (task.name, _model(args)):
        raise SystemExit(f"{path}: a record of task {got[0]} on {got[1]}, not of "
                         f"{task.name} on {_model(args)}")
    return data


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO)
    return proc.stdout.strip() or "unknown"


def run_arm(task: Task, arm: str, seed: int, args: argparse.Namespace) -> dict | None:
    kept = kept_record(task, arm, seed, args)
    if kept is not None and kept.exists():
        return read_record(kept, task, args)
    work = Path(args.workdir) / task.folder / f"{arm}-seed{seed}"
    state = work / "state.json"
    if state.exists():
        data = json.loads(state.read_text())
        if "final" in data:
            return data
    if args.report:
        return None
    cmd = [str(Path(sys.executable).with_name("agl-bridge")),
           *arm_flags(task, arm, seed, args, work)]
    work.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"[{task.name} {arm} seed {seed}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    with open(work.parent / f"{arm}-seed{seed}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:  # the other arms still run; the table leaves this one out
        print(f"[{task.name} {arm} seed {seed}] failed (exit {proc.returncode}); see "
              f"{work.parent / f'{arm}-seed{seed}.log'}", file=sys.stderr, flush=True)
        return None
    data = json.loads(state.read_text())
    data["ablation_seconds"] = time.monotonic() - t0
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(record(data, task, arm, seed, args), indent=1))
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


def stats_of(evaluation: dict, key: str, task: Task) -> dict:
    """One held-out evaluation's stats of ``key``: ``team`` (the team's success), a role (its
    own success) or one of the task's measures (a rate, or a mean with its interval)."""
    if key == "team":
        return evaluation["success"]
    if key in task.roles:
        return evaluation["agents"][key]
    return evaluation["measures"][key]


def pool(stats: list[dict]) -> dict:
    """Several runs' stats of one measure as one: a rate's counts summed (``k``, ``n``); a
    mean's values pooled (``mean``, its 95% interval, ``n``), their sample variance rebuilt from
    each run's mean, interval and size: exactly the mean and interval of all the values."""
    stats = [s for s in stats if s.get("n")]
    if not stats or "mean" not in stats[0]:
        pairs = [counts(s) for s in stats]
        return {"k": sum(k for k, _ in pairs), "n": sum(n for _, n in pairs)}
    n = sum(int(s["n"]) for s in stats)
    mean = sum(s["mean"] * s["n"] for s in stats) / n
    squares = sum((s["n"] - 1) * ((s["high"] - s["mean"]) * math.sqrt(s["n"]) / Z95) ** 2
                  + s["n"] * (s["mean"] - mean) ** 2 for s in stats)
    half = Z95 * math.sqrt(squares / (n - 1) / n) if n > 1 else 0.0
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def summarize(results: dict[str, list[dict]], task: Task) -> dict:
    """Per arm, pooled over its runs: team and role success before and after as counts
    ``[before k, n, after k, n]`` (``pooled``), the task's measures before and after
    (``measures``: :func:`pool`), rounds and minutes per run, and its team success after
    training minus the reference arm's with a 95% interval."""
    out: dict = {}
    for arm, runs in results.items():
        pooled = {}
        for key in ("team", *task.roles):
            before = [counts(stats_of(d["baseline"], key, task)) for d in runs]
            after = [counts(stats_of(d["final"], key, task)) for d in runs]
            pooled[key] = [sum(k for k, _ in before), sum(n for _, n in before),
                           sum(k for k, _ in after), sum(n for _, n in after)]
        out[arm] = {"seeds": len(runs), "pooled": pooled,
                    "measures": {m: {when: pool([stats_of(d[key], m, task) for d in runs])
                                     for when, key in (("before", "baseline"),
                                                       ("after", "final"))}
                                 for m in task.measures},
                    "rounds": [_rounds(d) for d in runs],
                    "minutes": [round(d.get("ablation_seconds", 0) / 60, 1) for d in runs],
                    "commits": sorted({d["commit"] for d in runs if d.get("commit")})}
    ref = out.get(task.reference)
    for arm, s in out.items():
        if ref and arm != task.reference:
            k1, n1 = s["pooled"]["team"][2:]
            k0, n0 = ref["pooled"]["team"][2:]
            if n1 and n0:
                s["team_after_minus_reference"] = difference(k1, n1, k0, n0)
    return out


def _measure(stats: dict) -> str:
    """A pooled measure with its 95% interval: a rate (Wilson's) or a mean."""
    if not stats.get("n"):
        return "-"
    if "mean" in stats:
        return f"{stats['mean']:.2f} [{stats['low']:.2f}, {stats['high']:.2f}]"
    p, lo, hi = wilson(stats["k"], stats["n"])
    return f"{p:.1%} [{lo * 100:.1f}, {hi * 100:.1f}]"


def _difference(diff: tuple[float, float, float] | None) -> str:
    return f"{diff[0] * 100:+.1f} [{diff[1] * 100:+.1f}, {diff[2] * 100:+.1f}]" if diff else "-"


def print_table(summary: dict, task: Task) -> None:
    def cell(k: int, n: int) -> str:
        p, lo, hi = wilson(k, n)
        return f"{p:6.1%} [{lo:.1%}, {hi:.1%}]" if n else "-"

    def role(c: list[int]) -> str:
        return f"{c[0] / c[1]:.1%} -> {c[2] / c[3]:.1%}" if c[1] and c[3] else "-"

    head = [("arm", 14), ("seeds", 6), ("team before", 24), ("team after", 24)]
    head += [(f"{r} before->after", 24) for r in task.roles]
    head += [(f"{m} before -> after", max(len(m) + 18, 40)) for m in task.measures]
    head += [(f"after - {task.reference}", 26)]
    line = "".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(head))
    print(line)
    print("-" * len(line))
    for arm, s in summary.items():
        t = s["pooled"]["team"]
        cells = [arm, str(s["seeds"]), cell(t[0], t[1]), cell(t[2], t[3])]
        cells += [role(s["pooled"][r]) for r in task.roles]
        cells += [f"{_measure(s['measures'][m]['before'])} -> {_measure(s['measures'][m]['after'])}"
                  if s["seeds"] else "-" for m in task.measures]
        cells += [_difference(s.get("team_after_minus_reference"))]
        print("".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                      for i, (c, (_, w)) in enumerate(zip(cells, head))))


def markdown_table(summary: dict, task: Task) -> str:
    """The pooled table as Markdown, for the READMEs (generated, not typed)."""
    def pct(k: int, n: int) -> str:
        return f"{k / n:.1%}" if n else "-"

    def team(k: int, n: int) -> str:
        p, lo, hi = wilson(k, n)
        return f"{p:.1%} [{lo * 100:.1f}, {hi * 100:.1f}]" if n else "-"

    columns = ([f"{r}'s own" for r in task.roles] + [f"{m}, 95%" for m in task.measures])
    rows = ["| arm | seeds | team before -> after (pooled) | " + " | ".join(columns)
            + f" | after - `{task.reference}`, points |",
            "| --- | ---: | --- | " + "--- | " * len(columns) + "--- |"]
    for arm, s in summary.items():
        if not s["seeds"]:
            continue
        t = s["pooled"]["team"]
        after = team(t[2], t[3])
        cells = [f"`{arm}`", str(s["seeds"]), f"{team(t[0], t[1])} -> "
                 f"{f'**{after}**' if arm == task.reference else after}"]
        cells += [f"{pct(c[0], c[1])} -> {pct(c[2], c[3])}"
                  for c in (s["pooled"][r] for r in task.roles)]
        cells += [f"{_measure(s['measures'][m]['before'])} -> {_measure(s['measures'][m]['after'])}"
                  for m in task.measures]
        cells += [_difference(s.get("team_after_minus_reference"))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(results: dict[str, list[dict]], task: Task, path: str) -> None:
    """Team success, each role's and each of the task's measures per arm: each run after
    training (filled, 95% interval) beside its own before (hollow), so the spread between
    seeds shows next to the differences between arms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a, runs in results.items() if runs]
    panels = ([("team", "team success")] + [(r, f"{r}'s own success") for r in task.roles]
              + [(m, m) for m in task.measures])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels),
                                                      0.55 * len(arms) + 1.6), sharey=True)
    for ax, (key, title) in zip(axes, panels):
        is_mean = False
        for y, arm in enumerate(arms):
            runs = results[arm]
            for j, data in enumerate(runs):
                dy = (j - (len(runs) - 1) / 2) * 0.22
                for when, style in (("baseline", dict(mfc="white", color="0.55")),
                                    ("final", dict(color=f"C{j}"))):
                    stats = stats_of(data[when], key, task)
                    is_mean = "mean" in stats
                    if is_mean:
                        p, lo, hi = stats["mean"], stats["low"], stats["high"]
                    else:
                        p, lo, hi = (v * 100 for v in wilson(*counts(stats)))
                    ax.errorbar([p], [y + dy], xerr=[[p - lo], [hi - p]],
                                fmt="o", ms=5, capsize=2, lw=1,
                                label=(f"seed {data.get('seed', j)}, after" if when == "final"
                                       else "before"), **style)
        ax.set_title(title)
        ax.set_xlabel("held-out mean" if is_mean else "held-out success, %")
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
    ap.add_argument("--task", choices=list(TASKS), default="relay",
                    help="the demo's task; its arms: " + "; ".join(
                        f"{t.name}: {','.join(t.arms)}" for t in TASKS.values()))
    ap.add_argument("--arms", help="comma-separated (default: every arm of the task)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="per run, with --rounds 0 (the demo's budget)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="the budget in training rounds (the same for every arm whatever the "
                         "machine's load); 0: a budget of --minutes instead")
    ap.add_argument("--eval-tasks", type=int, default=200)
    ap.add_argument("--workdir", default=str(REPO / "runs" / "ablation"),
                    help="the runs' directories (a task's own folder under it: retry/)")
    ap.add_argument("--quick", action="store_true",
                    help="the tiny random model, one round: checks the plumbing, no figures")
    ap.add_argument("--json", help="also write the per-arm figures here")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: the table of the runs already recorded")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the pooled table as Markdown (the READMEs' table)")
    ap.add_argument("--plot", help="also draw each run's before and after, per arm and role, "
                                   "into this image (PNG)")
    ap.add_argument("--results",
                    help="one small JSON record per finished run, kept (committed) so that a "
                         "later session's table includes it (a task's own folder under it: "
                         "retry/); default benchmarks/results/ablation, none with --quick; "
                         "'' keeps none")
    args = ap.parse_args()
    task = TASKS[args.task]
    args.results_given = args.results is not None
    if args.results is None:
        args.results = str(REPO / "benchmarks" / "results" / "ablation")
    arms = [a for a in (args.arms or ",".join(task.arms)).split(",") if a]
    unknown = [a for a in arms if a not in task.arms]
    if unknown:
        ap.error(f"unknown arm(s) {unknown} of --task {task.name}; known: {list(task.arms)}")
    if args.quick:
        args.eval_tasks = min(args.eval_tasks, 20)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results: dict[str, list[dict]] = {a: [] for a in arms}
    for seed in seeds:  # arms alternate within each seed: the machine's load hits all alike
        for arm in arms:
            data = run_arm(task, arm, seed, args)
            if data is not None:
                results[arm].append(data)
    summary = summarize(results, task)
    # the budget the runs had: the records' own (a report reads runs made with other flags)
    rounds = {d.get("budget_rounds", 1 if args.quick else args.rounds) or 0
              for runs in results.values() for d in runs}
    budget = ", ".join(f"{r} rounds" if r else f"{args.minutes} min"
                       for r in sorted(rounds or {args.rounds}))
    print(f"\n{task.name} task, {'tiny model (plumbing only)' if args.quick else 'SmolLM2-135M'}; "
          f"seeds {seeds}; {budget} per run; held-out {args.eval_tasks} tasks, "
          f"greedy; pooled over seeds, 95% Wilson intervals\n")
    print_table(summary, task)
    commits = {c for s in summary.values() for c in s["commits"]}
    if len(commits) > 1:  # the demo may have changed between them (its gate, its defaults)
        print("\nrecords from several commits: " + "; ".join(
            f"{arm} {', '.join(s['commits'])}" for arm, s in summary.items() if s["commits"]))
    if args.markdown:
        print("\n" + markdown_table(summary, task))
    if args.plot:
        plot(results, task, args.plot)
        print(f"\nplot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps({"task": task.name, "reference": task.reference,
                                               "arms": summary}, indent=1))


if __name__ == "__main__":
    main()
