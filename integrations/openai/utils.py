"""Small readers shared by the request and response sides.

The openai SDK hands us two kinds of objects: plain mappings (the caller's request parameters,
which may be dicts or TypedDicts) and pydantic models (responses, stream chunks). These helpers
read either without caring which, so the recording code reads like the data it records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def given(value: Any) -> bool:
    """False for None and the openai SDK's ``omit``/``NOT_GIVEN`` sentinels."""
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


def get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj[key]`` for mappings (request params), ``obj.key`` for SDK models."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def extra(model: Any) -> dict[str, Any]:
    """Fields the SDK's pydantic model does not declare (vLLM's ``token_ids`` and friends).

    Pydantic 2's own slot first: ``model_extra`` is a property returning it, a Python call that
    a stream pays per chunk."""
    fields = getattr(model, "__pydantic_extra__", None)
    if fields is None:
        fields = getattr(model, "model_extra", None)
    return fields or {}


def to_json(value: Any) -> str:
    """JSON of request/response pieces: SDK models as the caller set them, sets as lists, and
    anything else as its ``str`` (a span attribute must never fail the call)."""
    def default(o: Any) -> Any:
        dump = getattr(o, "model_dump", None)
        if callable(dump):
            return dump(mode="json", exclude_unset=True)
        if isinstance(o, (set, frozenset)):
            return list(o)
        return str(o)

    return json.dumps(value, default=default, ensure_ascii=False)
