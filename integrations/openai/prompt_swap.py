"""Live prompt swap: an agent's system message is replaced by the live version of its prompt
(``writer@p3``, from the table named by ``AGL_BRIDGE_PROMPTS``; see ``agl_bridge.prompts``) on
its next call, with no change to the program.

Every framework the integrations cover sends its agents' calls through the openai client's
``chat.completions.create`` (AutoGen's and LangChain's OpenAI clients, MassGen's chat
completions backend), and the integrations put the calling agent in the scope; so the swap is
one function in the shared patch (``patch.py``), run after routing and before tracing, which
then records the swapped request and the version (``agl_bridge.prompt.version``).

Which message: the first ``system`` (or ``developer``) message gets the live text; a request
without one gets it as a first system message. The agent's own prompt is version 0: with a
table set, a call the table swaps nothing for (no entry, or ``<agent>@p0``) is recorded as
``<agent>@p0``. A call that no agent makes is never touched. The caller's message list is
never changed in place.

A framework that builds an agent's system message itself around the agent's own prompt
(MassGen: its coordination instructions, the answers so far and, as one section, the agent's
configured ``system_message``) must not lose the rest: its integration puts the live text where
the agent's own prompt goes (``live_prompt``) and runs the call inside ``placed_prompt``, so
the swap sends the messages as they are and the span records the version placed and, at the
messages capture level, the text placed (``agl_bridge.prompt.text``: the agent's own prompt
apart from the message built around it, what APO reads as the prompt to improve;
``placed.py``). The text is given with the swap off too (``placed_prompt(None, text)``), so
traces captured without a prompt table show it as well.

Off unless asked: with ``AGL_BRIDGE_PROMPTS`` unset nothing is read. A table that cannot be
used never fails a call (the alias table's rules), and neither does a request this cannot
read: the swap is skipped with a warning (``patch.py``).

On: ``enable_prompt_swap()``; the OpenAI instrumentor and the routing instrumentor call it
(so ``AGL_BRIDGE_AUTO=1`` does). Off: ``disable_prompt_swap()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agl_bridge.prompts import LivePrompt, default_prompt_table, version_name
from agl_bridge.scope import current_scope

from . import patch
from .placed import placed

SYSTEM_ROLES = ("system", "developer")


def with_prompt(messages: Sequence[Any], text: str) -> list[Any]:
    """``messages`` with the first system message's content replaced by ``text`` (a new list;
    the message replaced is a new dict), or with ``text`` as a first system message."""
    out = list(messages)
    for i, m in enumerate(out):
        if isinstance(m, Mapping) and m.get("role") in SYSTEM_ROLES:
            out[i] = {**m, "content": text}
            return out
    return [{"role": "system", "content": text}, *out]


def swap(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``(kwargs with the live prompt, its version)``; ``(kwargs, None)`` unchanged when no
    table is set or no agent makes the call."""
    table = default_prompt_table()
    if table is None:
        return kwargs, None
    framework = placed()
    if framework is not None:  # the framework placed it: its message is sent as it is
        return kwargs, framework.version
    agent = current_scope().get("agent_name")
    messages = kwargs.get("messages")
    if not isinstance(agent, str) or not agent or not isinstance(messages, Sequence) \
            or isinstance(messages, (str, bytes)):
        return kwargs, None
    live = table.live(agent)
    if live is None or live.text is None:
        return kwargs, version_name(agent, 0)
    return {**kwargs, "messages": with_prompt(messages, live.text)}, live.version


def live_prompt(agent: str) -> LivePrompt | None:
    """What the swap would give ``agent`` now: its live prompt (``text`` None for p0: its own),
    ``<agent>@p0`` when the table has no entry for it, or None when the swap is off or no table
    is set. Never raises for a table that cannot be used (the last good one is read)."""
    if not prompt_swap_enabled():
        return None
    table = default_prompt_table()
    if table is None:
        return None
    return table.live(agent) or LivePrompt(version_name(agent, 0), None)


def enable_prompt_swap() -> None:
    """Give every agent's call the live version of its prompt (imports openai)."""
    patch.set_prompt_swap(swap)


def disable_prompt_swap() -> None:
    """Send agents' messages as they wrote them."""
    patch.set_prompt_swap(None)


def prompt_swap_enabled() -> bool:
    """Whether ``enable_prompt_swap`` is in force (never imports openai to find out)."""
    return patch.prompt_swap() is swap
