"""A Flow-style team that plans and executes: a planner writes the workflow for a price question
as a DAG, an orchestrator checks it and runs it step by step, an executor carries out each step
with a tool it chooses (a calculator, a price list), a validator checks each result and has a
failed step retried.

Written as an ordinary orchestrator on the project's Flow integration (``integrations/flow.py``:
``Workflow``, ``plan``, ``task``, ``schedule``/``execute``/``validate``) with plain ``openai``
calls and no other tracing code: run it with ``AGL_BRIDGE_AUTO=1`` and the planner's plan, each
step's schedule, execution, validation and retry, and every tool call are spans that the reward
recipes ``workflow``, ``global``, ``delegation`` and ``tool_choice`` read (docs/recipes.md).

One episode:

1. the **planner** (alias ``planner``) writes the plan (``flow_plans``: JSON steps with a task,
   the tool it assigns, and the steps it waits for), its reply constrained by the server to
   the plan's shape (``PLAN_REGEX``; vLLM's structured outputs), so every reply ends;
2. the orchestrator **checks** it (``flow_plans.check``) and records the verdict
   (``Workflow.plan``). A plan that cannot run is replaced by the whole question as one step
   (right only for a one-lookup question): executors still act, the planner gets the recipe's
   ``invalid``;
3. each step, dependencies first: **scheduled** onto the executor with the planner's
   assignment and the tool the step needs (``flow_plans.requirement``); the **executor**
   (alias ``executor``) sees the step's task with earlier results filled in and the planner's
   suggestion, and answers ``{"tool", "input"}``; the tool runs (``agl_bridge.tool`` spans);
   the **validator** passes a step whose result is what its task comes to
   (``flow_plans.expected``: the named item's price, the arithmetic's value), else the executor
   tries again (``--max-retries``), told why it failed: a call that runs but does something
   else (the lookup of another item) fails the step;
4. the team succeeds when the final step's result is the answer.

Rewards emitted inline: the team's ``correct`` (1 or 0); the planner's ``plan``, ``--plan-credit``
x the share of the checks its plan passed (``Plan.progress``: invalid plans fail in different
places, so a group of them still says which came closer); the Flow integration's own (per step:
success - 0.2 per retry, to the executor; completion, to the team). The rest comes from the
recipe at conversion (``RECIPE``: the terms above). Each result line has each role's own
score for the gate and the report: the planner's (``0.5 x valid + 0.5 x share of steps
assigned to a tool that can do them``), the executor's (share of its calls whose result was
the step's), and the workflow's measures (valid plan, steps, depth, tool accuracy, steps done
right, retries, seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import Any

import agl_bridge
from agl_bridge.integrations.flow import Workflow
from agl_bridge.scope import scoped
from agl_bridge.trainer.loop.teams import program
from agl_bridge.trainer.loop.teams.flow_plans import (
    CALL_REGEX,
    PLAN_REGEX,
    Plan,
    check,
    expected,
    fallback,
    plan_json,
    requirement,
)
from agl_bridge.trainer.loop.teams.flow_world import (
    TOOL_FUNCTIONS,
    TOOL_HELP,
    TOOLS,
    answer,
    question,
)

AGENTS = ("planner", "executor")
PLANNER, EXECUTOR = AGENTS
# the rewards derived from this team's spans at conversion (docs/recipes.md); the demo uses it
# unless --convert.rewards names another. Time is left out (beta, efficiency_weight 0): on
# shared cores a workflow's seconds measure the machine's load more than the plan.
RECIPE = """\
[terms.workflow]      # the planner's workflow (Flow scheme 1)
beta = 0.0
[terms.global]        # the team's (scheme 5)
efficiency_weight = 0.0
[terms.delegation]    # the planner: each step assigned to a tool that can do it
[terms.tool_choice]   # the executor: the right tool for the step, calls that work
"""
EXAMPLE_QUESTION = "What do 2 limes and a fig cost?"
EXAMPLE_PLAN = plan_json([
    {"id": "n1", "task": "lime", "tool": "lookup", "after": []},
    {"id": "n2", "task": "fig", "tool": "lookup", "after": []},
    {"id": "n3", "task": "n1 * 2 + n2", "tool": "calculator", "after": ["n1", "n2"]}])
PLANNER_SYSTEM = (
    "You plan a workflow as a JSON list of steps. Each step has an id, a task, the tool that "
    "does it and the ids of the steps whose results it uses (after). Tools: "
    + "; ".join(f"{t}: {TOOL_HELP[t]}" for t in TOOLS)
    + ". In a task, nK stands for the result of step nK. The last step gives the answer.")
EXECUTOR_SYSTEM = ("You carry out one step of a workflow with one tool call. Tools: "
                   + "; ".join(f"{t}: {TOOL_HELP[t]}" for t in TOOLS)
                   + '. Reply as {"tool": ..., "input": ...}.')
_CALL = re.compile(r"(calculator|lookup)\W+(.+)")


def planner_messages(q: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": PLANNER_SYSTEM},
            {"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": EXAMPLE_PLAN},
            {"role": "user", "content": q}]


def step_prompt(task: str, suggested: str | None, error: str | None = None) -> str:
    text = f"Step: {task}"
    if suggested:
        text += f"\nThe plan suggests: {suggested}"
    if error:
        text += f"\nYour last call failed: {error}. Try again."
    return text


# two worked calls before the step: the reply's shape and what goes in the input
EXECUTOR_EXAMPLES = [
    {"role": "user", "content": step_prompt("fig", "lookup")},
    {"role": "assistant", "content": '{"tool": "lookup", "input": "fig"}'},
    {"role": "user", "content": step_prompt("7 * 4", "calculator")},
    {"role": "assistant", "content": '{"tool": "calculator", "input": "7 * 4"}'}]


def executor_messages(task: str, suggested: str | None, error: str | None
                      ) -> list[dict[str, str]]:
    return [{"role": "system", "content": EXECUTOR_SYSTEM}, *EXECUTOR_EXAMPLES,
            {"role": "user", "content": step_prompt(task, suggested, error)}]


def fill(task: str, results: dict[str, int | None]) -> str:
    """A step's task with the results of earlier steps in place of their ids."""
    return re.sub(r"\bn\d+\b", lambda m: str(results.get(m.group(0), m.group(0))), task)


