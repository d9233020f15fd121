"""The arithmetic solver alone: one agent, one reply, rewarded 1 for the right sum.

The single-agent task ``learning_vs_trl.py`` trains on in both arms. It lives here rather than
among the demo's teams because only that benchmark uses it, and because both arms must read the
question and the reward from one place: agl-bridge's loop runs this file as its team command
(a plain ``openai`` client under zero-code capture, as ``retry.py``), and TRL's
``GRPOTrainer`` imports ``messages`` and ``reward`` from it.

The question is the demo's (``arith.QUESTION``), sent as the only user message (no system
message: the chat template's own, as TRL's ``apply_chat_template`` gives it too). Reward
``add``: 1 when the reply's last number is the sum, else 0 (``arith.final_number``).
``lower`` is the demo's toy reward for the random tiny model (``arith.score_lower``), so that
``--model tiny`` has something to train on; success there means the toy's ``correct``.

The loop records the reward in both scopes (team and agent, as every demo team), so AT-GRPO's
r = alpha * team + local is twice it; each group's advantages are divided by its standard
deviation in both trainers, so they come out the same.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import agl_bridge
from agl_bridge.trainer.loop.teams import program
from agl_bridge.trainer.loop.teams.arith import QUESTION, final_number, operands, score_lower

AGENTS = ("solver",)
REWARDS = ("add", "lower")


def messages(a: int, b: int) -> list[dict[str, str]]:
    """The prompt both arms send: the question alone."""
    return [{"role": "user", "content": QUESTION.format(a=a, b=b)}]


def reward_parts(text: str, a: int, b: int, kind: str, max_tokens: int) -> dict[str, float]:
    """``correct`` is what success counts; their sum is the reward."""
    if kind == "lower":
        return score_lower(text, max_tokens)
    return {"correct": float(final_number(text) == a + b)}


def reward(text: str, a: int, b: int, kind: str, max_tokens: int) -> float:
    return sum(reward_parts(text, a, b, kind, max_tokens).values())


async def play(task: dict, rollout: int, client: Any, sem: asyncio.Semaphore,
               args: argparse.Namespace) -> dict:
    a, b = operands(task)
    async with sem:
        with agl_bridge.episode(task_id=task["task_id"]) as episode_id:
            with agl_bridge.agent(AGENTS[0]):
                out = await client.chat.completions.create(
                    model=args.solver_model, messages=messages(a, b),
                    temperature=args.temperature, max_tokens=args.max_tokens)
            reply = out.choices[0].message.content or ""
            parts = reward_parts(reply, a, b, args.reward, args.max_tokens)
            return program.reward_and_result(task, rollout, episode_id, a, b,
                                             {AGENTS[0]: reply}, parts, {AGENTS[0]: parts},
                                             args)


def summary(results: list[dict]) -> dict[str, Any]:
    n = max(len(results), 1)
    return {"episodes": len(results), "success": sum(r["success"] for r in results) / n,
            "team_reward": sum(r["team_reward"] for r in results) / n}


def main() -> None:
    ap = program.parser(__doc__.splitlines()[0], "JSON lines: task_id, a, b")
    ap.add_argument("--solver-model", default=AGENTS[0],
                    help="the alias (the loop's table resolves it) or a served name")
    ap.add_argument("--reward", choices=REWARDS, default="add")
    program.run_openai(ap, ap.parse_args(), play, summary)


if __name__ == "__main__":
    main()
