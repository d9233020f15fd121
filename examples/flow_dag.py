"""A small Flow-style DAG orchestrator whose agents are LLM calls, traced for training.

The workflow for one problem: two partial sums (tasks ``left`` and ``right``, independent) and
their total (``total``, depending on both). A rule-based scheduler assigns each task to an
executor agent (round robin), the executor asks the model, a validator checks the number, and a
failed task is retried up to ``max_retries`` times. The orchestration is ordinary code; the
``agl_bridge.integrations.flow`` calls mark where it schedules, executes, validates and retries,
which is all agl-bridge needs to attribute each LLM call and reward it per task and per workflow.

    python examples/flow_dag.py --base-url http://127.0.0.1:8000/v1 --model base
"""

from __future__ import annotations

import argparse
import json
import re
from itertools import cycle

import openai

from agl_bridge.integrations.flow import Workflow


def ask(client: openai.OpenAI, model: str, a: int, b: int, max_tokens: int) -> int | None:
    reply = client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=0.0,
        messages=[{"role": "user", "content": f"What is {a} + {b}? Answer with a number."}])
    found = re.findall(r"-?\d+", reply.choices[0].message.content or "")
    return int(found[-1]) if found else None


def run_workflow(client: openai.OpenAI, model: str, problem: tuple[int, int, int, int], *,
                 agents: tuple[str, ...] = ("alice", "bob"), max_retries: int = 1,
                 max_tokens: int = 16, problem_id: str = "p0") -> dict:
    w, x, y, z = problem
    plan = {"left": ((w, x), ()), "right": ((y, z), ()), "total": (None, ("left", "right"))}
    results: dict[str, int | None] = {}
    scheduler = cycle(agents)
    with Workflow(task_id=problem_id) as wf:
        for task_id, (operands, deps) in plan.items():  # already in dependency order
            a, b = operands if operands else (results[deps[0]], results[deps[1]])
            with wf.task(task_id, depends_on=deps) as task:
                task.schedule(next(scheduler))
                for _ in range(max_retries + 1):
                    with task.execute():
                        answer = ask(client, model, a, b, max_tokens) if None not in (a, b) \
                            else None
                    if task.validate(answer is not None and answer == a + b):
                        break
                results[task_id] = answer if task.passed else None
        summary = {"workflow": wf.workflow_id,
                   "tasks": {t.task_id: {"agent": t.agent, "passed": t.passed,
                                         "retries": t.retries} for t in wf.tasks.values()}}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--problem", type=int, nargs=4, default=[2, 3, 1, 4])
    ap.add_argument("--max-retries", type=int, default=1)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    print(json.dumps(run_workflow(client, args.model, tuple(args.problem),
                                  max_retries=args.max_retries), indent=2))


if __name__ == "__main__":
    main()