def tool_call(reply: str) -> tuple[str | None, str]:
    """(tool, input) from the executor's reply; tool None when it names none."""
    try:
        raw = json.loads(reply)
        if isinstance(raw, dict) and raw.get("tool") in TOOLS:
            return raw["tool"], str(raw.get("input", ""))
    except ValueError:
        pass
    found = _CALL.search(reply or "")
    return (found.group(1), found.group(2).strip(' "}')) if found else (None, "")


async def ask(client: Any, model: str, messages: list[dict[str, str]], regex: str,
              args: argparse.Namespace, max_tokens: int) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=messages, temperature=args.temperature, max_tokens=max_tokens,
        extra_body={"structured_outputs": {"regex": regex}})
    return reply.choices[0].message.content or ""


def plan_score(credit: float) -> Any:
    """How tree sampling scores a candidate plan: ``credit`` x the share of the checks it
    passes (no answer is used, so held-out runs could branch too, as Flow's ``init_workflow``
    picks among generated workflows)."""
    def score(choice: Any) -> float:
        return credit * check(choice.message.content or "").progress
    return score


async def run_step(wf: Workflow, step_id: str, after: tuple[str, ...], task: str,
                   suggested: str | None, planned: bool, results: dict[str, int | None],
                   client: Any, args: argparse.Namespace, calls: list[tuple[bool, bool]],
                   turn: list[int], replies: list[str]) -> int | None:
    """Schedule, execute (with retries) and validate one step; returns its result."""
    text = fill(task, results)
    need, want = requirement(text), expected(text)
    with wf.task(step_id, depends_on=after) as run:
        run.schedule(EXECUTOR, planner=PLANNER if planned else None,
                     assignee=suggested or None, requires=need)
        value: int | None = None
        error: str | None = None
        for _ in range(args.max_retries + 1):
            with run.execute(), scoped(turn_index=turn[0]):
                turn[0] += 1
                reply = await ask(client, args.executor_model,
                                  executor_messages(text, suggested, error), CALL_REGEX, args,
                                  args.call_tokens)
                replies.append(reply)
                tool, arg = tool_call(reply)
                value, error = None, "no tool named"
                if tool is not None:
                    try:
                        value, error = TOOL_FUNCTIONS[tool](arg), None
                    except (ValueError, KeyError, ArithmeticError) as exc:
                        error = str(exc)
                    if error is None and value != want:
                        error = f"{tool} {arg!r} does not do this step"
                    calls.append((tool == need, error is None))
            if run.validate(error is None):
                break
    return value


