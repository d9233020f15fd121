"""What every team program of the demo shares: the model client, the command line the loop's
environment fills in, and the run itself (tasks in, one result line per episode out, a summary
line last on stdout; ``agl_bridge.trainer.loop.team`` reads both)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from agl_bridge.trainer.loop.team import RESULTS_ENV, ROLLOUTS_ENV, TASKS_ENV, TEMPERATURE_ENV

if TYPE_CHECKING:
    from autogen_core.models import ModelInfo

MODEL_INFO: ModelInfo = {"vision": False, "function_calling": False, "json_output": False,
                         "family": "unknown", "structured_output": False}


def model_client(base_url: str, model: str, temperature: float, max_tokens: int):
    """AutoGen's own OpenAI model client, pointed at the serving vLLM."""
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    return OpenAIChatCompletionClient(model=model, base_url=base_url, api_key="unused",
                                      model_info=MODEL_INFO, temperature=temperature,
                                      max_tokens=max_tokens, max_retries=2)


def parser(description: str, tasks_help: str) -> argparse.ArgumentParser:
    """The options every team takes; what a flag leaves out comes from the environment the
    loop sets (``agl_bridge.trainer.loop.team``)."""
    env = os.environ.get
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--base-url", default=env("OPENAI_BASE_URL"))
    ap.add_argument("--tasks", default=env(TASKS_ENV), help=tasks_help)
    ap.add_argument("--results", default=env(RESULTS_ENV),
                    help="write one JSON line per episode here")
    ap.add_argument("--rollouts", type=int, default=int(env(ROLLOUTS_ENV) or 1),
                    help="episodes per task (a group)")
    ap.add_argument("--temperature", type=float, default=float(env(TEMPERATURE_ENV) or 0.0))
    ap.add_argument("--max-tokens", type=int, default=int(env("AGL_BRIDGE_MAX_TOKENS") or 16))
    ap.add_argument("--concurrency", type=int, default=128)
    return ap


#: a team's episode: (task, rollout, the agents' model clients, the concurrency limit, args)
Play = Callable[[dict, int, dict, asyncio.Semaphore, argparse.Namespace],
                Coroutine[Any, Any, dict]]
#: the same with one plain ``openai.AsyncOpenAI`` client for all its agents (``run_openai``)
PlayOpenAI = Callable[[dict, int, Any, asyncio.Semaphore, argparse.Namespace],
                      Coroutine[Any, Any, dict]]


async def run_all(tasks: list[dict], args: argparse.Namespace, play: Play,
                  agents: Sequence[str]) -> list[dict]:
    """Every task ``--rollouts`` times, at most ``--concurrency`` episodes at once (so the
    server batches them); a progress line on a terminal."""
    clients = {name: model_client(args.base_url, getattr(args, f"{name}_model"),
                                  args.temperature, args.max_tokens)
               for name in agents}
    sem = asyncio.Semaphore(args.concurrency)
    total = len(tasks) * args.rollouts
    done = 0

    async def counted(coro: Coroutine[Any, Any, dict]) -> dict:
        nonlocal done
        result = await coro
        done += 1
        if sys.stderr.isatty():
            print(f"\r  episodes {done}/{total}", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)
        return result

    try:
        return await asyncio.gather(*(counted(play(t, r, clients, sem, args))
                                      for t in tasks for r in range(args.rollouts)))
    finally:
        for c in clients.values():
            await c.close()


def run(ap: argparse.ArgumentParser, args: argparse.Namespace, play: Play,
        agents: Sequence[str], roles: Sequence[str] = ()) -> None:
    """Play the tasks with AutoGen's clients (:func:`run_all`), write the result lines, print
    the summary (with each of ``roles``' own success rate)."""
    t0 = time.perf_counter()
    results = asyncio.run(run_all(read_tasks(ap, args), args, play, agents))
    n = max(len(results), 1)
    summary: dict[str, Any] = {"episodes": len(results),
                               "success": sum(r["success"] for r in results) / n,
                               "team_reward": sum(r["team_reward"] for r in results) / n}
    if roles:
        summary["per_role"] = {a: sum(r["agent_correct"][a] for r in results) / n
                               for a in roles}
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    write_results(args, results, summary)


def run_openai(ap: argparse.ArgumentParser, args: argparse.Namespace, play: PlayOpenAI,
               summary: Callable[[list[dict]], dict[str, Any]]) -> None:
    """Play the tasks with one plain ``openai`` client that the team's agents share (``play``
    gets it in place of the clients by name), write the result lines, print ``summary``."""
    import openai

    async def run_all_openai(tasks: list[dict]) -> list[dict]:
        client = openai.AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=2)
        sem = asyncio.Semaphore(args.concurrency)
        try:
            return await asyncio.gather(*(play(t, r, client, sem, args)
                                          for t in tasks for r in range(args.rollouts)))
        finally:
            await client.close()

    results = asyncio.run(run_all_openai(read_tasks(ap, args)))
    write_results(args, results, summary(results))


def read_tasks(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict]:
    if not args.base_url or not args.tasks:
        ap.error("--base-url (or OPENAI_BASE_URL) and --tasks (or AGL_BRIDGE_TASKS) are needed")
    with open(args.tasks) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_results(args: argparse.Namespace, results: list[dict], summary: dict[str, Any]
                  ) -> None:
    """One JSON line per episode to ``--results``; the summary line last on stdout."""
    if args.results:
        with open(args.results, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print(json.dumps(summary), flush=True)


def reward_and_result(task: dict, rollout: int, episode_id: str, a: int, b: int,
                      replies: dict[str, str], team_parts: dict[str, float],
                      parts: dict[str, dict[str, float]], args: argparse.Namespace,
                      *, own_rewards: bool = True) -> dict[str, Any]:
    """Inside the episode's scope: emit the team's reward and each agent's own (unless the
    team serves without rewards, ``no_reward``), and return the episode's result line.
    ``own_rewards=False``: the agents' ``parts`` go into the result line only, for a team whose
    reward is already each agent's (one agent: the recipe's ``alpha * team + own`` would
    count the same parts twice)."""
    import agl_bridge

    if not getattr(args, "no_reward", False):  # production serves without a reward
        agl_bridge.emit_reward(team_parts, scope="team")
        for name, own in (parts.items() if own_rewards else ()):
            with agl_bridge.agent(name):
                agl_bridge.emit_reward(own, scope="agent")
    return {"task_id": task["task_id"], "rollout": rollout, "episode_id": episode_id,
            "a": a, "b": b, "replies": replies, "success": bool(team_parts["correct"]),
            "score": float(bool(team_parts["correct"])),
            "team_reward": sum(team_parts.values()),
            "agent_reward": {k: sum(v.values()) for k, v in parts.items()},
            "agent_correct": {k: bool(v["correct"]) for k, v in parts.items()}}
