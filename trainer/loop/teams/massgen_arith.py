"""A MassGen team that answers arithmetic word problems: the real ``massgen`` package, run as
the loop's team command from MassGen's own virtual environment (it pins openai 2.2).

This is "user code": MassGen 0.1.x driven by ``massgen.run`` with a config of its own, no
tracing code. Each agent's backend asks for its own alias (``model="agent_a"``), so under
``AGL_BRIDGE_AUTO=1`` with ``AGL_BRIDGE_ALIASES`` every agent is answered by its own adapter
version; ``integrations/massgen.py`` records the agent, turn and coordination round of every
call and MassGen's answers, votes, restarts and final selection. Answers and votes are
MassGen's own workflow tool calls (``new_answer``, ``vote``), the final presentation its own.

The only agl-bridge calls are the episode scope and the checker's rewards, which only the
harness can give (the vote and coordination rewards come from the spans, through the recipe
``massgen_recipe.toml``):

* team (scope team): ``correct`` 1 when the final answer's last number is the right one;
* each agent (scope agent): ``answer`` 1 when its own latest answer's last number is right,
  and ``close``, partial credit for a wrong number (``partial_credit``: near the right one, or
  with some of its digits in place; up to 0.3), so that a round whose sampled answers are all
  wrong still tells a nearer answer from a farther one.

``--structured`` (the default) sends vLLM a regular expression for the reply (``extra_body``
``structured_outputs``, MassGen passes it through): one Hermes-format call of ``new_answer``
or ``vote`` with bounded strings, so every reply parses as a tool call; vLLM must serve with
``--enable-auto-tool-choice --tool-call-parser hermes`` and a chat template that shows the
tools (``massgen_chat_template.jinja``). ``--no-structured`` leaves the model free, to measure
how often it calls the tools by itself.

Tasks: JSON lines ``{"task_id", "a", "b"}`` (``story`` optional: the relay team's word problems
with distracting numbers, ``relay.make_story``). One JSON line per episode to ``--results``:
``score`` (final answer right), the answers, votes, vote accuracy, consensus; a summary line
on stdout. Run it from a scratch directory: MassGen writes ``./.massgen``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

AGENTS = ("agent_a", "agent_b")  # MassGen's agent ids and the aliases they ask for
#: the MassGen design's rewards from the spans (``agl-bridge demo --task massgen`` converts with
#: it), and the chat template vLLM serves the team with (tools shown, short system prompts)
RECIPE_FILE = Path(__file__).with_name("massgen_recipe.toml")
CHAT_TEMPLATE = Path(__file__).with_name("massgen_chat_template.jinja")
RECIPE = RECIPE_FILE.read_text()
QUESTIONS = {"story": "{story} Answer with the number.",  # a word problem with distractors
             "sum": "What is {a} + {b}? Answer with the number."}
_INT = re.compile(r"-?\d+")
# one Hermes-format call of MassGen's workflow tools; free strings bounded and without quotes,
# backslashes or newlines, so the JSON always closes and always parses
_TEXT = r'[^"\\\n<>]'
ANSWER_FORMATS = {"number": r"-?[0-9]{1,7}",
                  "equation": r"[0-9]{1,5} \+ [0-9]{1,5} = -?[0-9]{1,7}",
                  # the question's own a and b, filled in per task (``answer_regex``)
                  "operands": r"{a} \+ {b} = -?[0-9]{{1,7}}",
                  "text": _TEXT + "{1,60}"}


def answer_regex(answer_format: str, a: int, b: int) -> str:
    """The regex of a new answer's content for one task. ``operands`` pins the question's
    numbers, so that the model writes only the sum: SmolLM2 sampled at 0.4 wrote operands of
    its own (``12345 + 6 = 12345``) in about half of its answers to plain sums. It is for
    ``--question sum`` only: in a word problem, which numbers to add is the task."""
    return ANSWER_FORMATS[answer_format].format(a=a, b=b) if answer_format == "operands" \
        else ANSWER_FORMATS[answer_format]


def reply_regex(agents: int, answer: str = ANSWER_FORMATS["equation"]) -> str:
    """What ``--structured`` lets the model write: a ``new_answer`` whose content matches
    ``answer``, or a ``vote`` for one of MassGen's anonymous labels (``agent1`` ...
    ``agentN``) with a short reason."""
    labels = "|".join(f"agent{i}" for i in range(1, agents + 1))
    new = r'\{"name": "new_answer", "arguments": \{"content": "' + answer + r'"\}\}'
    vote = (r'\{"name": "vote", "arguments": \{"agent_id": "(' + labels + r')", "reason": "'
            + _TEXT + r'{1,40}"\}\}')
    return "<tool_call>(" + new + "|" + vote + ")</tool_call>"


def last_number(text: str | None) -> int | None:
    found = _INT.findall((text or "").replace(",", ""))
    return int(found[-1]) if found else None


def massgen_config(base_url: str, *, temperature: float, max_tokens: int,
                   structured: bool, agents: tuple[str, ...] = AGENTS, max_answers: int = 2,
                   answer: str = ANSWER_FORMATS["equation"],
                   timeout_s: int = 300) -> dict[str, Any]:
    """MassGen's config: one chat-completions backend per agent, its model the agent's alias.
    No filesystem or MCP tools (no ``cwd``), no change document (it is a coding-agent
    journal). ``max_answers`` new answers per agent, then it may only vote: an agent that
    always answers anew would restart the others forever. ``api_key`` stays out (MassGen
    refuses it twice): ``OPENAI_API_KEY`` is read."""
    regex = reply_regex(len(agents), answer)
    extra = {"structured_outputs": {"regex": regex}} if structured else None
    backend = {"type": "chatcompletion", "base_url": base_url, "temperature": temperature,
               "max_tokens": max_tokens}
    if extra:
        backend["extra_body"] = extra
    return {"agents": [{"id": a, "backend": {**backend, "model": a}} for a in agents],
            "orchestrator": {"max_new_answers_per_agent": max_answers,
                             "coordination": {"enable_changedoc": False}},
            "timeout_settings": {"orchestrator_timeout_seconds": timeout_s}}


def outcome(result: dict[str, Any], answer: int, agents: tuple[str, ...] = AGENTS
            ) -> dict[str, Any]:
    """What MassGen's result says of one episode, checked against the right answer: each
    agent's latest answer and whether it is right (``agent_correct``, an agent without an
    answer is not), the votes, the share of votes for a right answer, and consensus (the
    selected agent got more than half of the votes)."""
    answers: dict[str, str] = {}
    for item in result.get("answers") or []:  # in order: an agent's latest answer wins
        if isinstance(item, dict) and item.get("agent_id"):
            answers[item["agent_id"]] = str(item.get("content") or "")
    numbers = {a: last_number(answers.get(a)) for a in (*agents, *answers)}
    right = {a: got == answer for a, got in numbers.items()}
    close = {a: partial_credit(got, answer) for a, got in numbers.items()}
    votes_info = result.get("vote_results") or {}
    votes: dict[str, str] = {}
    for target, voters in (votes_info.get("voter_details") or {}).items():
        for v in voters or []:
            voter = v.get("voter") if isinstance(v, dict) else v
            if voter:
                votes[str(voter)] = str(target)
    counts = {k: int(v) for k, v in (votes_info.get("vote_counts") or {}).items()}
    selected = result.get("selected_agent")
    final = str(result.get("final_answer") or "")
    correct = selected is not None and last_number(final) == answer
    n = sum(counts.values())
    return {"selected_agent": selected, "final_answer": final[-300:], "correct": correct,
            "answers": answers, "agent_correct": right, "agent_close": close, "votes": votes,
            "vote_counts": counts,
            "vote_accuracy": (sum(right.get(t, False) for t in votes.values()) / len(votes)
                              if votes else None),
            "consensus": bool(selected) and n > 0 and 2 * counts.get(selected, 0) > n}


def partial_credit(got: int | None, want: int) -> float:
    """A wrong number's credit, up to 0.3: the arithmetic demo's closeness (an error under 10)
    or, if more, 0.3 x the share of the right number's digits it has in place, counted from
    the ones. SmolLM2 adds b to each digit of a (32 + 4 = 76, 34 + 6 = 98): off by tens, no
    closeness, but 76 has 36's ones digit, and 36 would have both."""
    from agl_bridge.trainer.loop.teams.arith import closeness

    if got is None or got == want:
        return 0.0
    right, wrong = str(abs(want))[::-1], str(abs(got))[::-1]
    in_place = sum(x == y for x, y in zip(right, wrong)) if (got < 0) == (want < 0) else 0
    return max(closeness(got, want), 0.3 * in_place / max(len(right), len(wrong)))