async def play(task: dict, rollout: int, client: Any, sem: asyncio.Semaphore,
               args: argparse.Namespace) -> dict:
    q, want = question(task), answer(task)
    async with sem:
        t0 = time.perf_counter()
        with Workflow(task_id=task["task_id"]) as wf:
            episode_id = agl_bridge.current_episode_id()
            with agl_bridge.agent(PLANNER), agl_bridge.turn(0):
                if args.branch:  # K candidate workflows, the one that passes most checks runs
                    with agl_bridge.branch(args.branch, plan_score(args.plan_credit)):
                        reply = await ask(client, args.planner_model, planner_messages(q),
                                          PLAN_REGEX, args, args.plan_tokens)
                else:
                    reply = await ask(client, args.planner_model, planner_messages(q),
                                      PLAN_REGEX, args, args.plan_tokens)
            plan = check(reply)
            if not args.branch:  # partial credit for the checks its plan passed (branched:
                with agl_bridge.agent(PLANNER):  # each candidate's own score is its credit)
                    agl_bridge.emit_reward({"plan": args.plan_credit * plan.progress},
                                           scope="agent")
            wf.plan(PLANNER, valid=plan.valid, problem=plan.problem,
                    nodes=len(plan.steps) if plan.valid else None,
                    edges=plan.edges if plan.valid else None,
                    depth=plan.depth if plan.valid else None)
            running: Plan = plan if plan.valid else fallback(q)
            results: dict[str, int | None] = {}
            calls: list[tuple[bool, bool]] = []  # (right tool, did the step) per executor call
            turn: list[int] = [0]  # the executor's next turn
            said: list[str] = []  # its replies
            for step in running.steps:
                results[step.id] = await run_step(
                    wf, step.id, step.after, step.task, step.tool or None, plan.valid, results,
                    client, args, calls, turn, said)
            success = results.get(running.final.id) == want
            agl_bridge.emit_reward({"correct": float(success)}, scope="team")
            retries = sum(t.retries for t in wf.tasks.values())
        seconds = time.perf_counter() - t0
    capable = [requirement(fill(s.task, {})) == s.tool for s in plan.steps] if plan.valid else []
    planner_score = 0.5 * plan.valid + (0.5 * sum(capable) / len(capable) if capable else 0.0)
    executor_score = sum(r and w for r, w in calls) / len(calls) if calls else 0.0
    scores = {PLANNER: planner_score, EXECUTOR: executor_score}
    return {"task_id": task["task_id"], "rollout": rollout, "episode_id": episode_id,
            "question": q, "answer": want,
            "replies": {PLANNER: reply, EXECUTOR: " | ".join(said)},
            "final": results.get(running.final.id), "success": success,
            "score": float(success), "team_reward": float(success),
            "agent_score": scores, "agent_reward": scores,
            "agent_correct": {PLANNER: bool(plan.valid and all(capable)),
                              EXECUTOR: bool(calls) and all(r and w for r, w in calls)},
            "plan_valid": plan.valid, "plan_problem": plan.problem,
            "steps": len(plan.steps) if plan.valid else None,
            "depth": plan.depth if plan.valid else None,
            "tool_calls": len(calls), "right_tool": sum(r for r, _ in calls),
            "steps_right": sum(w for _, w in calls),
            "retries": retries, "seconds": round(seconds, 3)}


