"""The Flow team's world: compositional price questions with checkable answers, and the two
deterministic tools its executors call (a calculator and a price list).

Three kinds of question, so that a workflow's structure matters:

* ``price``: "What does a fig cost?": one lookup (1 step);
* ``cost``: "What do 4 figs cost?": a lookup, then a multiplication that needs its result
  (2 dependent steps);
* ``pair``: "What do a fig and a lime cost together?": two independent lookups, then an
  addition that needs both (3 steps, depth 2).

A lookup cannot multiply and the calculator does not know prices: only a workflow that uses
each for what it can do answers right. Tasks are JSON lines ``{"task_id", "kind", "items",
"count"}``; the question and answer follow from them (``question``, ``answer``).
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable
from typing import Any

import agl_bridge

PRICES: dict[str, int] = {"apple": 3, "pear": 5, "plum": 2, "fig": 7, "kiwi": 4, "lime": 6,
                          "melon": 9, "peach": 8, "mango": 11, "grape": 12, "lemon": 13,
                          "cherry": 14}
KINDS = ("price", "cost", "pair")
COUNTS = range(2, 10)
TOOLS = ("calculator", "lookup")
TOOL_HELP = {"lookup": "the price of one item, e.g. fig",
             "calculator": "arithmetic on numbers: + - * and brackets, e.g. 7 * 4"}

_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                               ast.Mult: operator.mul}


def evaluate(expression: str) -> int:
    """Integer arithmetic: + - * and brackets; anything else is refused (the calculator's work,
    without its tool span: the validator recomputes a step with it)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not integer arithmetic: {expression!r}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not integer arithmetic: {expression!r}") from None
    result = value(tree.body)
    if abs(result) > 10**9:
        raise ValueError("result out of range")
    return result


def price(item: str) -> int:
    """The price of one item on the list (the lookup's work, without its tool span)."""
    key = item.strip().lower().removeprefix("a ").removeprefix("an ").strip()
    key = key[:-1] if key not in PRICES and key.endswith("s") else key
    if key not in PRICES:
        raise KeyError(f"no price for {item!r}")
    return PRICES[key]


@agl_bridge.tool(name="calculator")
def calculator(expression: str) -> int:
    """Integer arithmetic: + - * and brackets; anything else is refused."""
    return evaluate(expression)


@agl_bridge.tool(name="lookup")
def lookup(item: str) -> int:
    """The price of one item on the list."""
    return price(item)


TOOL_FUNCTIONS: dict[str, Callable[[str], int]] = {"calculator": calculator, "lookup": lookup}


def plural(item: str) -> str:
    return item + ("es" if item.endswith(("ch", "sh")) else "s")


def article(item: str) -> str:
    return ("an " if item[0] in "aeiou" else "a ") + item


def question(task: dict[str, Any]) -> str:
    items, kind = task["items"], task["kind"]
    if kind == "price":
        return f"What does {article(items[0])} cost?"
    if kind == "cost":
        return f"What do {task['count']} {plural(items[0])} cost?"
    return f"What do {article(items[0])} and {article(items[1])} cost together?"


def answer(task: dict[str, Any]) -> int:
    items, kind = task["items"], task["kind"]
    if kind == "price":
        return PRICES[items[0]]
    if kind == "cost":
        return PRICES[items[0]] * int(task["count"])
    return PRICES[items[0]] + PRICES[items[1]]


def task_space() -> list[dict[str, Any]]:
    """Every question, in a fixed order: 12 prices, 96 costs, 132 pairs (ordered)."""
    names = sorted(PRICES)
    space: list[dict[str, Any]] = [{"kind": "price", "items": [n]} for n in names]
    space += [{"kind": "cost", "items": [n], "count": c} for n in names for c in COUNTS]
    space += [{"kind": "pair", "items": [a, b]} for a in names for b in names if a != b]
    for t in space:
        t["task_id"] = task_key(t)
    return space


def task_key(task: dict[str, Any]) -> str:
    return "-".join([task["kind"], *task["items"], *([str(task["count"])]
                                                     if "count" in task else [])])


def split(eval_size: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(held-out, training pool): a fixed random sample drawn before any training, and the
    rest. The held-out set has the kinds in the proportions of the space."""
    space = task_space()
    if eval_size >= len(space):
        raise ValueError(f"eval_size {eval_size} leaves nothing to train on ({len(space)} "
                         "tasks)")
    rng = random.Random(f"flow-heldout-{seed}")
    held = rng.sample(space, eval_size)
    keys = {t["task_id"] for t in held}
    return ([{**t, "task_id": f"eval-{t['task_id']}"} for t in held],
            [t for t in space if t["task_id"] not in keys])
