"""Does PPO's critic track its returns in the ablation's budget? (issue 34, review point 1)

On the tiny random model with the demo's training settings (``per_agent_lora``, batch 16,
learning rate 2e-4, the critic at 10 x, ``lam`` 0.95, ``cliprange_value`` 0.2), two rounds of
32 tasks x 4 rollouts, round 1 continuing round 0's adapters and value heads, on synthetic
episodes shaped as the demo teams' rewards (the tiny model answers nothing right, so a real
team's rewards would all be equal):

* ``retry``: one solver, 1 to 3 replies of 8 tokens; right at reply k (chances .3, .15, .1)
  ends the episode with 1 - 0.1 k, else three replies and -0.2 plus ``close`` (0 to 0.15);
  the reward on the last reply (``trainer/loop/teams/retry.py``);
* ``retry-twice``: the same, counted twice, as the team emitted it before commit 55272e4;
* ``relay``: a reader and a solver, one turn each, each rewarded the team's reward (right 2%,
  else close 0-0.3) plus its own (reader: the right pair 30%, else 0.25 a right number, form
  0.2 half the time; solver: the right sum 12%, else close 0-0.3, form 0.2 a third of the
  time), shaped as ``trainer/loop/teams/relay.py``'s.

Per round and adapter it prints the first and last micro-batch's ``value_mean`` and
``return_mean`` and the round's means: how far the critic is from the returns it fits, with
``--init zero`` (a new value head at 0) and ``--init mean_return`` (the default:
``value_head_init``).

Run: ``.venv/bin/python benchmarks/critic_start.py --task retry|retry-twice|relay --init
zero|mean_return [--workdir runs/critic_start]`` (about 90 s a run on 2 cores).
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import pyarrow as pa

from agl_bridge.schema import TRANSITION_SCHEMA

TASKS, ROLLOUTS, TOKENS = 32, 4, 8


def row(rng: random.Random, episode: str, task: int, agent: str, turn: int,
        prompt: list[int], reward: float) -> dict:
    return {"episode_id": episode, "task_id": f"t{task}", "agent_name": agent,
            "turn_index": turn, "prompt_ids": prompt,
            "completion_ids": [rng.randrange(40, 250) for _ in range(TOKENS)],
            "completion_mask": [1] * TOKENS, "behaviour_logprobs": None, "reward": reward,
            "group_id": f"task:t{task}|agent:{agent}|turn:{turn}", "advantage": None,
            "merged_calls": 1, "retokenized": False}


def retry_round(seed: int, twice: bool) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for t in range(TASKS):
        for r in range(ROLLOUTS):
            u = rng.random()
            right = 0 if u < .3 else 1 if u < .45 else 2 if u < .55 else None
            n = 3 if right is None else right + 1
            end = (1.0 - 0.1 * right if right is not None
                   else -0.2 + rng.choice([0.0, 0.0, 0.075, 0.15]))
            end *= 2 if twice else 1
            for k in range(n):  # the conversation grows: question, replies, hints
                prompt = [257] + [40 + t % 50] * 6 + [100 + j % 90 for j in range(14 * k)]
                rows.append(row(rng, f"s{seed}t{t}r{r}", t, "solver", k, prompt,
                                end if k == n - 1 else 0.0))
    return pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA)


def relay_round(seed: int) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for t in range(TASKS):
        for r in range(ROLLOUTS):
            team = 1.0 if rng.random() < .02 else rng.choice([0.0, 0.1, 0.2, 0.3])
            own = {"reader": (1.0 if rng.random() < .3 else 0.25 * rng.choice([0, 0, 1, 1, 2]))
                   + (0.2 if rng.random() < .5 else 0.0),
                   "solver": (1.0 if rng.random() < .12 else rng.choice([0.0, 0.1, 0.2, 0.3]))
                   + (0.2 if rng.random() < 1 / 3 else 0.0)}
            for k, agent in enumerate(("reader", "solver")):
                prompt = [257, 258 + k] + [40 + t % 50] * (30 if k == 0 else 6)
                rows.append(row(rng, f"s{seed}t{t}r{r}", t, agent, 0, prompt,
                                team + own[agent]))
    return pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("retry", "retry-twice", "relay"), default="retry")
    ap.add_argument("--init", choices=("zero", "mean_return"), default="mean_return")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default="runs/critic_start")
    args = ap.parse_args()

    from agl_bridge.trainer.models.tiny import build_tiny_model
    from agl_bridge.trainer.training import GRPOConfig, train_policy

    work = Path(args.workdir)
    model = work / "model"
    if not model.exists():
        build_tiny_model(model)
    adapters = work / f"{args.task}-{args.init}"
    shutil.rmtree(adapters, ignore_errors=True)
    init = None
    for rnd in range(args.rounds):
        data = relay_round(rnd) if args.task == "relay" else retry_round(
            rnd, args.task == "retry-twice")
        cfg = GRPOConfig(policy="per_agent_lora", learning_rate=2e-4,
                         per_device_train_batch_size=16, lora_r=16, lora_alpha=32, seed=rnd,
                         value_head_init=args.init)
        result = train_policy(data, model, adapters, algorithm="ppo", config=cfg,
                              init_adapters=init, progress=False)
        init = dict(result.adapters)
        for name in sorted({m["adapter"] for m in result.metrics}):
            ms = [m for m in result.metrics if m["adapter"] == name]
            value = sum(m["value_mean"] for m in ms) / len(ms)
            ret = sum(m["return_mean"] for m in ms) / len(ms)
            print(f"{args.task} {args.init} round {rnd} {name}: {len(ms)} micro-batches; value "
                  f"{ms[0]['value_mean']:+.3f} -> {ms[-1]['value_mean']:+.3f}, return "
                  f"{ms[0]['return_mean']:+.3f} -> {ms[-1]['return_mean']:+.3f}; round means: "
                  f"value {value:+.3f}, return {ret:+.3f}, value - return {value - ret:+.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