async def play(task: dict[str, Any], rollout: int, args: argparse.Namespace,
               sem: asyncio.Semaphore) -> dict[str, Any]:
    import massgen  # type: ignore[import-not-found]  # MassGen's own venv

    import agl_bridge
    from agl_bridge.trainer.loop.teams.relay import make_story

    a, b = int(task["a"]), int(task["b"])
    question = QUESTIONS[args.question].format(
        a=a, b=b, story=task.get("story") or make_story(a, b, task["task_id"]))
    config = massgen_config(args.base_url, temperature=args.temperature,
                            max_tokens=args.max_tokens, structured=args.structured,
                            agents=args.agents,
                            answer=answer_regex(args.answer_format, a, b),
                            max_answers=args.max_answers)
    async with sem:
        with agl_bridge.episode(task_id=task["task_id"]) as episode_id:
            t0 = time.perf_counter()
            try:
                result = await massgen.run(query=question, config_dict=config)
            except Exception as exc:  # one failed run is one failed episode, not a failed round
                print(f"massgen failed on {task['task_id']}: {exc!r}"[:500], file=sys.stderr)
                result = {}
            out = outcome(result, a + b, args.agents)
            agl_bridge.emit_reward({"correct": float(out["correct"])}, scope="team")
            for name in args.agents:
                with agl_bridge.agent(name):
                    agl_bridge.emit_reward({"answer": float(out["agent_correct"][name]),
                                            "close": out["agent_close"][name]}, scope="agent")
    return {"task_id": task["task_id"], "rollout": rollout, "episode_id": episode_id,
            "a": a, "b": b, "score": float(out["correct"]), "success": out["correct"],
            "team_reward": float(out["correct"]), "seconds": round(time.perf_counter() - t0, 2),
            "agent_reward": {a: float(out["agent_correct"][a]) + out["agent_close"][a]
                             for a in args.agents}, **out}


