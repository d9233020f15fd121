"""Number lists on SDK spans without the SDK's per-element checks in Python.

The SDK's ``BoundedAttributes`` cleans a sequence value element by element in Python before it
stores it as a tuple. Token-id and logprob lists are hundreds long and set on every LLM span, so
that check was a large share of what recording them cost per call (see
``benchmarks/capture_overhead.py``). When every element is already a plain ``int`` (ids) or a
plain ``float``/``int`` (logprobs), which a set of the element types tells in C, the cleaned value
is exactly ``tuple(values)``: ``set_number_lists`` stores that under the span's and the
attributes' own locks, through the SDK's own limit handling (``_setitem_locked`` drops the
oldest attribute when the span is full, as ``set_attribute`` would).

The stored tuple says what was checked: ``IntList`` (plain ints) or ``FloatList`` (plain floats,
and ints no larger than 2**53, so each is exactly a float). The Parquet exporter
(``span_columns``) then puts such a list into its typed column without checking every element a
second time; a list stored any other way is checked there.

Anything else takes the public path, ``span.set_attribute``: a span that is not the SDK's (a
non-recording span, another SDK), an ended span (the SDK warns), a list with other element types,
or an SDK whose private names differ from the ones this reads (checked once, at import).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace

from agl_bridge.scope import _SCALARS

logger = logging.getLogger(__name__)

try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Span as _SdkSpan

    _FAST = hasattr(BoundedAttributes, "_setitem_locked")
except ImportError:  # pragma: no cover - the SDK is a dependency; an API-only process
    _FAST = False

_INTS = frozenset({int})
_FLOATS = frozenset({float})
_NUMBERS = frozenset({int, float})
_FLOAT_EXACT_INT = 2**53


class IntList(tuple[int, ...]):
    """A stored list attribute whose elements were checked to be plain ints."""

    __slots__ = ()


class FloatList(tuple[float, ...]):
    """A stored list attribute of plain floats, and ints each exactly a float (|i| <= 2**53)."""

    __slots__ = ()


def _checked(values: Any) -> tuple[Any, ...] | None:
    """``values`` as the tuple that records what it holds, or None if it is not a list of
    plain numbers (no bools, no subclasses)."""
    if type(values) is not list:
        return None
    kinds = set(map(type, values))
    if kinds <= _INTS:
        return IntList(values)
    if kinds <= _FLOATS:
        return FloatList(values)
    if kinds <= _NUMBERS:
        if all(abs(v) <= _FLOAT_EXACT_INT for v in values if type(v) is int):
            return FloatList(values)
        return tuple(values)
    return None


def _store(span: trace.Span, attributes: Mapping[str, Any],
           accept: Callable[[BoundedAttributes, str, Any], Any]) -> dict[str, Any]:
    """Store, under the span's and its attributes' locks and through the SDK's own limit
    handling, each value that ``accept(attributes, key, value)`` turns into exactly what the SDK
    would store (None: not this way). Returns the rest, for the public path."""
    slow = dict(attributes)
    target = getattr(span, "_attributes", None)
    if (_FAST and isinstance(span, _SdkSpan) and type(target) is BoundedAttributes
            and not getattr(target, "_immutable", True)):
        with span._lock:
            if span._end_time is None:
                with target._lock:
                    for key, value in attributes.items():
                        stored = accept(target, key, value)
                        if stored is not None:
                            del slow[key]
                            if target.maxlen == 0:
                                target.dropped += 1
                            else:
                                target._setitem_locked(key, stored)
    return slow


def set_number_lists(span: trace.Span, lists: Mapping[str, list[Any]]) -> None:
    """Set each ``key: list of numbers`` on ``span``, as ``set_attribute`` would store it."""
    if not lists:
        return
    for key, values in _store(span, lists, lambda _t, _k, v: _checked(v)).items():
        span.set_attribute(key, values)


def _plain_scalar(target: BoundedAttributes, key: str, value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS and key and type(key) is str and (
            target.max_value_len is None or kind is not str
            or len(value) <= target.max_value_len):
        return value
    return None


def attribute_dict(span: Any) -> Mapping[str, Any]:
    """The attributes a span holds now, read from the SDK's own dict where it has one (no copy,
    no read-only view made per call); never modify it."""
    raw = getattr(span, "_attributes", None)
    if type(raw) is BoundedAttributes:
        inner = getattr(raw, "_dict", None)
        if type(inner) is dict:
            return inner
    return getattr(span, "attributes", None) or {}


def stamp_starting_span(span: trace.Span, stamp: Mapping[str, Any], longest: int | None) -> None:
    """Add ``stamp``'s attributes that ``span`` does not hold yet, for a span processor's
    ``on_start``: the SDK calls it before the span is handed to anyone, so no other thread can
    touch the span and no lock is taken. ``longest`` is ``plain_scalars(stamp)``
    (``agl_bridge.scope``). When the values are plain scalars within the span's value-length
    limit, the keys are new and the span has room, the values are exactly what
    ``set_attributes`` would store, and the whole stamp goes in with one ``dict.update``;
    anything else takes ``set_scalars`` (locks, limits, checks)."""
    target = getattr(span, "_attributes", None)
    if _FAST and longest is not None and type(target) is BoundedAttributes:
        inner = getattr(target, "_dict", None)
        if type(inner) is dict and not getattr(target, "_immutable", True) and (
                target.max_value_len is None or longest <= target.max_value_len):
            if not inner.keys().isdisjoint(stamp):
                stamp = {k: v for k, v in stamp.items() if k not in inner}
            if target.maxlen is None or len(inner) + len(stamp) <= target.maxlen:
                inner.update(stamp)
                return
    present = attribute_dict(span)
    if not present.keys().isdisjoint(stamp):
        stamp = {k: v for k, v in stamp.items() if k not in present}
    set_scalars(span, stamp)


def set_scalars(span: trace.Span, attributes: Mapping[str, Any]) -> None:
    """``span.set_attributes(attributes)``, stored without the SDK's per-value checks where every
    value is a plain ``str``, ``bool``, ``int`` or ``float`` (which those checks return
    unchanged); a string longer than the span's value-length limit, or any other value, takes
    the public path."""
    if not attributes:
        return
    slow = _store(span, attributes, _plain_scalar)
    if slow:
        span.set_attributes(slow)
