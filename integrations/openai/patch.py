"""The one patch on the openai client's ``chat.completions.create`` (sync and async), shared by
routing (``routing.py``) and tracing (``wrappers.py``).

Why one patch with two slots rather than a wrapt layer each: routing must rewrite the model
before tracing starts its span (the span asks for the live version and records the alias),
whichever of the two was turned on first; and each must be turned off without touching the
other, while wrapt layers on one attribute can only be peeled from the outside. So the slots
run in a fixed order, route then trace, and each is set or cleared on its own. The patch is
installed while a slot is filled and removed when both are empty.

Routing runs whatever tracing does: inside ``suppress_instrumentation()``, with tracing
uninstrumented or never instrumented. Tracing checks suppression itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wrapt import wrap_function_wrapper

if TYPE_CHECKING:
    from .wrappers import ChatTracing

logger = logging.getLogger(__name__)

_MODULE = "openai.resources.chat.completions"

#: ``kwargs -> (kwargs to send, the alias asked for or None)``
Router = Callable[[dict[str, Any]], "tuple[dict[str, Any], str | None]"]


class _Slots:
    router: Router | None = None
    tracing: ChatTracing | None = None


_slots = _Slots()
_lock = threading.Lock()
_patched: set[str] = set()  # class names whose ``create`` carries our wrapper


def set_router(router: Router | None) -> None:
    _fill("router", router)


def set_tracing(tracing: ChatTracing | None) -> None:
    _fill("tracing", tracing)


def router() -> Router | None:
    return _slots.router


def tracing() -> ChatTracing | None:
    return _slots.tracing


def _fill(slot: str, value: Any) -> None:
    with _lock:
        setattr(_slots, slot, value)
        targets = (("Completions", _sync_create), ("AsyncCompletions", _async_create))
        if _slots.router is not None or _slots.tracing is not None:
            for cls, wrapper in targets:
                if cls not in _patched:
                    wrap_function_wrapper(_MODULE, f"{cls}.create", wrapper)
                    _patched.add(cls)
            return
        import openai.resources.chat.completions as mod

        for cls, wrapper in targets:
            if cls in _patched and _unwrap(getattr(mod, cls), wrapper):
                _patched.discard(cls)


def _unwrap(owner: type, wrapper: Callable[..., Any]) -> bool:
    """Take our wrapper off ``owner.create`` if it is the outermost layer.

    If someone wrapped ``create`` after us, peeling the outer layer would remove theirs; ours
    then stays underneath, with empty slots it only passes calls through.
    """
    current = owner.__dict__.get("create")
    if current is None or getattr(current, "_self_wrapper", None) is not wrapper:
        return False
    setattr(owner, "create", current.__wrapped__)  # noqa: B010 - a class attribute, by name
    return True


def _route(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    router = _slots.router
    if router is None:
        return kwargs, None
    try:
        return router(kwargs)
    except Exception:  # routing must never fail the agent's call: send what it asked for
        logger.warning("agl_bridge: alias routing failed; the model name is sent as it is",
                       exc_info=True)
        return kwargs, None


def _as_asked(result: Any, asked: Any, alias: str | None) -> Any:
    """A routed answer names the model the program asked for: routing stays invisible to it
    (AutoGen warns on every call whose answer names another model). The span, ended by now,
    records the version that answered; streams and raw responses are left as they are."""
    if alias is not None and isinstance(getattr(result, "model", None), str):
        try:
            result.model = asked
        except (AttributeError, TypeError, ValueError):
            pass
    return result


def _sync_create(wrapped, instance, args, kwargs):
    asked = kwargs.get("model")
    kwargs, alias = _route(kwargs)
    tracing = _slots.tracing
    if tracing is None:
        return _as_asked(wrapped(*args, **kwargs), asked, alias)
    return _as_asked(tracing.sync_create(wrapped, instance, args, kwargs, alias), asked, alias)


async def _async_create(wrapped, instance, args, kwargs):
    asked = kwargs.get("model")
    kwargs, alias = _route(kwargs)
    tracing = _slots.tracing
    if tracing is None:
        return _as_asked(await wrapped(*args, **kwargs), asked, alias)
    return _as_asked(await tracing.async_create(wrapped, instance, args, kwargs, alias), asked,
                     alias)
