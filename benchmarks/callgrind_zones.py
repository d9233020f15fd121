"""Inclusive instruction counts of single Python functions, for ``integration_callgrind.py``.

Callgrind sees C functions only: a Python function's cost is spread over the interpreter's
``_PyEval_EvalFrameDefault``. This file, run in the worker as ``AGL_CALLGRIND_PATCH``, routes
each function of interest through a C function of the standard library that does nothing but
call it and that the steps never call otherwise, so that C function's inclusive count in
``callgrind_annotate --inclusive=yes`` is the Python function's (calls it makes included):

* ``_operator_call`` (``operator.call``): ``ScopeSpanProcessor.on_start``;
* ``partial_vectorcall`` (``functools.partial``): the provider's whole ``on_start`` (all
  processors, this file's counting wrapper of ours included);
* ``uncached_lru_cache_wrapper`` (``lru_cache(maxsize=0)``): AutoGen: ``scoped`` blocks
  (made, entered and left); LangGraph: ``context_with_scope``;
* ``starmap_next`` (``itertools.starmap``): the openai request's ``scope_attributes``;
* ``methodcaller_call`` (``operator.methodcaller``): LangGraph: the handler's callbacks.

Calls per name go to ``$AGL_ZONES_OUT`` (JSON, warm-up steps included: 25 steps with the
defaults). Usage::

    AGL_ZONES_FRAMEWORK=autogen AGL_ZONES_OUT=/tmp/counts.json \
    AGL_CALLGRIND_PATCH=benchmarks/callgrind_zones.py AGL_CALLGRIND_KEEP=/tmp/cg \
        .venv/bin/python benchmarks/integration_callgrind.py --frameworks autogen --modes full
    callgrind_annotate --inclusive=yes /tmp/cg/autogen-full.out | grep -E \
        ':_operator_call |partial_vectorcall |uncached_lru|starmap_next |methodcaller_call '

The wrappers add work outside the zones, so the step's total is not the plain run's.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import json
import operator
import os
from typing import Any

from opentelemetry import trace

CALLS: collections.Counter[str] = collections.Counter()


def _counted(name: str, call: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        return call(*args, **kwargs)
    return wrapper


def via_operator_call(fn: Any, name: str) -> Any:
    return _counted(name, lambda *a, **k: operator.call(fn, *a, **k))


def via_partial(fn: Any, name: str) -> Any:
    return _counted(name, functools.partial(fn))


def via_lru(fn: Any, name: str) -> Any:
    return _counted(name, functools.lru_cache(maxsize=0)(fn))


def via_starmap(fn: Any, name: str) -> Any:  # positional arguments only
    return _counted(name, lambda *args: next(itertools.starmap(fn, (args,))))


def via_methodcaller(fn: Any, name: str) -> Any:
    return _counted(name, lambda *a, **k: operator.methodcaller("__call__", *a, **k)(fn))


def install() -> None:
    from agl_bridge.otel.processors import ScopeSpanProcessor

    multi = trace.get_tracer_provider()._active_span_processor  # type: ignore[attr-defined]
    for processor in multi._span_processors:
        if isinstance(processor, ScopeSpanProcessor):
            processor.on_start = via_operator_call(processor.on_start,  # type: ignore[method-assign]
                                                   "ScopeSpanProcessor.on_start")
    multi.on_start = via_partial(multi.on_start, "provider on_start")
    framework = os.environ.get("AGL_ZONES_FRAMEWORK", "")
    if framework == "autogen":
        import agl_bridge.integrations.autogen as autogen

        scoped = autogen.scoped
        block = via_lru(lambda step, cm, *exc: cm.__enter__() if step == "enter"
                        else cm.__exit__(*exc), "scoped enter/exit")
        made = via_lru(lambda kwargs: scoped(**kwargs), "scoped made")

        class Zoned:
            def __init__(self, kwargs: dict[str, Any]) -> None:
                self.cm = made(kwargs)

            def __enter__(self) -> Any:
                return block("enter", self.cm)

            def __exit__(self, *exc: Any) -> Any:
                return block("exit", self.cm, *exc)

        autogen.scoped = lambda **kwargs: Zoned(kwargs)  # type: ignore[assignment,misc]
    if framework == "langgraph":
        import agl_bridge.integrations.langchain as langchain

        handler = langchain.LangChainInstrumentor().handler
        for name in ("on_chain_start", "on_chain_end", "on_chat_model_start", "on_llm_end"):
            setattr(handler, name, via_methodcaller(getattr(handler, name), name))
        langchain.context_with_scope = via_lru(  # type: ignore[assignment]
            langchain.context_with_scope, "context_with_scope")
    import agl_bridge.integrations.openai.request as request

    request.scope_attributes = via_starmap(  # type: ignore[assignment]
        request.scope_attributes, "openai request scope_attributes")
    out = os.environ.get("AGL_ZONES_OUT")
    if out:
        atexit.register(lambda: open(out, "w").write(json.dumps(CALLS)))


install()