def summary(results: list[dict]) -> dict[str, Any]:
    """The run's measures: team success, each role's, and the workflow's (the last stdout
    line; ``agl_bridge.trainer.loop.team`` reads it)."""
    n = max(len(results), 1)
    valid = [r for r in results if r["plan_valid"]]
    calls = sum(r["tool_calls"] for r in results)
    return {"episodes": len(results), "success": sum(r["success"] for r in results) / n,
            "team_reward": sum(r["team_reward"] for r in results) / n,
            "per_role": {a: sum(r["agent_score"][a] for r in results) / n for a in AGENTS},
            "valid_plans": len(valid) / n,
            "steps": sum(r["steps"] for r in valid) / len(valid) if valid else None,
            "depth": sum(r["depth"] for r in valid) / len(valid) if valid else None,
            "tool_accuracy": sum(r["right_tool"] for r in results) / calls if calls else None,
            "steps_right": sum(r.get("steps_right", 0) for r in results) / calls if calls
            else None,
            "retries": sum(r["retries"] for r in results) / n,
            "seconds": sum(r["seconds"] for r in results) / n}


def measures(results: list[dict]) -> dict[str, dict[str, float]]:
    """The workflow's measures over a run's result lines, with 95% intervals (Wilson for
    rates, normal for means): what ``agl-bridge demo --task flow`` reports before and after."""
    from agl_bridge.trainer.loop.report import mean_ci, wilson

    valid = [r for r in results if r["plan_valid"]]
    return {
        "valid plans": wilson(len(valid), len(results)),
        "tool accuracy": wilson(sum(r["right_tool"] for r in results),
                                sum(r["tool_calls"] for r in results)),
        "calls that did their step": wilson(sum(r.get("steps_right", 0) for r in results),
                                            sum(r["tool_calls"] for r in results)),
        "steps per valid plan": mean_ci([float(r["steps"]) for r in valid]),
        "depth per valid plan": mean_ci([float(r["depth"]) for r in valid]),
        "retries per task": mean_ci([float(r["retries"]) for r in results]),
        "seconds per task": mean_ci([float(r["seconds"]) for r in results])}


def main() -> None:
    ap = program.parser(__doc__.splitlines()[0], "JSON lines: task_id, kind, items, count")
    ap.add_argument("--planner-model", default=PLANNER)
    ap.add_argument("--executor-model", default=EXECUTOR)
    ap.add_argument("--plan-tokens", type=int, default=320,
                    help="the planner's reply at most (a 3-step plan is about 100 SmolLM2 "
                         "tokens; the tiny model's byte tokens need about 300)")
    ap.add_argument("--call-tokens", type=int, default=64, help="an executor's reply at most")
    ap.add_argument("--max-retries", type=int, default=1, help="per step, after a failed call")
    ap.add_argument("--plan-credit", type=float, default=0.5,
                    help="the planner's reward for a plan that passes every check; a plan "
                         "that fails one gets the share of the checks it passed before")
    ap.add_argument("--branch", type=int, default=0, metavar="K",
                    help="tree sampling: the planner writes K candidate workflows in one "
                         "request, each scored by the checks it passes, and the best runs "
                         "(0: off)")
    ap.add_argument("--reward", choices=("flow",), default="flow",
                    help="accepted for the demo's team command; this team has one reward")
    program.run_openai(ap, ap.parse_args(), play, summary)


if __name__ == "__main__":
    main()
