"""The one patch on the openai client's ``chat.completions.create`` (sync and async), shared by
routing (``routing.py``), the live prompt swap (``prompt_swap.py``) and tracing
(``wrappers.py``).

Why one patch with two slots rather than a wrapt layer each: routing must rewrite the model
before tracing starts its span (the span asks for the live version and records the alias),
whichever of the two was turned on first; and each must be turned off without touching the
other, while wrapt layers on one attribute can only be peeled from the outside. So the slots
run in a fixed order, route, swap the prompt, then trace, and each is set or cleared on its
own. The patch is installed while a slot is filled and removed when all are empty.

Routing runs whatever tracing does: inside ``suppress_instrumentation()``, with tracing
uninstrumented or never instrumented. Tracing checks suppression itself.
"""

from __future__ import annotations

import asyncio
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
#: ``kwargs -> (kwargs to send, the prompt version or None)``
PromptSwap = Router


class _Slots:
    router: Router | None = None
    prompts: PromptSwap | None = None
    tracing: ChatTracing | None = None


_slots = _Slots()
_lock = threading.Lock()
_patched: set[str] = set()  # class names whose ``create`` carries our wrapper


def set_router(router: Router | None) -> None:
    _fill("router", router)


def set_tracing(tracing: ChatTracing | None) -> None:
    _fill("tracing", tracing)


def set_prompt_swap(swap: PromptSwap | None) -> None:
    _fill("prompts", swap)


def router() -> Router | None:
    return _slots.router


def prompt_swap() -> PromptSwap | None:
    return _slots.prompts


def tracing() -> ChatTracing | None:
    return _slots.tracing


def _fill(slot: str, value: Any) -> None:
    with _lock:
        setattr(_slots, slot, value)
        targets = (("Completions", _sync_create), ("AsyncCompletions", _async_create))
        if any(s is not None for s in (_slots.router, _slots.prompts, _slots.tracing)):
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


def _swap(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    swap = _slots.prompts
    if swap is None:
        return kwargs, None
    try:
        return swap(kwargs)
    except Exception:  # the swap must never fail the agent's call: send its own prompt
        logger.warning("agl_bridge: the prompt swap failed; the messages are sent as they are",
                       exc_info=True)
        return kwargs, None


def _served(instance: Any) -> list[dict[str, Any]]:
    """The server's ``/v1/models`` entries (vLLM: the base model has no ``parent``)."""
    import json
    import urllib.request

    client = instance._client
    req = urllib.request.Request(f"{str(client.base_url).rstrip('/')}/models",
                                 headers={"Authorization": f"Bearer {client.api_key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        data = json.loads(r.read()).get("data")
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def _gone(exc: BaseException) -> bool:
    """A 404: the server may no longer have the routed version (only then is it asked)."""
    return getattr(exc, "status_code", None) == 404


def _fallback(served: list[dict[str, Any]], asked: Any, routed: str) -> str | None:
    """Where a routed call goes when the server no longer has its version (404: unloaded
    under an agent whose alias table is out of date, e.g. through an outage of the alias
    server that spanned a publish): the model the program asked for if the server has it,
    else the server's base model. None: the version is there (another 404), or nowhere to
    go."""
    ids = {m.get("id") for m in served}
    if routed in ids:
        return None  # the version is there: some other 404
    if asked in ids:
        return str(asked)
    base = [m["id"] for m in served if m.get("parent") is None and isinstance(m.get("id"), str)]
    if base:
        logger.warning("agl_bridge: %s is no longer served (an alias table out of date?); "
                       "this call went to the base model %s", routed, base[0])
    return base[0] if base else None


def _sync_create(wrapped, instance, args, kwargs):
    asked = kwargs.get("model")
    kwargs, alias = _route(kwargs)
    kwargs, prompt = _swap(kwargs)
    tracing = _slots.tracing

    def call(kw: dict[str, Any], alias: str | None) -> Any:
        if tracing is None:
            return wrapped(*args, **kw)
        return tracing.sync_create(wrapped, instance, args, kw, alias, prompt)

    try:
        return call(kwargs, alias)
    except Exception as exc:
        if alias is None or not _gone(exc):
            raise
        try:
            to = _fallback(_served(instance), asked, kwargs["model"])
        except Exception:  # the server cannot say: the call's own error stands
            to = None
        if to is None:
            raise
        return call({**kwargs, "model": to}, None)


async def _async_create(wrapped, instance, args, kwargs):
    asked = kwargs.get("model")
    kwargs, alias = _route(kwargs)
    kwargs, prompt = _swap(kwargs)
    tracing = _slots.tracing

    async def call(kw: dict[str, Any], alias: str | None) -> Any:
        if tracing is None:
            return await wrapped(*args, **kw)
        return await tracing.async_create(wrapped, instance, args, kw, alias, prompt)

    try:
        return await call(kwargs, alias)
    except Exception as exc:
        if alias is None or not _gone(exc):
            raise
        try:
            served = await asyncio.to_thread(_served, instance)  # never block the event loop
            to = _fallback(served, asked, kwargs["model"])
        except Exception:  # the server cannot say: the call's own error stands
            to = None
        if to is None:
            raise
        return await call({**kwargs, "model": to}, None)
