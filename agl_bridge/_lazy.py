"""A one-shot hook run before agl-bridge starts its first span (see ``agl_bridge.otel.auto``).

Kept import-free and tiny: ``ensure()`` sits on every span start and costs one global read
when nothing is pending.
"""

from __future__ import annotations

from collections.abc import Callable

_pending: Callable[[], None] | None = None


def set_pending(hook: Callable[[], None] | None) -> None:
    global _pending
    _pending = hook


def ensure() -> None:
    global _pending
    if _pending is not None:
        hook, _pending = _pending, None
        hook()
