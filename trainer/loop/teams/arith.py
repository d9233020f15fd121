"""A two-agent AutoGen team that does arithmetic: a solver answers, a checker gives the final line.

This is "user code": AutoGen AgentChat 0.7 agents with AutoGen's own OpenAI model client,
pointed at an OpenAI-compatible server. It contains no tracing code. Run it with
``AGL_BRIDGE_AUTO=1`` and agl-bridge captures every model call with the agent that made it, its
turn, and the token ids the server returned; ``AGL_BRIDGE_ALIASES`` makes the agents' model names
(``solver``, ``checker``) resolve to whichever adapter version is live. The only agl-bridge
calls are the episode scope and ``emit_reward``: the reward is the harness's verdict on the team's
answer, which only the harness knows.

Tasks come as JSON lines (``{"task_id", "a", "b"}``, or a replayed ``demo.question``); each
is played ``--rollouts`` times (the members of one group-relative group), up to
``--concurrency`` episodes at once, so the server batches them. One JSON line per episode goes
to ``--results``; a summary line to stdout.

Reward (verifiable, shaped so the base model scores above zero; see ``score``):
  * ``team`` (scope team): 1 if the checker's final line has the right sum, else up to 0.3 for
    being close (linear in the error, 0 beyond an error of 10);
  * ``solver`` and ``checker`` (scope agent): the same correctness and closeness for that agent's
    own reply, plus 0.2 for answering in the asked-for form ``a + b = c`` and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.trainer.loop.team import RESULTS_ENV, ROLLOUTS_ENV, TASKS_ENV, TEMPERATURE_ENV

if TYPE_CHECKING:
    from autogen_core.models import ModelInfo

QUESTION = "Compute {a} + {b}. Reply with one line: {a} + {b} = <result>"
SOLVER_SYSTEM = None  # the question says what form to answer in
CHECKER_SYSTEM = ("You check the answer that follows the question. Reply with one line: "
                  "the question's two numbers and their correct sum, as 'a + b = c'.")
MODEL_INFO: ModelInfo = {"vision": False, "function_calling": False, "json_output": False,
              "family": "unknown", "structured_output": False}
_INT = re.compile(r"-?\d+")
_FORM = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*(-?\d+)\s*\.?\s*$")


def final_number(text: str) -> int | None:
    """The number a reply commits to: the last integer in it (``27 + 19 = 46`` -> 46)."""
    found = _INT.findall((text or "").replace(",", ""))
    return int(found[-1]) if found else None


def score(text: str, a: int, b: int) -> dict[str, float]:
    """Reward parts for one reply: ``correct`` (1/0), ``close`` (0.3 x (1 - |error|/10), only
    when not correct) and ``form`` (0.2 for exactly ``a + b = c`` with the task's a and b)."""
    got, want = final_number(text), a + b
    correct = float(got == want)
    close = 0.0 if correct or got is None else 0.3 * max(0.0, 1.0 - abs(got - want) / 10.0)
    m = _FORM.match(text or "")
    form = 0.2 if m and (int(m.group(1)), int(m.group(2))) == (a, b) else 0.0
    return {"correct": correct, "close": close, "form": form}


def score_lower(text: str, max_tokens: int) -> dict[str, float]:
    """The toy reward a random tiny model can learn (the fast variant in the tests): lowercase
    ASCII letters per token the reply may have (the tiny model's tokenizer is byte-level, one
    letter per token), so every extra letter pays and nothing else does; 'correct' from 0.6."""
    share = min(1.0, sum("a" <= ch <= "z" for ch in text or "") / max_tokens)
    return {"correct": float(share >= 0.6), "close": 0.0, "form": share}


def operands(task: dict) -> tuple[int, int]:
    """A task's two numbers: ``a`` and ``b``, or the question a service recorded
    (``demo.question``, ``"a + b"``: what ``agl-bridge replay --field demo.question`` gives)."""
    if "a" in task and "b" in task:
        return int(task["a"]), int(task["b"])
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*", str(task.get(sc.DEMO_QUESTION, "")))
    if not m:
        raise ValueError(f"task {task.get('task_id')!r}: neither a and b nor a "
                         f"{sc.DEMO_QUESTION} of the form 'a + b'")
    return int(m.group(1)), int(m.group(2))


def _client(base_url: str, model: str, temperature: float, max_tokens: int):
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    return OpenAIChatCompletionClient(model=model, base_url=base_url, api_key="unused",
                                      model_info=MODEL_INFO, temperature=temperature,
                                      max_tokens=max_tokens, max_retries=2)


async def play(task: dict, rollout: int, clients: dict, sem: asyncio.Semaphore,
               reward: str, args: argparse.Namespace) -> dict:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import BaseTextChatMessage
    from autogen_agentchat.teams import RoundRobinGroupChat

    a, b = operands(task)
    async with sem:
        solver = AssistantAgent("solver", model_client=clients["solver"],
                                system_message=SOLVER_SYSTEM)
        checker = AssistantAgent("checker", model_client=clients["checker"],
                                 system_message=CHECKER_SYSTEM)
        team = RoundRobinGroupChat([solver, checker], max_turns=2)
        with agl_bridge.episode(task_id=task["task_id"]) as episode_id:
            if "kind" in task:  # what a service records about a request: its kind, itself
                from opentelemetry import trace

                span = trace.get_current_span()
                span.set_attribute(sc.DEMO_REQUEST_KIND, task["kind"])
                span.set_attribute(sc.DEMO_QUESTION, f"{a} + {b}")
            result = await team.run(task=QUESTION.format(a=a, b=b))
            replies = {m.source: m.content for m in result.messages
                       if isinstance(m, BaseTextChatMessage) and m.source != "user"}
            parts = {name: score(replies.get(name, ""), a, b) if reward == "add" else
                     score_lower(replies.get(name, ""), args.max_tokens)
                     for name in ("solver", "checker")}
            team_parts = {"correct": parts["checker"]["correct"],
                          "close": parts["checker"]["close"]}
            if not getattr(args, "no_reward", False):  # production serves without a reward
                agl_bridge.emit_reward(team_parts, scope="team")
                for name in ("solver", "checker"):
                    with agl_bridge.agent(name):
                        agl_bridge.emit_reward(parts[name], scope="agent")
    return {"task_id": task["task_id"], "rollout": rollout, "episode_id": episode_id,
            "a": a, "b": b, "replies": replies, "success": bool(team_parts["correct"]),
            "score": float(bool(team_parts["correct"])),
            "team_reward": sum(team_parts.values()),
            "agent_reward": {k: sum(v.values()) for k, v in parts.items()},
            "agent_correct": {k: bool(v["correct"]) for k, v in parts.items()}}


async def run_all(tasks: list[dict], args: argparse.Namespace) -> list[dict]:
    clients = {"solver": _client(args.base_url, args.solver_model, args.temperature,
                                 args.max_tokens),
               "checker": _client(args.base_url, args.checker_model, args.temperature,
                                  args.max_tokens)}
    sem = asyncio.Semaphore(args.concurrency)
    total = len(tasks) * args.rollouts
    done = 0

    async def counted(coro):
        nonlocal done
        result = await coro
        done += 1
        if sys.stderr.isatty():
            print(f"\r  episodes {done}/{total}", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)
        return result

    try:
        return await asyncio.gather(*(counted(play(t, r, clients, sem, args.reward, args))
                                      for t in tasks for r in range(args.rollouts)))
    finally:
        for c in clients.values():
            await c.close()


def main() -> None:
    # a team command of the loop: what a flag leaves out comes from the environment the loop
    # sets (agl_bridge.trainer.loop.team)
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=env("OPENAI_BASE_URL"))
    ap.add_argument("--tasks", default=env(TASKS_ENV), help="JSON lines: task_id, a, b")
    ap.add_argument("--results", default=env(RESULTS_ENV),
                    help="write one JSON line per episode here")
    ap.add_argument("--solver-model", default="solver")
    ap.add_argument("--checker-model", default="checker")
    ap.add_argument("--rollouts", type=int, default=int(env(ROLLOUTS_ENV) or 1),
                    help="episodes per task (a group)")
    ap.add_argument("--temperature", type=float, default=float(env(TEMPERATURE_ENV) or 0.0))
    ap.add_argument("--max-tokens", type=int, default=int(env("AGL_BRIDGE_MAX_TOKENS") or 16))
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--reward", choices=("add", "lower"), default="add",
                    help="add: the arithmetic reward; lower: a toy one for random tiny models")
    args = ap.parse_args()
    if not args.base_url or not args.tasks:
        ap.error("--base-url (or OPENAI_BASE_URL) and --tasks (or AGL_BRIDGE_TASKS) are needed")
    with open(args.tasks) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    t0 = time.perf_counter()
    results = asyncio.run(run_all(tasks, args))
    if args.results:
        with open(args.results, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    n = max(len(results), 1)
    print(json.dumps({"episodes": len(results),
                      "success": sum(r["success"] for r in results) / n,
                      "team_reward": sum(r["team_reward"] for r in results) / n,
                      "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
