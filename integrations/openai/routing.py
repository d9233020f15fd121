"""Alias routing: an agent that asks for ``model="coder"`` is sent to the version live now
(``coder@v7``, from the table named by ``AGL_BRIDGE_ALIASES``; see ``agl_bridge.aliases``).

Routing is not tracing. It decides which adapter answers, so it must not stop when tracing
does: it runs in its own slot of the shared patch (``patch.py``), inside
``suppress_instrumentation()`` and with the OpenAI instrumentor uninstrumented alike. The
tracing wrapper still records the alias asked for (``agl_bridge.policy.alias``) and the version
that answered (the response model).

On: ``enable_routing()`` (also ``agl_bridge.integrations.openai.enable_routing``); the OpenAI
instrumentor calls it when it instruments (unless ``instrument(routing=False)``), so the
zero-code path and ``opentelemetry-instrument`` turn it on. Off: ``disable_routing()`` only;
uninstrumenting tracing leaves it as it is. With ``AGL_BRIDGE_ALIASES`` unset it sends every
request as it is.

By agent (``AGL_BRIDGE_ROUTE_BY=agent``): the usual AutoGen and LangGraph team shares one model
client, so every agent asks for the same model name. Then a call goes to the live version of
the alias named after the agent that makes it (the agent the integrations record: AutoGen's
agent, LangGraph's node or ``create_agent`` name, MassGen's agent, ``agl_bridge.agent``),
whatever model it asks for; a call whose agent has no alias is routed by its model name, as
without it.

These three live here, not in ``agl_bridge.aliases``: the alias table is what routing reads, so
the table's module must not import routing back (docs/layout.md, dependency direction).
"""

from __future__ import annotations

import os
from typing import Any

from agl_bridge.aliases import ROUTE_BY_ENV, default_table
from agl_bridge.scope import current_scope

from . import patch


def route(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``(kwargs with the live version as model, the alias)``, or ``(kwargs, None)`` unchanged
    when neither the calling agent (by agent: ``AGL_BRIDGE_ROUTE_BY=agent``) nor the model is
    an alias (or no table is set)."""
    table = default_table()
    model = kwargs.get("model")
    if table is None or not isinstance(model, str):
        return kwargs, None
    alias = model
    if os.environ.get(ROUTE_BY_ENV) == "agent":
        agent = current_scope().get("agent_name")
        if isinstance(agent, str) and table.resolve(agent) is not None:
            alias = agent
    live = table.resolve(alias)
    if live is None or live == model:
        return kwargs, None
    return {**kwargs, "model": live}, alias


def enable_routing() -> None:
    """Send every OpenAI ``chat.completions.create`` of this process to the live version of the
    alias it asks for, whether or not it is traced (imports openai).

    ``OpenAIInstrumentor().instrument()`` (and so ``AGL_BRIDGE_AUTO`` and
    ``opentelemetry-instrument``) calls this unless given ``routing=False``.
    """
    patch.set_router(route)


def disable_routing() -> None:
    """Send model names as agents write them. Tracing, if on, stays on."""
    patch.set_router(None)


def routing_enabled() -> bool:
    """Whether ``enable_routing`` is in force (never imports openai to find out)."""
    return patch.router() is route
