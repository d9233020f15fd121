"""``@agl_bridge.tool``: an ``execute_tool {name}`` span around a plain function, sync or async.

For code whose tools no framework integration sees. Arguments and results are content: they are
recorded (as JSON) only at ``AGL_BRIDGE_CAPTURE=messages``; the tool's name, duration and
failure (``error.type``) always are, which is what tool rewards and retry counts need. So is an
exception's text (it can quote the arguments): ``agl_bridge.errors.record_error``.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Any, TypeVar, overload

from opentelemetry.trace import Span, SpanKind

from agl_bridge import semconv as sc
from agl_bridge.capture import capture_messages
from agl_bridge.errors import record_error
from agl_bridge.scope import scope_attributes, tracer

F = TypeVar("F", bound=Callable[..., Any])


def _json(value: Any) -> str:
    return json.dumps(value, default=repr, ensure_ascii=False)


def _start_attributes(name: str, description: str | None, func: Callable[..., Any],
                      args: tuple, kwargs: dict) -> dict[str, Any]:
    attrs = scope_attributes()
    attrs.update({sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: name,
                  sc.GEN_AI_TOOL_TYPE: "function"})
    if description:
        attrs[sc.GEN_AI_TOOL_DESCRIPTION] = description
    if capture_messages():
        try:
            bound = inspect.signature(func).bind(*args, **kwargs)
            attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = _json(dict(bound.arguments))
        except TypeError:  # the call itself will raise the real error
            pass
    return attrs


def _finish(span: Span, result: Any) -> None:
    if capture_messages():
        span.set_attribute(sc.GEN_AI_TOOL_CALL_RESULT, _json(result))


@overload
def tool(func: F) -> F: ...
@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[F], F]: ...


def tool(func=None, *, name=None, description=None):
    """Trace each call of the decorated function as a tool execution."""

    def decorate(f: F) -> F:
        tool_name = name or f.__name__
        span_name = sc.execute_tool_span_name(tool_name)
        doc = description or (inspect.getdoc(f) or "").split("\n\n")[0] or None

        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                attrs = _start_attributes(tool_name, doc, f, args, kwargs)
                with tracer().start_as_current_span(span_name, kind=SpanKind.INTERNAL,
                                                    attributes=attrs, record_exception=False,
                                                    set_status_on_exception=False) as span:
                    try:
                        result = await f(*args, **kwargs)
                    except BaseException as exc:
                        record_error(span, exc)
                        raise
                    _finish(span, result)
                    return result
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            attrs = _start_attributes(tool_name, doc, f, args, kwargs)
            with tracer().start_as_current_span(span_name, kind=SpanKind.INTERNAL,
                                                attributes=attrs, record_exception=False,
                                                set_status_on_exception=False) as span:
                try:
                    result = f(*args, **kwargs)
                except BaseException as exc:
                    record_error(span, exc)
                    raise
                _finish(span, result)
                return result
        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate
