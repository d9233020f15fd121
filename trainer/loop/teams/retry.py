"""A multi-turn agent: a solver answers a sum and, while wrong, is told "too high" or "too low"
and tries again, up to ``--turns`` replies; the reward comes once, at the end.

This is "user code": a plain ``openai`` client in a loop over one growing conversation, the
commonest shape of a multi-turn agent, with no tracing code but the episode scope, the agent
and turn scopes (which reply is which turn) and ``emit_reward`` at the end (only the harness
knows the answer). Every reply is a transition of its own (one per agent per turn); the hints
between them are observations, masked out of the losses. The credit problem is the one PPO with
a critic (``algorithm = "ppo"``, GAE over the agent's turns) is made for: the reward says
nothing about which reply earned it.

Reward, once, at the end of the episode, at team scope only: the team is the solver, so the team
reward is its reward (the recipe's ``r = alpha * team + own``: an own reward of the same parts
would count them twice, 2.0 for right at once and -0.4 for three wrong replies). Its parts:
  * ``correct``: 1 when the last reply's sum is right (the episode stops at the first right one);
  * ``close``: up to 0.3 for the last reply being near, when not right (as ``arith.score``);
  * ``turns``: -0.1 for every reply after the first, so that right at once pays most.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import agl_bridge
from agl_bridge.trainer.loop.teams import program
from agl_bridge.trainer.loop.teams.arith import QUESTION, final_number, operands, score

AGENTS = ("solver",)  # the alias it asks for; the demo reads it here
HINT = "No: {a} + {b} is {side} than {got}. Try again. Reply with one line: {a} + {b} = <result>"
FORM = "No number there. Reply with one line: {a} + {b} = <result>"


def hint(a: int, b: int, reply: str) -> str | None:
    """What the solver is told after ``reply``: None when it is right (the episode ends)."""
    got = final_number(reply)
    if got is None:
        return FORM.format(a=a, b=b)
    if got == a + b:
        return None
    return HINT.format(a=a, b=b, got=got, side="less" if got > a + b else "more")


def end_reward(last: str, a: int, b: int, replies: int) -> dict[str, float]:
    """The episode's reward parts from its last reply and how many replies it took."""
    parts = score(last, a, b)
    return {"correct": parts["correct"], "close": parts["close"],
            "turns": -0.1 * max(0, replies - 1)}


async def play(task: dict, rollout: int, client: Any, sem: asyncio.Semaphore,
               args: argparse.Namespace) -> dict:
    a, b = operands(task)
    messages = [{"role": "user", "content": QUESTION.format(a=a, b=b)}]
    said: list[str] = []
    async with sem:
        with agl_bridge.episode(task_id=task["task_id"]) as episode_id:
            with agl_bridge.agent(AGENTS[0]):
                for index in range(args.turns):
                    with agl_bridge.turn(index):
                        out = await client.chat.completions.create(
                            model=args.solver_model, messages=messages,
                            temperature=args.temperature, max_tokens=args.max_tokens)
                    reply = out.choices[0].message.content or ""
                    said.append(reply)
                    told = hint(a, b, reply)
                    if told is None:
                        break
                    messages += [{"role": "assistant", "content": reply},
                                 {"role": "user", "content": told}]
            parts = end_reward(said[-1], a, b, len(said))
            result = program.reward_and_result(task, rollout, episode_id, a, b,
                                               {AGENTS[0]: " | ".join(said)}, parts,
                                               {AGENTS[0]: parts}, args, own_rewards=False)
    return {**result, "turns": len(said), "first_try": final_number(said[0]) == a + b}


def summary(results: list[dict]) -> dict[str, Any]:
    """Team success (within the turns), replies per episode and right at the first reply."""
    n = max(len(results), 1)
    return {"episodes": len(results), "success": sum(r["success"] for r in results) / n,
            "team_reward": sum(r["team_reward"] for r in results) / n,
            "per_role": {AGENTS[0]: sum(r["first_try"] for r in results) / n},
            "turns": sum(r["turns"] for r in results) / n}


def measures(results: list[dict]) -> dict[str, dict[str, float]]:
    """What ``agl-bridge demo --task retry`` reports before and after, with 95% intervals."""
    from agl_bridge.trainer.loop.report import mean_ci, wilson

    return {"right at the first reply": wilson(sum(r["first_try"] for r in results),
                                               len(results)),
            "replies per task": mean_ci([float(r["turns"]) for r in results])}


def main() -> None:
    ap = program.parser(__doc__.splitlines()[0], "JSON lines: task_id, a, b")
    ap.add_argument("--solver-model", default=AGENTS[0])
    ap.add_argument("--turns", type=int, default=3, help="replies at most per episode")
    ap.add_argument("--reward", choices=("retry",), default="retry",
                    help="accepted for the demo's team command; this team has one reward")
    args = ap.parse_args()
    if args.turns < 1:
        ap.error(f"--turns must be at least 1, got {args.turns}")
    program.run_openai(ap, args, play, summary)


if __name__ == "__main__":
    main()
