"""The planner's workflow: a DAG written as JSON, checked before it runs.

A plan is a JSON list of steps, each ``{"id": "n1", "task": "n1 * 4", "tool": "calculator",
"after": ["n1"]}``: what the step does (an item to look up, or arithmetic in which ``nK`` stands
for step K's result), the tool the planner assigns it to, and the steps whose results it
needs. ``PLAN_REGEX`` is the shape the server constrains the planner's reply to (bounded, so a
reply always ends); whether the plan can run is for ``check`` to say, with the first problem
found:

* ``not JSON`` (a reply cut short) / ``no steps`` / ``duplicate id``;
* ``depends on an unknown step`` / ``a dependency cycle`` (a step after itself included);
* ``uses a result it does not wait for``: its task names ``nK`` that is not in its ``after``;
* ``waits for a result it does not use``: an edge that carries nothing (``n3: n1 * 9`` after
  ``n1`` and ``n2``), which would hide an unused lookup from the next check;
* ``a task no one tool can do``: one item alone (a lookup) or arithmetic on numbers and results
  (the calculator); ``peach + pear`` or ``2 limes`` is neither;
* ``several final steps``: a result nobody uses (the workflow's answer is its one final step).

The shape of a valid plan: steps, dependency edges, depth (steps on the longest chain).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agl_bridge.trainer.loop.teams.flow_world import PRICES, TOOLS, evaluate, plural, price

MAX_STEPS = 4
_ID = r'"n[1-4]"'
_TEXT = r'"[a-z0-9 +*()-]{1,20}"'
_TOOL = "(" + "|".join(f'"{t}"' for t in TOOLS) + ")"
_STEP = (r'\{"id": ' + _ID + r', "task": ' + _TEXT + r', "tool": ' + _TOOL
         + r', "after": \[(' + _ID + r'(, ' + _ID + r'){0,2})?\]\}')
PLAN_REGEX = r"\[" + _STEP + r"(, " + _STEP + r"){0," + str(MAX_STEPS - 1) + r"}\]"
CALL_REGEX = r'\{"tool": ' + _TOOL + r', "input": "[a-z0-9 +*()-]{1,20}"\}'

# the checks, in order; reading problems (not JSON, not a list, a step without its fields)
# count as failing the first
CHECKS = ("no steps", "duplicate id", "depends on an unknown step",
          "uses a result it does not wait for", "waits for a result it does not use",
          "a task no one tool can do", "a dependency cycle", "several final steps")
_REF = re.compile(r"\bn(\d+)\b")
_ARITHMETIC = re.compile(r"\d\s*[-+*]\s*[\d(]|\)\s*[-+*]|^\s*\d+\s*$")
_ITEM_WORDS = {**{w: w for w in PRICES}, **{plural(w): w for w in PRICES},
               **{w + "s": w for w in PRICES}}


@dataclass(frozen=True)
class Step:
    id: str
    task: str
    tool: str
    after: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A plan as checked: its steps in an order that runs them (dependencies first) when it
    is valid, and the first problem when it is not."""

    steps: tuple[Step, ...]
    problem: str | None = None
    edges: int = 0
    depth: int = 0

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def progress(self) -> float:
        """The share of the checks, in the order ``check`` makes them, that the plan passed
        before its first problem (1 for a valid plan): a planner's partial credit."""
        if self.problem is None:
            return 1.0
        stage = next((i for i, p in enumerate(CHECKS) if self.problem.startswith(p)), 0)
        return stage / len(CHECKS)

    @property
    def final(self) -> Step:
        return self.steps[-1]


def items_named(text: str) -> list[str]:
    """The price-list items a task names, in the singular, in order."""
    return [_ITEM_WORDS[w] for w in re.findall(r"[a-z]+", text.lower()) if w in _ITEM_WORDS]


def requirement(text: str) -> str | None:
    """The tool a task needs, as the orchestrator judges it: ``lookup`` for one item named
    without numbers, ``calculator`` for arithmetic on numbers (step results count as numbers)
    with no item, else None: no one tool can do it."""
    numbers = _REF.sub("1", text)
    items = items_named(text)
    if items:
        return "lookup" if len(items) == 1 and not re.search(r"[\d+*]", numbers) else None
    return "calculator" if _ARITHMETIC.search(numbers) else None


def expected(text: str) -> int | None:
    """What a step's task (earlier results filled in) should come to: the named item's price,
    or the arithmetic's value; None when no one tool can do it. The validator compares the
    executor's result with it, so a call that runs but does something else (the right tool on
    another item) fails the step."""
    need = requirement(text)
    try:
        if need == "lookup":
            return price(items_named(text)[0])
        if need == "calculator":
            return evaluate(text)
    except (ValueError, KeyError, ArithmeticError):
        return None
    return None


def parse(text: str) -> list[Step] | str:
    """Steps from the planner's reply, or the problem that stops reading them."""
    try:
        raw = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        return "not a list of steps"
    steps = []
    for s in raw:
        after = s.get("after", [])
        if not (isinstance(s.get("id"), str) and isinstance(s.get("task"), str)
                and isinstance(s.get("tool"), str) and isinstance(after, list)
                and all(isinstance(a, str) for a in after)):
            return "a step without id, task, tool and after"
        steps.append(Step(s["id"], s["task"], s["tool"], tuple(after)))
    return steps


def check(text: str) -> Plan:
    """The planner's reply as a plan that can run, or with the first problem found."""
    parsed = parse(text)
    if isinstance(parsed, str):
        return Plan((), parsed)
    if not parsed:
        return Plan((), "no steps")
    ids = [s.id for s in parsed]
    if len(set(ids)) != len(ids):
        return Plan(tuple(parsed), "duplicate id")
    known = set(ids)
    for s in parsed:
        if any(a not in known for a in s.after):
            return Plan(tuple(parsed), "depends on an unknown step")
        refs = {f"n{k}" for k in _REF.findall(s.task)}
        if refs - set(s.after):
            return Plan(tuple(parsed), "uses a result it does not wait for")
        if set(s.after) - refs:
            return Plan(tuple(parsed), "waits for a result it does not use")
        if requirement(s.task) is None:
            return Plan(tuple(parsed), "a task no one tool can do")
    order = _topological(parsed)
    if order is None:
        return Plan(tuple(parsed), "a dependency cycle")
    used = {a for s in parsed for a in s.after}
    if sum(1 for s in parsed if s.id not in used) > 1:
        return Plan(tuple(parsed), "several final steps")
    depth: dict[str, int] = {}
    for s in order:
        depth[s.id] = 1 + max((depth[a] for a in s.after), default=0)
    return Plan(tuple(order), None, sum(len(set(s.after)) for s in parsed),
                max(depth.values()))


def _topological(steps: list[Step]) -> list[Step] | None:
    """Steps with every dependency before its dependents (stable), or None for a cycle."""
    done: set[str] = set()
    order: list[Step] = []
    pending = list(steps)
    while pending:
        ready = [s for s in pending if set(s.after) <= done]
        if not ready:
            return None
        for s in ready:
            order.append(s)
            done.add(s.id)
        pending = [s for s in pending if s.id not in done]
    return order


def fallback(question: str) -> Plan:
    """What the orchestrator runs when the plan cannot: the whole question as one step for an
    executor (right only for a question that needs one tool call)."""
    return Plan((Step("n1", question, "", ()),), None, 0, 1)


def plan_json(steps: list[dict[str, Any]]) -> str:
    """A plan as the planner is asked to write it (the prompt's example)."""
    return json.dumps(steps)
