"""A two-agent AutoGen team where each role sees what the other lacks: a reader and a solver.

The reader gets a short word problem with distracting numbers (a count of shelves, an age, a
temperature) and must pass on the addition it asks for, as one line ``a + b``; the solver never
sees the problem (its model context keeps only the last message: the reader's) and must compute
what it was given. The team succeeds only if both do their part, and each role's own success is
measurable on its own: the reader's line names the two right numbers; the solver's answer is the
sum of the two numbers it was given, right or wrong. Built, like the arithmetic team, as "user
code" with AutoGen AgentChat and no tracing code: run it with ``AGL_BRIDGE_AUTO=1``.

``--branch K`` samples the reader's turn K ways in one request (``agl_bridge.branch``), each
candidate scored by the reader's reward at once, and goes on from the best: tree sampling.

Tasks come as JSON lines (``{"task_id", "a", "b", "story"}``; ``story`` is made by
``make_story`` when absent). Rewards (verifiable, shaped so the base model scores above zero):

* ``team`` (scope team): ``correct`` 1 when the solver's last number is a + b, else ``close``
  up to 0.3 (linear in the error, 0 beyond 10);
* ``reader`` (scope agent): ``correct`` 1 when its first two numbers are a and b (in either
  order), else ``partial`` 0.25 per right number among them; ``form`` 0.2 for exactly ``x + y``;
* ``solver`` (scope agent): against the two numbers the reader gave it (none given: 0):
  ``correct`` / ``close`` as the team's, ``form`` 0.2 for exactly ``x + y = c`` with its x, y.

SmolLM2-135M-Instruct before training (sampled at 0.6, calibrated on 48 stories): the reader
relays the right pair about a quarter of the time, the solver computes a given pair about one
time in eight, so whole-team successes are rare and the shaped parts carry most of the signal.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re

import agl_bridge
from agl_bridge.trainer.loop.teams import program
from agl_bridge.trainer.loop.teams.arith import numbers, score

READER_SYSTEM = ("You read a word problem and pass on only the two numbers that must be "
                 "added, as one line: a + b")
SOLVER_SYSTEM = "Compute the sum the user gives. Reply with one line: a + b = <result>"
NAMES = ("Mia", "Tom", "Ana", "Raj", "Lea", "Sam")
STORIES = (
    "{name} has {d1} shelves in the shop. {name} bought {a} pens on Monday and {b} pens on "
    "Tuesday. How many pens did {name} buy?",
    "A bus with {d1} seats picked up {a} people at the first stop and {b} people at the second "
    "stop. It was {d2} degrees outside. How many people got on?",
    "{name} is {d1} years old. {name} read {a} pages yesterday and {b} pages today. How many "
    "pages did {name} read?",
    "In a garden with {d1} rows, {name} planted {a} tulips and then {b} roses. How many flowers "
    "did {name} plant?",
    "{name} walked {d1} minutes to the lake, caught {a} fish before lunch and {b} fish after "
    "lunch. How many fish did {name} catch?",
)
_PAIR = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*\.?\s*$")
AGENTS = ("reader", "solver")


def make_story(a: int, b: int, seed: str) -> str:
    """A word problem asking for a + b, with one or two distracting numbers; the same ``seed``
    always gives the same story. Distractors differ from a and b."""
    rng = random.Random(seed)
    d1, d2 = (rng.choice([x for x in range(2, 60) if x not in (a, b)]) for _ in range(2))
    return rng.choice(STORIES).format(name=rng.choice(NAMES), a=a, b=b, d1=d1, d2=d2)


def score_reader(text: str, a: int, b: int) -> dict[str, float]:
    got = numbers(text)[:2]
    correct = float(sorted(got) == sorted([a, b]))
    partial = 0.0 if correct else 0.25 * len({a, b} & set(got))
    return {"correct": correct, "partial": partial, "form": 0.2 if _PAIR.match(text or "") else 0.0}


def score_solver(text: str, given: list[int]) -> dict[str, float]:
    """The arithmetic team's reply score (``arith.score``) against the two numbers given."""
    if len(given) < 2:  # nothing to add was passed on: the solver cannot be judged
        return {"correct": 0.0, "close": 0.0, "form": 0.0}
    return score(text, given[0], given[1])


def score_team(solver_text: str, a: int, b: int) -> dict[str, float]:
    parts = score(solver_text, a, b)
    return {"correct": parts["correct"], "close": parts["close"]}


def story_of(task: dict) -> str:
    return task.get("story") or make_story(int(task["a"]), int(task["b"]), task["task_id"])


async def play(task: dict, rollout: int, clients: dict, sem: asyncio.Semaphore,
               args: argparse.Namespace) -> dict:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import BaseTextChatMessage
    from autogen_agentchat.teams import RoundRobinGroupChat
    from autogen_core.model_context import BufferedChatCompletionContext

    a, b = int(task["a"]), int(task["b"])
    async with sem:
        reader = AssistantAgent("reader", model_client=clients["reader"],
                                system_message=READER_SYSTEM)
        # the solver's context keeps the last message only: the reader's, never the problem
        solver = AssistantAgent("solver", model_client=clients["solver"],
                                system_message=SOLVER_SYSTEM,
                                model_context=BufferedChatCompletionContext(buffer_size=1))
        team = RoundRobinGroupChat([reader, solver], max_turns=2)
        with agl_bridge.episode(task_id=task["task_id"]) as episode_id:
            if args.branch:  # tree sampling: the reader's turn K ways, scored on the spot
                def reader_score(choice) -> float:
                    return sum(score_reader(choice.message.content or "", a, b).values())

                with agl_bridge.branch(args.branch, reader_score):
                    result = await team.run(task=story_of(task))
            else:
                result = await team.run(task=story_of(task))
            replies = {m.source: m.content for m in result.messages
                       if isinstance(m, BaseTextChatMessage) and m.source != "user"}
            given = numbers(replies.get("reader", ""))
            parts = {"reader": score_reader(replies.get("reader", ""), a, b),
                     "solver": score_solver(replies.get("solver", ""), given)}
            team_parts = score_team(replies.get("solver", ""), a, b)
            return program.reward_and_result(task, rollout, episode_id, a, b, replies,
                                             team_parts, parts, args)


def main() -> None:
    ap = program.parser(__doc__.splitlines()[0], "JSON lines: task_id, a, b, story")
    ap.add_argument("--reader-model", default="reader")
    ap.add_argument("--solver-model", default="solver")
    ap.add_argument("--reward", choices=("relay",), default="relay",
                    help="accepted for the demo's team command; this team has one reward")
    ap.add_argument("--branch", type=int, default=0, metavar="K",
                    help="tree sampling: sample the reader's turn K ways in one request, score "
                         "each with the reader's reward, go on from the best (0: off)")
    program.run(ap, ap.parse_args(), play, AGENTS, roles=AGENTS)


if __name__ == "__main__":
    main()
