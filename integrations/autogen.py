"""AutoGen AgentChat 0.7: agents, turns, speaker selection, handoffs and termination.

autogen-core already opens an ``invoke_agent {name}`` span around each agent's turn (in the
group chat's agent container, and in ``BaseChatAgent.run``/``run_stream``), but records no model
call and knows nothing of episodes or turns. So rather than a second agent span we wrap that
span's context manager where agentchat imported it: inside it our scope (episode, agent, turn)
is attached, so the model calls (the openai instrumentor's ``chat`` spans with vLLM token ids,
streamed or not) nest under AutoGen's span and carry the agent and its turn, and AutoGen's own
spans get the scope too (``ScopeSpanProcessor``).

* Episode: one ``run``/``run_stream`` of a team is one episode (the one in scope if there is
  one). A team run is found from the agent id AutoGen passes (``{name}_{team_id}/...``), so
  turns are counted per team run even when the user brings their own runtime.
* Turn: the n-th time an agent speaks in that run.
* Speaker selection (round robin, selector, swarm, graph, Magentic-One): an
  ``agl_bridge.coordination.select_speaker`` span with the chosen speakers; the selector's own
  LLM call (SelectorGroupChat) nests in it, attributed to the manager as an agent.
* Handoffs: a ``HandoffMessage`` before a selection -> ``agl_bridge.coordination.handoff``.
* Termination: ``agl_bridge.coordination.termination`` with the stop reason.

Errors: an exception leaving an agent's turn or a speaker selection is recorded by the capture
level (``agl_bridge.errors.record_error``). autogen-core's own ``invoke_agent`` span would record
``str(exc)`` at every level (a server error that echoes the prompt puts the prompt there), so
``_AgentTurn`` records it on that span itself and closes AutoGen's context manager as if the
turn had ended normally; the exception still propagates unchanged.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from agl_bridge import semconv as sc
from agl_bridge.errors import record_error
from agl_bridge.integrations.instrumentor import Instrumentor
from agl_bridge.otel.attributes import attribute_dict, set_scalars
from agl_bridge.scope import (
    SCOPE_CONTEXT_KEY,
    attach_context,
    context_with_scope,
    current_scope,
    detach_context,
    scope_stamp,
    scoped,
)

logger = logging.getLogger(__name__)

_CONTAINER = "autogen_agentchat.teams._group_chat._chat_agent_container"
_BASE_AGENT = "autogen_agentchat.agents._base_chat_agent"
_BASE_TEAM = "autogen_agentchat.teams._group_chat._base_group_chat"
_BASE_MANAGER = "autogen_agentchat.teams._group_chat._base_group_chat_manager"
_MANAGERS = (
    ("autogen_agentchat.teams._group_chat._round_robin_group_chat",
     "RoundRobinGroupChatManager", "round_robin"),
    ("autogen_agentchat.teams._group_chat._selector_group_chat",
     "SelectorGroupChatManager", "selector"),
    ("autogen_agentchat.teams._group_chat._swarm_group_chat", "SwarmGroupChatManager", "swarm"),
    ("autogen_agentchat.teams._group_chat._graph._digraph_group_chat",
     "GraphFlowManager", "graph"),
    ("autogen_agentchat.teams._group_chat._magentic_one._magentic_one_orchestrator",
     "MagenticOneOrchestrator", "magentic_one"),
)


@dataclass
class _TeamRun:
    episode_id: str
    task_id: str | None
    turns: Counter = field(default_factory=Counter)


class _Registry:
    """Team runs in progress, by AutoGen team id."""

    def __init__(self) -> None:
        self._runs: dict[str, _TeamRun] = {}
        self._lock = threading.Lock()

    def start(self, team_id: str) -> None:
        scope = current_scope()
        with self._lock:
            self._runs[team_id] = _TeamRun(scope.get("episode_id") or uuid.uuid4().hex,
                                           scope.get("task_id"))

    def end(self, team_id: str) -> None:
        with self._lock:
            self._runs.pop(team_id, None)

    def get(self, team_id: str | None) -> _TeamRun | None:
        return self._runs.get(team_id) if team_id else None

    def next_turn(self, run: _TeamRun, agent: str) -> int:
        with self._lock:
            turn = run.turns[agent]
            run.turns[agent] += 1
            return turn


def _team_of_agent_id(agent_id: str | None) -> str | None:
    """``{participant}_{team_id}/{key}`` -> team_id."""
    if not agent_id:
        return None
    agent_type = agent_id.split("/", 1)[0]
    return agent_type.rsplit("_", 1)[-1] if "_" in agent_type else None


def _team_of_manager(manager: Any) -> str | None:
    topic = getattr(manager, "_output_topic_type", "") or ""
    return topic.rsplit("_", 1)[-1] if topic.startswith("output_topic_") else None


class _AgentTurn:
    """One agent's turn: AutoGen's ``invoke_agent`` span context manager, with our scope
    (episode, agent, turn) attached inside it and stamped on its span.

    An exception leaving the turn is recorded on the span by the capture level
    (``record_error``) and AutoGen's context manager is closed as if the turn had ended
    normally, or it would record ``str(exc)`` (and its stack trace) whatever the level;
    cancellation and the like reach it as they are. Either way the exception propagates
    unchanged. A class, not a generator context manager: one is entered per agent turn.
    """

    __slots__ = ("_agent", "_block", "_cm", "_span", "_team_id", "_teams")

    def __init__(self, teams: _Registry, autogen_span_cm: Any, agent: str | None,
                 team_id: str | None) -> None:
        self._teams = teams
        self._cm = autogen_span_cm
        self._agent = agent
        self._team_id = team_id
        self._span: Any = None
        self._block: scoped | None = None

    def __enter__(self) -> Any:
        teams, agent = self._teams, self._agent
        run = teams.get(self._team_id)
        scope: dict[str, Any] = {"agent_name": agent}
        if run is not None:
            scope.update(episode_id=run.episode_id, task_id=run.task_id,
                         turn_index=teams.next_turn(run, agent or ""))
        elif "episode_id" not in current_scope():
            scope["episode_id"] = uuid.uuid4().hex  # a lone agent's run is its own episode
        # the scope first, then AutoGen's span inside it: the span starts in the scope, so
        # ScopeSpanProcessor stamps it in its on_start (AutoGen passes no parent context), one
        # dict update instead of a second, locked, store after the start
        block = scoped(**scope)
        merged = block.__enter__()
        self._block = block
        try:
            span = self._span = self._cm.__enter__()
        except BaseException:
            self._block = None
            block.__exit__(None, None, None)
            raise
        if span is not None and span.is_recording():
            stamp = scope_stamp(merged)[1]  # kept: the processor has just made it
            if not stamp.items() <= attribute_dict(span).items():
                # no ScopeSpanProcessor on this provider, say: stamped here, as before
                set_scalars(span, stamp)
        return span

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            span, cm = self._span, self._cm
            if exc_type is None:
                cm.__exit__(None, None, None)
            elif issubclass(exc_type, Exception):
                try:
                    if span is not None:
                        record_error(span, exc)
                finally:
                    cm.__exit__(None, None, None)
            else:  # cancellation and the like: AutoGen's manager sees them as is
                cm.__exit__(exc_type, exc, tb)
        finally:
            if self._block is not None:
                self._block.__exit__(exc_type, exc, tb)


class AutoGenInstrumentor(Instrumentor):
    """Scope, turns and coordination spans for autogen-agentchat 0.7 teams and agents."""

    hook_module = "autogen_agentchat"
    requires = ("autogen-agentchat >= 0.7, < 0.8",)

    def _instrument(self, **kwargs: Any) -> None:
        self._tracer = self.tracer(kwargs)
        self._teams = _Registry()
        self.wrap(_CONTAINER, "trace_invoke_agent_span", self._invoke_agent)
        self.wrap(_BASE_AGENT, "trace_invoke_agent_span", self._invoke_agent)
        self.wrap(_BASE_TEAM, "BaseGroupChat.run_stream", self._run_stream)
        self.wrap(_BASE_MANAGER, "BaseGroupChatManager._signal_termination", self._termination)
        for module, cls, strategy in _MANAGERS:
            try:
                self.wrap(module, f"{cls}.select_speaker", self._select_speaker(strategy))
            except (ImportError, AttributeError) as exc:  # a manager this release lacks
                logger.info("agl_bridge: autogen %s.%s not instrumented: %s", module, cls, exc)

    # -- episodes: one team run ----------------------------------------------------------------
    def _run_stream(self, wrapped, instance, args, kwargs):
        teams = self._teams

        async def run_stream():
            team_id = str(getattr(instance, "_team_id", None) or f"team-{id(instance)}")
            nested = teams.get(team_id) is not None
            if not nested:
                teams.start(team_id)
            run = teams.get(team_id)
            try:
                with scoped(episode_id=run.episode_id if run else None,
                            task_id=run.task_id if run else None):
                    async for item in wrapped(*args, **kwargs):
                        yield item
            finally:
                if not nested:
                    teams.end(team_id)
        return run_stream()

    # -- agents and turns ------------------------------------------------------------------
    def _invoke_agent(self, wrapped, instance, args, kwargs):
        agent = kwargs.get("agent_name") or (args[0] if args else None)
        return _AgentTurn(self._teams, wrapped(*args, **kwargs), agent,
                          _team_of_agent_id(kwargs.get("agent_id")))

    # -- coordination ----------------------------------------------------------------------
    def _select_speaker(self, strategy: str):
        teams = self._teams
        tracer_of = lambda: self._tracer  # noqa: E731

        async def select_speaker(wrapped, instance, args, kwargs):
            thread = args[0] if args else kwargs.get("thread") or []
            run = teams.get(_team_of_manager(instance))
            selector = getattr(instance, "_name", None) or strategy
            scope: dict[str, Any] = {"agent_name": selector}
            if run is not None:
                scope.update(episode_id=run.episode_id, task_id=run.task_id,
                             turn_index=teams.next_turn(run, selector))
            # the scope and the selection's span go into one context, attached once (not a
            # scope block with the span's context attached inside it)
            ctx = context_with_scope(None, **scope)
            merged: Any = ctx[SCOPE_CONTEXT_KEY]  # the scope in force in the selection
            stamp = scope_stamp(merged)[1]  # shared: not modified
            last = thread[-1] if thread else None
            if type(last).__name__ == "HandoffMessage":
                tracer_of().start_span(sc.SPAN_HANDOFF, context=ctx, attributes={
                    **stamp, sc.HANDOFF_FROM: getattr(last, "source", ""),
                    sc.COORDINATION_AGENT: getattr(last, "target", "")}).end()
            # what start_as_current_span(record_exception=False,
            # set_status_on_exception=False) does, without its two generator frames
            span = tracer_of().start_span(sc.SPAN_SELECT_SPEAKER, context=ctx, attributes={
                **stamp, sc.COORDINATION_STRATEGY: strategy},
                record_exception=False, set_status_on_exception=False)
            try:
                token = attach_context(trace.set_span_in_context(span, ctx))
                try:
                    chosen = await wrapped(*args, **kwargs)
                except Exception as exc:  # the selector's LLM call failed, say
                    record_error(span, exc)
                    raise
                finally:
                    detach_context(token)
                speakers = [chosen] if isinstance(chosen, str) else list(chosen or [])
                span.set_attribute(sc.COORDINATION_SPEAKERS, speakers)
                return chosen
            finally:
                span.end()
        return select_speaker

    async def _termination(self, wrapped, instance, args, kwargs):
        message = args[0] if args else kwargs.get("message")
        run = self._teams.get(_team_of_manager(instance))
        attrs = {sc.COORDINATION_REASON: str(getattr(message, "content", "") or ""),
                 sc.COORDINATION_AGENT: str(getattr(message, "source", "") or "")}
        if run is not None:
            attrs.update({sc.EPISODE_ID: run.episode_id})
            if run.task_id:
                attrs[sc.TASK_ID] = run.task_id
        self._tracer.start_span(sc.SPAN_TERMINATION, attributes=attrs).end()
        return await wrapped(*args, **kwargs)
