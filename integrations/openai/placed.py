"""A prompt a framework's integration placed in the messages itself, for the call being made.

MassGen builds each agent's system message around the agent's own prompt (its coordination
instructions, the answers so far and, as one section, the agent's configured
``system_message``); its integration puts the prompt there (the live version's text under a
prompt swap) and runs the agent's calls inside ``placed_prompt``. Then the swap
(``prompt_swap.py``) sends those messages as they are and records ``version``, and the ``chat``
span records ``text`` apart from the message (``agl_bridge.prompt.text``, at the messages capture
level: the agent's own prompt, what APO reads as the prompt to improve).

A context variable, so concurrent agents each carry their own; its own module, so that the
swap and the tracing wrappers both read it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Placed:
    """What a framework's integration put into the messages itself."""

    version: str | None  # the version placed; None: no prompt table in force
    text: str | None  # the agent's own prompt as placed ("": it has none); None: not known


_PLACED: ContextVar[Placed | None] = ContextVar("agl_bridge_prompt_placed", default=None)


@contextmanager
def placed_prompt(version: str | None, text: str | None = None) -> Iterator[None]:
    """Calls made inside send their messages as they are and record ``version`` and ``text``:
    the framework's integration has put that text, that version's (None: no prompt table),
    where the agent's own prompt goes."""
    token = _PLACED.set(Placed(version, text))
    try:
        yield
    finally:
        try:
            _PLACED.reset(token)
        except ValueError:  # an async generator closed from another context
            pass


def placed() -> Placed | None:
    """What was placed for the call being made (None: nothing; the swap replaces its first
    system message, which is the agent's own prompt)."""
    return _PLACED.get()


def placed_text() -> str | None:
    """The agent's own prompt as a framework placed it for the call being made (None: the call
    is not inside ``placed_prompt`` with a text; its first system message is its own)."""
    p = _PLACED.get()
    return p.text if p is not None else None
