"""MassGen (0.1.x): every agent's LLM calls with agent id, turn and coordination round; new
answers, votes, restarts and the final selection as coordination spans.

MassGen's bookkeeping lives in ``CoordinationTracker``; its model calls go through
``backend.stream_with_tools(..., agent_id=...)`` of one ``LLMBackend`` subclass per provider.
So the integration wraps

* every backend's ``stream_with_tools``: the call runs in the agent's scope (episode, agent,
  turn = its n-th activation, coordination round = MassGen's per-agent round), so the openai
  instrumentor's ``chat`` spans, with vLLM token ids, carry them;
* the tracker's ``add_agent_answer``, ``add_agent_vote`` (the vote's target is the real agent id:
  MassGen maps its anonymous labels back before recording), ``track_restart_signal`` and
  ``set_final_agent``: the coordination vocabulary of ``agl_bridge.coordination``, with the vote
  tallies (``Orchestrator._get_vote_results``) on the final selection, which is what vote and
  coordination rewards are computed from;
* the agents' ``get_configurable_system_message`` (``SingleAgent``, ``ConfigurableAgent``), under
  a live prompt swap (``AGL_BRIDGE_PROMPTS``): MassGen builds each agent's system message
  itself, its coordination instructions and the answers so far around the agent's own prompt
  (its configured ``system_message``, one section), so the live version's text goes there,
  not over the whole message; the agent's calls then run inside ``placed_prompt`` (the
  openai patch leaves their messages alone) and their spans record the version placed. With
  or without a swap, the spans record the text that section holds (``agl_bridge.prompt.text``,
  at the messages capture level; "" for an agent with no prompt of its own): the agent's own
  prompt apart from the coordination message, what APO reads as the prompt to improve;
* the tracker's ``track_enforcement_event``, where MassGen refuses a reply that made no usable
  workflow tool call (none, a tool not offered, an answer past the limit, a vote for an unknown
  agent) and asks again: a failed ``execute_tool`` span (``error.type`` = MassGen's reason) on
  the agent's turn that made the reply, so the ``tool_failure`` recipe term can charge that
  turn and the share of valid calls can be counted. Its API and connection errors are not the
  model's doing and are not recorded.

One tracker is one MassGen run: one episode (the one in scope when MassGen starts, else new).
A model call belongs to the run whose tracker was made in its context (MassGen's agent tasks
are started from the run's own task, so they carry it): concurrent runs in one process use the
same agent ids, and an agent id alone would give every call to the latest run.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
import threading
import uuid
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Status, StatusCode

from agl_bridge import semconv as sc
from agl_bridge.coordination import final_selection, new_answer, restart, vote
from agl_bridge.integrations.instrumentor import Instrumentor
from agl_bridge.prompts import version_name
from agl_bridge.scope import current_scope, scope_attributes, scoped, tracer

logger = logging.getLogger(__name__)

_TRACKER = "massgen.coordination_tracker"
_AGENTS = "massgen.chat_agent"  # its classes that define get_configurable_system_message
_AGENT_CLASSES = ("SingleAgent", "ConfigurableAgent")
_ORCHESTRATOR = "massgen.orchestrator"
# (module, class) of the backends whose stream_with_tools is the model call
_BACKENDS = (
    ("massgen.backend.base", "LLMBackend"),
    ("massgen.backend.chat_completions", "ChatCompletionsBackend"),
    ("massgen.backend.response", "ResponseBackend"),
    ("massgen.backend.claude", "ClaudeBackend"),
    ("massgen.backend.gemini", "GeminiBackend"),
    ("massgen.backend.lmstudio", "LMStudioBackend"),
    ("massgen.backend.inference", "InferenceBackend"),
    ("massgen.backend.azure_openai", "AzureOpenAIBackend"),
    ("massgen.backend.base_with_custom_tool_and_mcp", "CustomToolAndMCPBackend"),
)


# enforcement reasons that are no mistake of the model's (MassGen retries them too)
_NOT_THE_MODEL = frozenset({"api_error", "fatal_api_error", "connection_recovery",
                            "mcp_disconnected"})
REFUSED_TOOL = "workflow"  # the tool name of a refused reply that called no tool

# set while a wrapped stream_with_tools runs: a subclass calling super().stream_with_tools must
# not count a second activation
_IN_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("agl_bridge_massgen_call",
                                                               default=False)


# the run whose tracker was made in this context (set by the tracker's __init__ in the run's
# task, inherited by the tasks MassGen starts from it)
_RUN: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("agl_bridge_massgen_run",
                                                                      default=None)


@dataclass
class _Session:
    episode_id: str
    task_id: str | None
    tracker: Any
    activations: Counter = field(default_factory=Counter)
    orchestrator: Any = None  # weakref to the Orchestrator that owns the tracker


class _Sessions:
    def __init__(self) -> None:
        self._by_tracker: dict[int, _Session] = {}
        self._order: list[int] = []
        self._lock = threading.Lock()

    def add(self, tracker: Any) -> _Session:
        scope = current_scope()
        session = _Session(scope.get("episode_id") or uuid.uuid4().hex, scope.get("task_id"),
                           weakref.ref(tracker))
        with self._lock:
            self._by_tracker[id(tracker)] = session
            self._order.append(id(tracker))
            # forget runs whose tracker is gone
            for key in [k for k in self._order if self._by_tracker[k].tracker() is None]:
                self._order.remove(key)
                del self._by_tracker[key]
        return session

    def of_tracker(self, tracker: Any) -> _Session | None:
        return self._by_tracker.get(id(tracker))

    def of_call(self, agent_id: str | None) -> _Session | None:
        """The run a model call belongs to: the one whose tracker was made in the call's
        context, else (a call from a context MassGen's run did not start) the latest run that
        has this agent."""
        run = _RUN.get()
        tracker = run.tracker() if run is not None else None
        if tracker is not None and agent_id in (getattr(tracker, "agent_ids", None) or ()):
            return run
        with self._lock:
            for key in reversed(self._order):
                session = self._by_tracker[key]
                tracker = session.tracker()
                if tracker is not None and agent_id in (getattr(tracker, "agent_ids", None) or ()):
                    return session
        return None


@dataclass(frozen=True)
class _Placed:
    """What an agent's identity section got when MassGen last built its message."""

    version: str | None  # the live version placed; None: no prompt swap
    text: str  # the section's text: the agent's own prompt or the live version's ("" none)


def _placed_prompt(agent: str | None, placed: _Placed | None
                   ) -> contextlib.AbstractContextManager[Any]:
    """The openai integration told that this call's system message already holds the agent's
    prompt: under a prompt swap its version (when MassGen built it without asking for the
    agent's prompt: its own, p0), so MassGen's message is never replaced whole; with or without
    one, its text, which the span records apart from the message."""
    if not agent:
        return contextlib.nullcontext()
    version, text = (placed.version, placed.text) if placed is not None else (None, None)
    try:
        from agl_bridge.integrations.openai.placed import placed_prompt
        from agl_bridge.integrations.openai.prompt_swap import live_prompt

        if version is None and live_prompt(agent) is not None:
            version = version_name(agent, 0)
        if version is None and text is None:  # no swap, no text: nothing to tell it
            return contextlib.nullcontext()
        return placed_prompt(version, text)
    except Exception:  # the swap must never fail the agent's call
        logger.warning("agl_bridge: the prompt swap failed for massgen agent %s", agent,
                       exc_info=True)
        return contextlib.nullcontext()


def _round(session: _Session | None, agent: str | None) -> int | None:
    tracker = session.tracker() if session else None
    try:
        return tracker.get_agent_round(agent) if tracker is not None and agent else None
    except Exception:  # a tracker without rounds: no round, not a failed call
        return None


class MassGenInstrumentor(Instrumentor):
    """Agent scope for MassGen's model calls and its answers, votes, restarts and winner."""

    hook_module = "massgen"
    requires = ("massgen >= 0.1.90, < 0.2",)

    def _instrument(self, **kwargs: Any) -> None:
        self._sessions = _Sessions()
        for method, wrapper in (("__init__", self._tracker_init),
                                ("add_agent_answer", self._answer),
                                ("add_agent_vote", self._vote),
                                ("track_restart_signal", self._restart),
                                ("set_final_agent", self._final),
                                ("track_enforcement_event", self._enforcement)):
            self.wrap(_TRACKER, f"CoordinationTracker.{method}", wrapper)
        self.wrap(_ORCHESTRATOR, "Orchestrator.__init__", self._orchestrator_init)
        self._placed: dict[str, _Placed] = {}  # agent id -> what its message got last
        agents = importlib.import_module(_AGENTS)
        for name in _AGENT_CLASSES:
            if "get_configurable_system_message" in vars(getattr(agents, name, object)):
                self.wrap(agents, f"{name}.get_configurable_system_message", self._own_prompt)
        for module, name in _BACKENDS:
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as exc:  # a backend this release lacks
                logger.info("agl_bridge: massgen backend %s.%s not instrumented: %s",
                            module, name, exc)
                continue
            if "stream_with_tools" in vars(cls):  # only classes that define it themselves
                self.wrap(cls, "stream_with_tools", self._stream_with_tools)

    # -- runs ------------------------------------------------------------------------------
    def _tracker_init(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        _RUN.set(self._sessions.add(instance))
        return result

    def _orchestrator_init(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        session = self._sessions.of_tracker(getattr(instance, "coordination_tracker", None))
        if session is not None:
            session.orchestrator = weakref.ref(instance)
        return result

    # -- prompts ---------------------------------------------------------------------------
    def _own_prompt(self, wrapped, instance, args, kwargs):
        """The agent's own prompt, or the live version's text under a prompt swap; what it
        gave is kept for the agent's next calls' spans."""
        own = wrapped(*args, **kwargs)
        agent = getattr(instance, "agent_id", None)
        if not isinstance(agent, str):
            return own
        try:
            from agl_bridge.integrations.openai.prompt_swap import live_prompt

            live = live_prompt(agent)
        except Exception:  # the swap must never fail the agent's call: its own prompt
            logger.warning("agl_bridge: the prompt swap failed for massgen agent %s; its own "
                           "prompt is used", agent, exc_info=True)
            live = None
        text = own if live is None or live.text is None else live.text
        self._placed[agent] = _Placed(live.version if live is not None else None,
                                      text if isinstance(text, str) else "")
        return text

    # -- model calls -----------------------------------------------------------------------
    def _stream_with_tools(self, wrapped, instance, args, kwargs):
        agent = kwargs.get("agent_id")
        session = self._sessions.of_call(agent)
        if session is None or _IN_CALL.get():
            return wrapped(*args, **kwargs)
        turn = session.activations[agent]
        session.activations[agent] += 1
        scope = dict(episode_id=session.episode_id, task_id=session.task_id, agent_name=agent,
                     turn_index=turn, coordination_round=_round(session, agent))

        placed = self._placed.get(agent) if agent else None

        async def stream():
            token = _IN_CALL.set(True)
            try:
                with scoped(**scope), _placed_prompt(agent, placed):
                    async for chunk in wrapped(*args, **kwargs):
                        yield chunk
            finally:
                try:
                    _IN_CALL.reset(token)
                except ValueError:  # closed from another context (garbage collection)
                    pass
        return stream()

    # -- coordination ----------------------------------------------------------------------
    def _in_session(self, tracker: Any, agent: str | None) -> dict[str, Any]:
        session = self._sessions.of_tracker(tracker)
        if session is None:
            return {}
        return dict(episode_id=session.episode_id, task_id=session.task_id,
                    coordination_round=_round(session, agent))

    def _answer(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        agent = kwargs.get("agent_id", args[0] if args else None)
        answer = kwargs.get("answer", args[1] if len(args) > 1 else None)
        with scoped(**self._in_session(instance, agent)):
            new_answer(agent, answer if isinstance(answer, str) else None)
        return result

    def _vote(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        voter = kwargs.get("agent_id", args[0] if args else None)
        data = kwargs.get("vote_data", args[1] if len(args) > 1 else None) or {}
        target = data.get("agent_id")
        if voter and target:
            with scoped(**self._in_session(instance, voter)):
                vote(voter, target, data.get("reason"))
        return result

    def _restart(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        trigger = kwargs.get("triggering_agent", args[0] if args else None)
        agents = kwargs.get("agents_restarted", args[1] if len(args) > 1 else None) or []
        for agent in agents:
            with scoped(**self._in_session(instance, agent)):
                restart(agent, reason=f"new answer from {trigger}" if trigger else None)
        return result

    def _final(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        agent = kwargs.get("agent_id", args[0] if args else None)
        session = self._sessions.of_tracker(instance)
        counts = None
        orchestrator = session.orchestrator() if session and session.orchestrator else None
        if orchestrator is not None:
            try:
                counts = orchestrator._get_vote_results().get("vote_counts") or None
            except Exception as exc:  # tallies are a bonus; the selection is still recorded
                logger.info("agl_bridge: massgen vote results unavailable: %s", exc)
        if agent:
            with scoped(**self._in_session(instance, agent)):
                final_selection(agent, vote_counts={k: int(v) for k, v in counts.items()}
                                if counts else None)
        return result

    def _enforcement(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        agent = kwargs.get("agent_id", args[0] if args else None)
        reason = kwargs.get("reason", args[1] if len(args) > 1 else None)
        called = kwargs.get("tool_calls", args[4] if len(args) > 4 else None) or []
        session = self._sessions.of_tracker(instance)
        if session is None or not agent or reason in _NOT_THE_MODEL:
            return result
        # the refused reply is the agent's latest call: its activations so far, less one
        turn = session.activations[agent] - 1 if session.activations[agent] else None
        name = ",".join(str(c) for c in called) if called else REFUSED_TOOL
        with scoped(**self._in_session(instance, agent), agent_name=agent, turn_index=turn):
            attrs = scope_attributes()
            attrs.update({sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: name,
                          sc.ERROR_TYPE: str(reason or "refused")})
            span = tracer().start_span(sc.execute_tool_span_name(name), attributes=attrs)
            span.set_status(Status(StatusCode.ERROR, str(reason or "refused")))
            span.end()
        return result
