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
import re

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.trainer.loop.teams import program

AGENTS = ("solver", "checker")  # the aliases they ask for; the demo reads them here
QUESTION = "Compute {a} + {b}. Reply with one line: {a} + {b} = <result>"
SOLVER_SYSTEM = None  # the question says what form to answer in
CHECKER_SYSTEM = ("You check the answer that follows the question. Reply with one line: "
                  "the question's two numbers and their correct sum, as 'a + b = c'.")
_INT = re.compile(r"-?\d+")
_FORM = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*(-?\d+)\s*\.?\s*$")


def numbers(text: str) -> list[int]:
    return [int(x) for x in _INT.findall((text or "").replace(",", ""))]


def final_number(text: str) -> int | None:
    """The number a reply commits to: the last integer in it (``27 + 19 = 46`` -> 46)."""
    found = numbers(text)
    return found[-1] if found else None


def closeness(got: int | None, want: int) -> float:
    """Partial credit for a wrong number near the right one: 0.3 x (1 - |error|/10), 0 from an
    error of 10, for no number and for the right one (``correct`` pays that)."""
    if got is None or got == want:
        return 0.0
    return 0.3 * max(0.0, 1.0 - abs(got - want) / 10.0)


def score(text: str, a: int, b: int) -> dict[str, float]:
    """Reward parts for one reply: ``correct`` (1/0), ``close`` (0.3 x (1 - |error|/10), only
    when not correct) and ``form`` (0.2 for exactly ``a + b = c`` with the task's a and b)."""
    got, want = final_number(text), a + b
    correct = float(got == want)
    close = closeness(got, want)
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


async def play(task: dict, rollout: int, clients: dict, sem: asyncio.Semaphore,
               args: argparse.Namespace) -> dict:
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
            parts = {name: score(replies.get(name, ""), a, b) if args.reward == "add" else
                     score_lower(replies.get(name, ""), args.max_tokens)
                     for name in AGENTS}
            team_parts = {"correct": parts["checker"]["correct"],
                          "close": parts["checker"]["close"]}
            return program.reward_and_result(task, rollout, episode_id, a, b, replies,
                                             team_parts, parts, args)


def main() -> None:
    ap = program.parser(__doc__.splitlines()[0], "JSON lines: task_id, a, b")
    ap.add_argument("--solver-model", default="solver")
    ap.add_argument("--checker-model", default="checker")
    ap.add_argument("--reward", choices=("add", "lower"), default="add",
                    help="add: the arithmetic reward; lower: a toy one for random tiny models")
    program.run(ap, ap.parse_args(), play, AGENTS)


if __name__ == "__main__":
    main()
