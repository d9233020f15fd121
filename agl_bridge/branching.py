"""Tree sampling (AT-GRPO), for any framework: one agent-turn sampled K ways in one request.

Inside ``with agl_bridge.branch(k, score):`` the next ``chat.completions.create`` that is not a
stream asks the server for ``n=k`` choices at once (one prompt, so vLLM shares its prefill),
and the instrumentation

* records every choice as a candidate of that agent-turn: the request's own ``chat`` span holds
  the chosen one, a sibling ``chat`` span each of the others, each with its own completion ids
  and logprobs, ``agl_bridge.candidate.index`` (the choice's index), its score and whether it
  was chosen;
* scores each choice with ``score`` (the openai ``Choice``, as the response holds it, in; a
  finite number out) and records the scores as turn rewards of their candidates, so the
  converter compares the K candidates of one (task, agent, turn) with each other (AT-GRPO
  groups) and a candidate's reward is ``alpha * team + its score``;
* hands the framework the best-scored choice (ties: the lowest index) as an ordinary one-choice
  response, so the episode goes on from it.

Calls after the branched one, inside the same block and by the same agent in the same turn,
belong to the chosen candidate; other agents' calls in the block (a team run wrapped whole) are
left alone. The
scope must name an agent and a turn (``agl_bridge.agent``/``agl_bridge.turn``, or an
integration that sets them): a candidate's reward is keyed by them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import context as otel_context

from agl_bridge.scope import finite_number

Scorer = Callable[[Any], float]

_BRANCH_KEY = otel_context.create_key("agl_bridge.branch")


class Branch:
    """One ``branch`` block: its K, its scorer, and once a call was branched, what was chosen."""

    __slots__ = ("chosen", "k", "owner", "score", "scores")

    def __init__(self, k: int, score: Scorer) -> None:
        self.k = k
        self.score = score
        self.scores: list[float] | None = None  # per choice index, once branched
        self.chosen: int | None = None
        self.owner: tuple[Any, Any] | None = None  # (agent, turn) of the branched call

    @property
    def done(self) -> bool:
        return self.scores is not None

    def choose(self, choices: Sequence[Any]) -> int:
        """Score every choice; returns the position of the best (ties: the first)."""
        scores = [finite_number(self.score(choice),
                                f"agl_bridge.branch: score() of choice {position}")
                  for position, choice in enumerate(choices)]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        self.scores = scores
        self.chosen = best
        return best


def current_branch() -> Branch | None:
    """The innermost ``branch`` block in force here, if any."""
    value = otel_context.get_value(_BRANCH_KEY)
    return value if isinstance(value, Branch) else None


@contextlib.contextmanager
def branch(k: int, score: Scorer) -> Iterator[Branch]:
    """Sample the next LLM call inside the block ``k`` ways and continue from the best.

    ``score(choice) -> float`` is the turn-level scorer: it gets each openai ``Choice`` (its
    ``message.content``, ``message.tool_calls``, ``finish_reason``) and returns a finite number,
    higher is better. Yields the ``Branch``, whose ``scores`` and ``chosen`` are filled once
    the call was made.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"agl_bridge.branch(k): k must be an int >= 2, got {k!r}")
    if not callable(score):
        raise TypeError(f"agl_bridge.branch(score): score must be callable, got "
                        f"{type(score).__name__}")
    b = Branch(k, score)
    token = otel_context.attach(otel_context.set_value(_BRANCH_KEY, b))
    try:
        yield b
    finally:
        try:
            token.var.reset(token)  # as scope._detach: no error logged into the application
        except (ValueError, RuntimeError):  # closed from another context: nothing to undo
            pass
