"""LangChain 1.x and LangGraph: an inheritable callback handler in every callback manager.

What training needs from a LangGraph run is its structure: which agent made each LLM call, at
which of its turns, and how control moved between agents. So spans are made only where that
structure is:

* the root run -> ``invoke_workflow {name}``; if no ``agl_bridge.episode`` is in scope, the run
  becomes the episode (its run id is the episode id);
* an agent boundary -> ``invoke_agent {name}`` with the agent's turn index (its n-th activation
  in this root run). The agent is LangChain's ``lc_agent_name`` (set by
  ``langchain.agents.create_agent(name=...)`` on every nested run), else the LangGraph node
  name (``langgraph_node``) of a plain graph whose nodes are the agents;
* a tool -> ``execute_tool {name}``;
* a chat model -> ``chat {model}``, unless the openai instrumentor already traces that call
  (``ChatOpenAI`` is the openai client underneath: one LLM span per call, with vLLM token ids);
* a change of agent -> ``agl_bridge.coordination.handoff`` (from, to): supervisor delegation,
  swarm handoffs, and ``transfer_to_<agent>`` tool calls.

The handler attaches each span's context (with the scope) at the run's start and detaches it at
its end, so the openai span and anything the user emits inside nest and carry agent and turn.
It runs inline (``run_inline``), in the caller's context, for sync and async runs alike.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from agl_bridge import semconv as sc
from agl_bridge.errors import record_error
from agl_bridge.integrations.instrumentor import Instrumentor
from agl_bridge.scope import (
    SCOPE_CONTEXT_KEY,
    attach_context,
    context_with_scope,
    current_scope,
    get_context,
    scope_attributes_of,
    scope_of,
)

logger = logging.getLogger(__name__)

HANDOFF_TOOL_PREFIX = "transfer_to_"
_GRAPH_INTERNAL_NODES = ("__start__", "__end__")


@dataclass
class _Run:
    span: Span | None
    token: Any
    agent: str | None
    root: UUID
    ctx: Any  # the context its children start from (its span, or its parent's, and scope)


@dataclass
class _Root:
    turns: Counter = field(default_factory=Counter)
    last_agent: str | None = None


def _openai_traced() -> bool:
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    return OpenAIInstrumentor().is_instrumented_by_opentelemetry


def _is_openai_model(serialized: dict[str, Any] | None, kwargs: dict[str, Any]) -> bool:
    ident = ".".join((serialized or {}).get("id") or [])
    params = kwargs.get("invocation_params") or {}
    return "langchain_openai" in ident or str(params.get("_type", "")).startswith("openai")


def _model_name(kwargs: dict[str, Any], metadata: dict[str, Any]) -> str | None:
    params = kwargs.get("invocation_params") or {}
    return (params.get("model") or params.get("model_name") or metadata.get("ls_model_name")
            or None)


class AglCallbackHandler:
    """The handler; built lazily as a ``BaseCallbackHandler`` subclass (see ``_handler_class``)."""


def _handler_class():
    from langchain_core.callbacks import BaseCallbackHandler

    class Handler(BaseCallbackHandler, AglCallbackHandler):
        run_inline = True  # same task/thread as the run: attached context reaches the model call
        raise_error = False

        def __init__(self, tracer: trace.Tracer) -> None:
            super().__init__()
            self._tracer = tracer
            self._runs: dict[UUID, _Run] = {}
            self._roots: dict[UUID, _Root] = {}
            self._lock = threading.Lock()

        # -- bookkeeping ---------------------------------------------------------------
        def _parent(self, parent_run_id: UUID | None) -> _Run | None:
            return self._runs.get(parent_run_id) if parent_run_id else None

        def _open(self, run_id: UUID, parent_run_id: UUID | None, span_name: str | None,
                  attributes: dict[str, Any], agent: str | None, kind=SpanKind.INTERNAL,
                  **scope: Any) -> _Run:
            parent = self._parent(parent_run_id)
            root = parent.root if parent else run_id
            # start from the parent run's context, not this thread's: a callback can arrive in
            # a worker whose context was copied before the parent attached its own
            ctx = context_with_scope(parent.ctx if parent else get_context(), **scope)
            span = None
            if span_name is not None:
                attrs = scope_attributes_of(ctx.get(SCOPE_CONTEXT_KEY))
                attrs.update(attributes)
                span = self._tracer.start_span(span_name, context=ctx, kind=kind,
                                               attributes=attrs)
                ctx = trace.set_span_in_context(span, ctx)
            token = attach_context(ctx)
            run = _Run(span, token, agent, root, ctx)
            with self._lock:
                self._runs[run_id] = run
            return run

        def _close(self, run_id: UUID, error: BaseException | None = None,
                   attributes: dict[str, Any] | None = None) -> None:
            with self._lock:
                run = self._runs.pop(run_id, None)
                if run is not None and run.root == run_id:
                    self._roots.pop(run_id, None)
            if run is None:
                return
            if run.span is not None:
                if attributes:
                    run.span.set_attributes(attributes)
                if error is not None:  # its text by the capture level: it can quote the prompt
                    record_error(run.span, error)
                run.span.end()
            try:  # out-of-order ends (parallel branches) must not spill errors into the app
                run.token.var.reset(run.token)
            except (ValueError, RuntimeError):
                pass

        def _handoff(self, parent: _Run, source: str | None, target: str) -> None:
            if source is None or source == target:
                return
            scope = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope_of(parent.ctx).items()
                     if k not in ("agent_name", "turn_index")}
            self._tracer.start_span(sc.SPAN_HANDOFF, context=parent.ctx, attributes={
                **scope, sc.HANDOFF_FROM: source, sc.COORDINATION_AGENT: target}).end()

        # -- chains, graphs and agents ---------------------------------------------------
        def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None,
                           metadata=None, **kwargs):
            metadata = metadata or {}
            name = kwargs.get("name") or (serialized or {}).get("name")
            parent = self._parent(parent_run_id)
            if parent is None and parent_run_id is None:  # a root run: workflow or agent
                new_root = _Root()
                with self._lock:
                    self._roots[run_id] = new_root
                current = current_scope()
                episode = None if "episode_id" in current else run_id.hex
                agent = metadata.get("lc_agent_name")
                if agent:  # create_agent(name=...) invoked directly: one activation, turn 0
                    new_root.turns[agent] += 1
                    new_root.last_agent = agent
                    self._open(run_id, None, sc.invoke_agent_span_name(agent),
                               {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}, agent,
                               episode_id=episode, agent_name=agent, turn_index=0)
                    return
                self._open(run_id, None, sc.invoke_workflow_span_name(name),
                           {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_WORKFLOW,
                            sc.GEN_AI_WORKFLOW_NAME: name or ""}, agent=None,
                           episode_id=episode)
                return
            parent_agent = parent.agent if parent else None
            node = metadata.get("langgraph_node")
            agent = metadata.get("lc_agent_name") or parent_agent
            if agent is None and node and node == name and node not in _GRAPH_INTERNAL_NODES:
                agent = node  # a plain graph whose nodes are the agents
            root = self._roots.get(parent.root) if parent else None
            if agent is None or agent == parent_agent or root is None or parent is None:
                self._open(run_id, parent_run_id, None, {}, agent)  # no span: context only
                return
            self._handoff(parent, parent_agent or root.last_agent, agent)
            with self._lock:
                turn = root.turns[agent]
                root.turns[agent] += 1
                root.last_agent = agent
            self._open(run_id, parent_run_id, sc.invoke_agent_span_name(agent),
                       {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}, agent,
                       agent_name=agent, turn_index=turn)

        def on_chain_end(self, outputs, *, run_id, **kwargs):
            self._close(run_id)

        def on_chain_error(self, error, *, run_id, **kwargs):
            self._close(run_id, error)

        on_llm_error = on_tool_error = on_chain_error  # every kind of run fails alike

        # -- chat models -----------------------------------------------------------------
        def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None,
                                metadata=None, **kwargs):
            metadata = metadata or {}
            parent = self._parent(parent_run_id)
            agent = parent.agent if parent else None
            if _is_openai_model(serialized, kwargs) and _openai_traced():
                self._open(run_id, parent_run_id, None, {}, agent)  # the openai span is the one
                return
            model = _model_name(kwargs, metadata)
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
            if model:
                attrs[sc.GEN_AI_REQUEST_MODEL] = model
            if metadata.get("ls_provider"):
                attrs[sc.GEN_AI_PROVIDER_NAME] = metadata["ls_provider"]
            self._open(run_id, parent_run_id, sc.chat_span_name(model), attrs, agent,
                       kind=SpanKind.CLIENT)

        def on_llm_end(self, response, *, run_id, **kwargs):
            attrs: dict[str, Any] = {}
            usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
            generations = [g for gs in (getattr(response, "generations", None) or []) for g in gs]
            message = getattr(generations[0], "message", None) if generations else None
            meta = getattr(message, "usage_metadata", None) or {}
            inp = meta.get("input_tokens", usage.get("prompt_tokens"))
            out = meta.get("output_tokens", usage.get("completion_tokens"))
            if inp is not None:
                attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = int(inp)
            if out is not None:
                attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = int(out)
            calls = getattr(message, "tool_calls", None) or []
            if calls:
                attrs[sc.LLM_TOOL_CALL_NAMES] = [c.get("name", "") for c in calls]
            self._close(run_id, attributes=attrs)

        # -- tools -----------------------------------------------------------------------
        def on_tool_start(self, serialized, input_str, *, run_id, parent_run_id=None,
                          metadata=None, **kwargs):
            name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
            parent = self._parent(parent_run_id)
            agent = parent.agent if parent else None
            if name.startswith(HANDOFF_TOOL_PREFIX) and parent is not None:
                target = name[len(HANDOFF_TOOL_PREFIX):]
                self._handoff(parent, agent, target)
                root = self._roots.get(parent.root)
                if root is not None:  # the target's start is this same handoff: no second span
                    root.last_agent = target
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: name}
            call_id = kwargs.get("tool_call_id") or (metadata or {}).get("tool_call_id")
            if call_id:
                attrs[sc.GEN_AI_TOOL_CALL_ID] = call_id
            self._open(run_id, parent_run_id, sc.execute_tool_span_name(name), attrs, agent)

        def on_tool_end(self, output, *, run_id, **kwargs):
            self._close(run_id)

    return Handler


def _inject(handler):
    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        # a loop, not any() over a generator: this runs for every callback manager made
        for h in instance.inheritable_handlers:
            if isinstance(h, AglCallbackHandler):
                return result
        instance.add_handler(handler, inherit=True)
        return result
    return wrapper


class LangChainInstrumentor(Instrumentor):
    """Traces LangChain runnables and LangGraph graphs through every callback manager."""

    hook_module = "langchain_core"
    requires = ("langchain-core >= 1.0, < 2",)

    def _instrument(self, **kwargs: Any) -> None:
        self.handler = _handler_class()(self.tracer(kwargs))
        self.wrap("langchain_core.callbacks.base", "BaseCallbackManager.__init__",
                  _inject(self.handler))