def measures(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """What ``agl-bridge demo --task massgen`` reports before and after, from the result lines,
    with 95% intervals: the share of votes cast for a right answer, consensus, and how often
    MassGen selected a winner at all (the spans' measures: ``span_measures``)."""
    from agl_bridge.trainer.loop.report import wilson

    votes = [(v, r["agent_correct"].get(t, False)) for r in results
             for v, t in r["votes"].items()]
    return {"votes for a right answer": wilson(sum(ok for _, ok in votes), len(votes)),
            "consensus": wilson(sum(bool(r["consensus"]) for r in results), len(results)),
            "a winner selected": wilson(sum(r["selected_agent"] is not None for r in results),
                                        len(results))}


def span_measures(spans: Path) -> dict[str, dict[str, float]]:
    """What MassGen's spans say of a run (``massgen_stats``): coordination rounds and restarts
    per task, and each agent's share of replies that were valid workflow tool calls."""
    from agl_bridge.trainer.loop.report import mean_ci, wilson
    from agl_bridge.trainer.loop.teams import massgen_stats

    stats = massgen_stats.episode_stats(spans)
    out = {"rounds per task": mean_ci([float(s.rounds) for s in stats.values()]),
           "restarts per task": mean_ci([float(s.restarts) for s in stats.values()])}
    for agent in sorted({a for s in stats.values() for a in s.replies}):
        replies = sum(s.replies.get(agent, 0) for s in stats.values())
        refused = sum(min(s.refused.get(agent, 0), s.replies.get(agent, 0))
                      for s in stats.values())
        out[f"valid tool calls, {agent}"] = wilson(replies - refused, replies)
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    n = max(len(results), 1)
    voted = [r["vote_accuracy"] for r in results if r["vote_accuracy"] is not None]
    return {"episodes": len(results), "success": sum(r["success"] for r in results) / n,
            "team_reward": sum(r["team_reward"] for r in results) / n,
            "vote_accuracy": sum(voted) / len(voted) if voted else None,
            "consensus": sum(r["consensus"] for r in results) / n,
            "selected": sum(r["selected_agent"] is not None for r in results) / n}


def patch_offline_pricing() -> None:
    """MassGen fetches a pricing file after every call (5 s timeout, failures not cached); on
    a machine without network each call would wait for it. Cost figures are not needed."""
    try:
        from massgen.token_manager.token_manager import (  # type: ignore[import-not-found]
            TokenCostCalculator,
        )
    except ImportError:
        return
    TokenCostCalculator._fetch_litellm_pricing = lambda self: None


def main(argv: list[str] | None = None) -> None:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=env("OPENAI_BASE_URL"))
    ap.add_argument("--tasks", default=env("AGL_BRIDGE_TASKS"),
                    help="JSON lines: task_id, a, b (story optional)")
    ap.add_argument("--results", default=env("AGL_BRIDGE_RESULTS"))
    ap.add_argument("--rollouts", type=int, default=int(env("AGL_BRIDGE_ROLLOUTS") or 1))
    ap.add_argument("--temperature", type=float,
                    default=float(env("AGL_BRIDGE_TEMPERATURE") or 0.0))
    ap.add_argument("--max-tokens", type=int, default=int(env("AGL_BRIDGE_MAX_TOKENS") or 96))
    ap.add_argument("--concurrency", type=int, default=8, help="MassGen runs at once")
    ap.add_argument("--agents", nargs="+", default=list(AGENTS))
    ap.add_argument("--max-answers", type=int, default=2,
                    help="new answers per agent; past them it may only vote (MassGen's "
                         "max_new_answers_per_agent)")
    ap.add_argument("--question", choices=sorted(QUESTIONS), default="story",
                    help="story: a word problem with distracting numbers; sum: a plain a + b")
    ap.add_argument("--answer-format", choices=sorted(ANSWER_FORMATS), default="equation",
                    help="with --structured: what a new answer's content may be (equation: "
                         "'a + b = c', which lets a small model write the numbers first; "
                         "operands: 'a + b = c' with the question's own a and b, for "
                         "--question sum)")
    ap.add_argument("--structured", action=argparse.BooleanOptionalAction, default=True,
                    help="constrain each reply to one workflow tool call (vLLM regex)")
    args = ap.parse_args(argv)
    args.agents = tuple(args.agents)
    if args.answer_format == "operands" and args.question != "sum":
        ap.error("--answer-format operands gives away a word problem's numbers: "
                 "use it with --question sum")
    if not args.base_url or not args.tasks:
        ap.error("--base-url (or OPENAI_BASE_URL) and --tasks (or AGL_BRIDGE_TASKS) are needed")
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    patch_offline_pricing()
    with open(args.tasks) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    t0 = time.perf_counter()

    async def run_all() -> list[dict[str, Any]]:
        sem = asyncio.Semaphore(args.concurrency)
        return await asyncio.gather(*(play(t, r, args, sem) for t in tasks
                                      for r in range(args.rollouts)))

    results = asyncio.run(run_all())
    if args.results:
        with open(args.results, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print(json.dumps({**summary(results), "seconds": round(time.perf_counter() - t0, 2)}),
          flush=True)


if __name__ == "__main__":
    main()
