"""A batch of SDK spans as Arrow tables, one per partition, built column by column.

``rows.span_to_row`` is the reference: one dict per span, then ``rows_to_table``. It is exact,
but costs about as much per span as making the span did (``benchmarks/README.md``), and an
exporter runs in the user's process on every span. This module builds the same table straight
from the spans:

* one Python pass per column instead of per cell, and each token-id column packed into one
  buffer by ``struct`` in C (which also refuses an id outside int32); the element
  types of a list stored by ``attributes.set_number_lists`` were checked when it was stored (its
  tuple type says so), so only other lists have their element types checked here;
* arrays assembled from buffers (``pa.Array.from_buffers``), never through ``pa.array`` on
  Python objects, which imports pandas on first use (about +45 MiB resident in a process
  that never asked for pandas);
* the resource JSON made once per resource object, not once per span.

Same rows, same promotion rule as ``rows.build_row``: a promoted attribute goes to its column
only if it fits the column exactly, otherwise it stays in the ``attributes`` JSON. A column
with a value that does not pass the fast checks is checked value by value with ``rows._fit``.
A span no row can hold (no name, bad ids or times) is returned in ``bad`` with the reason, as
``span_to_row`` would raise it. Anything unexpected falls back to the reference path for the
whole batch, so the table is never wrong, only slower.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from agl_bridge.otel.attributes import FloatList, IntList, attribute_dict
from agl_bridge.otel.rows import (
    _DAY_NS,
    _INT32_MAX,
    _INT32_MIN,
    _INT64_MAX,
    _INT64_MIN,
    _fit,
    _plain,
    partition_of,
    rows_to_table,
    span_to_row,
)
from agl_bridge.schema import PROMOTED_ATTRIBUTES, SPAN_SCHEMA

_NONE = type(None)
_ENCODER = json.JSONEncoder(separators=(",", ":"))
try:  # a private constructor: another Python may take other arguments, then encode() it is
    _json_c = None if c_make_encoder is None else c_make_encoder(
        # no circular check (attribute values are not containers of themselves; a circular
        # one raises RecursionError here, and the batch goes to the reference path, which
        # says so)
        None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", False, False, True)
except TypeError:  # pragma: no cover
    _json_c = None


def _json(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"))``: the C encoder called directly, not built
    anew on every call as ``JSONEncoder.encode`` builds it."""
    if _json_c is None or type(obj) is str:  # pragma: no cover - CPython has the C encoder
        return _ENCODER.encode(obj)
    return "".join(_json_c(obj, 0))


_TO_BYTES: Any = int.to_bytes  # (id, width, "big")


@dataclass
class SpanTables:
    """What ``spans_to_tables`` made of a batch."""

    tables: dict[str, pa.Table] = field(default_factory=dict)  # partition -> rows
    bad: list[tuple[ReadableSpan, str]] = field(default_factory=list)  # span, why


def spans_to_tables(spans: Sequence[ReadableSpan]) -> SpanTables:
    """The batch as one table per partition (``rows.partition_of``), and the spans no row can
    hold, each with the reason, for the caller to quarantine."""
    out = SpanTables()
    spans = list(spans)
    partition = _one_partition(spans)
    if partition is not None:  # the usual batch: every span valid, one day, one resource
        groups = {partition: spans}
    else:
        groups = _groups(spans, out.bad)
    for partition, group in groups.items():
        try:
            out.tables[partition] = _table(group)
        except Exception:  # never a wrong table: the reference path, span by span
            table, bad = _reference(group)
            if table is not None:
                out.tables[partition] = table
            out.bad.extend(bad)
    return out


def _one_partition(spans: list[ReadableSpan]) -> str | None:
    """The partition of every span in ``spans`` when they are all valid (``_invalid`` says
    None for each), share one resource object and start on one UTC day; None otherwise.
    Checks over whole columns (types as a set, min and max in C), not span by span."""
    if not spans:
        return None
    try:
        if set(map(type, [s.name for s in spans])) != {str}:
            return None
        ctxs = [s.context for s in spans]
        if _NONE in set(map(type, ctxs)):
            return None
        trace_ids = [c.trace_id for c in ctxs]
        span_ids = [c.span_id for c in ctxs]
        if not (0 < min(trace_ids) and max(trace_ids) < 2**128
                and 0 < min(span_ids) and max(span_ids) < 2**64):
            return None
        starts: list[Any] = [s.start_time for s in spans]
        ends = [s.end_time for s in spans]
        if set(map(type, starts)) != {int} or not _int64_column(ends):
            return None  # a span without a start goes where "now" puts it: span by span
        first, last = min(starts), max(starts)
        # a start of 0 counts as none ("now"), as in partition_of
        if not (0 < first and last <= _INT64_MAX) or first // _DAY_NS != last // _DAY_NS:
            return None
        resource = spans[0].resource
        if any(s.resource is not resource for s in spans):
            return None
    except TypeError:  # values that do not compare: span by span says which
        return None
    name = resource.attributes.get("service.name") if resource is not None else None
    return partition_of(first, name if isinstance(name, str) else None)


def _int64_column(values: list[Any]) -> bool:
    kinds = set(map(type, values))
    if kinds == {_NONE}:
        return True
    if not kinds <= {int, _NONE}:
        return False
    present = [v for v in values if v is not None] if _NONE in kinds else values
    return _INT64_MIN <= min(present) and max(present) <= _INT64_MAX


def _groups(spans: list[ReadableSpan], bad: list[tuple[ReadableSpan, str]]
            ) -> dict[str, list[ReadableSpan]]:
    """Spans by partition, span by span; the invalid ones go to ``bad`` with the reason."""
    groups: dict[str, list[ReadableSpan]] = {}
    services: dict[int, str | None] = {}
    partitions: dict[tuple[int, int], str] = {}  # (UTC day, resource) -> partition
    for span in spans:
        why = _invalid(span)
        if why is not None:
            bad.append((span, why))
            continue
        resource = span.resource
        rid = id(resource)
        if rid not in services:
            name = resource.attributes.get("service.name") if resource is not None else None
            services[rid] = name if isinstance(name, str) else None
        start = span.start_time or time.time_ns()
        key = (start // _DAY_NS, rid)
        partition = partitions.get(key)
        if partition is None:
            partition = partitions[key] = partition_of(start, services[rid])
        groups.setdefault(partition, []).append(span)
    return groups


def _invalid(span: ReadableSpan) -> str | None:
    """Why no row can hold ``span`` (``build_row``'s checks, its messages), or None."""
    ctx = span.context
    try:
        if (type(span.name) is str and ctx is not None and 0 < ctx.trace_id < 2**128
                and 0 < ctx.span_id < 2**64 and _ns_ok(span.start_time)
                and _ns_ok(span.end_time)):
            return None
    except TypeError:  # ids that are not numbers: the reference check says why
        pass
    try:
        span_to_row(span)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None  # the reference path takes it (a str subclass as name, say)


def _ns_ok(ns: Any) -> bool:
    return ns is None or (type(ns) is int and _INT64_MIN <= ns <= _INT64_MAX)


def _reference(spans: list[ReadableSpan]) -> tuple[pa.Table | None, list[tuple[Any, str]]]:
    rows, bad = [], []
    for span in spans:
        try:
            row = span_to_row(span)
            rows_to_table([row])  # a value no column can hold (a lone surrogate) fails here
            rows.append(row)
        except Exception as exc:
            bad.append((span, f"{type(exc).__name__}: {exc}"))
    return (rows_to_table(rows) if rows else None), bad


# -- columns ------------------------------------------------------------------------------------
def _table(spans: list[ReadableSpan]) -> pa.Table:
    n = len(spans)
    attrs = [_attributes(s) for s in spans]
    ctxs = [s.context for s in spans]
    parents = [s.parent for s in spans]
    statuses = [s.status for s in spans]
    scopes = [s.instrumentation_scope for s in spans]
    cols: dict[str, pa.Array] = {
        "trace_id": _hex_column([c.trace_id for c in ctxs], 16),
        "span_id": _hex_column([c.span_id for c in ctxs], 8),
        "parent_span_id": _hex_column([p.span_id if p else None for p in parents], 8),
        "name": _strings([s.name for s in spans]),
        "kind": _strings(_names([s.kind for s in spans])),
        "start_time_unix_nano": _int64s([s.start_time for s in spans]),
        "end_time_unix_nano": _int64s([s.end_time for s in spans]),
        "status_code": _strings(_names([st.status_code for st in statuses])),
        "status_message": _strings([st.description or None for st in statuses]),
        "scope_name": _strings([sc.name if sc else None for sc in scopes]),
    }
    resources: dict[int, tuple[str | None, str | None]] = {}
    objects = [s.resource for s in spans]
    # one resource object for the batch (the usual case: one tracer provider) is read once
    for obj in (objects[:1] if objects.count(objects[0]) == n else objects):
        key = id(obj)
        if key not in resources:
            res = dict(obj.attributes) if obj else {}
            name = res.get("service.name")
            resources[key] = (name if isinstance(name, str) else None,
                              _json(res) if res else None)
    if len(resources) == 1:
        ((name, text),) = resources.values()
        service, resource = [name] * n, [text] * n
    else:
        pairs = [resources[id(obj)] for obj in objects]
        service, resource = [p[0] for p in pairs], [p[1] for p in pairs]
    cols["service_name"] = _strings(service)
    cols["resource"] = _strings(resource)

    # promoted attributes: a column that took every value given leaves its key out of every
    # span's JSON (``whole``); one that took only some records which, span by span (``some``)
    given = set().union(*attrs)
    whole: list[str] = []
    some: list[list[str]] = [[] for _ in range(n)]
    for attr, (col, typ) in PROMOTED_ATTRIBUTES.items():
        if attr not in given:
            cols[col] = pa.nulls(n, typ)
            continue
        values = list(map(dict.get, attrs, itertools.repeat(attr)))
        array, taken = _promoted(values, typ)
        cols[col] = array
        if taken is None:
            whole.append(attr)
        else:
            for i in taken:
                some[i].append(attr)
    cols["attributes"] = _strings([_rest_json(a, whole, k) for a, k in zip(attrs, some)])
    # the SDK's span.events and span.links copy their lists on every read
    cols["events"] = _strings([_events_json(s) if getattr(s, "_events", True) else None
                               for s in spans])
    cols["links"] = _strings([_links_json(s) if getattr(s, "_links", True) else None
                              for s in spans])
    return pa.Table.from_arrays([cols[f.name] for f in SPAN_SCHEMA], schema=SPAN_SCHEMA)


def _hex_column(ids: list[Any], width: int) -> pa.Array:
    """Ids as lowercase hex of ``2 * width`` digits (``f"{id:0{2 * width}x}"``, None as null):
    packed big-endian into one buffer and hexed by one ``bytes.hex``. Raises on an id that is
    not an int in range (the caller then takes the reference path, which formats it as is)."""
    missing = None in ids
    present = [i if i is not None else 0 for i in ids] if missing else ids
    if set(map(type, present)) != {int}:
        raise TypeError("ids that are not ints")
    if width == 8:
        packed = struct.pack(f">{len(present)}Q", *present)
    else:
        packed = b"".join(map(_TO_BYTES, present, itertools.repeat(width),
                                itertools.repeat("big")))
    digits = 2 * width
    return pa.Array.from_buffers(pa.string(), len(ids), [
        _validity(ids) if missing else None,
        pa.py_buffer(array("i", range(0, digits * len(ids) + 1, digits))),
        pa.py_buffer(packed.hex().encode("ascii"))])


# the names of the SDK's own enum members; anything else is asked its name every time
_ENUM_NAMES: dict[Any, str] = {m: m.name for m in (*SpanKind, *StatusCode)}


def _names(members: list[Any]) -> list[str | None]:
    """``member.name`` of each member, looked up for the SDK's span kinds and status codes."""
    try:
        return list(map(_ENUM_NAMES.__getitem__, members))
    except (KeyError, TypeError):
        return [m.name for m in members]


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    """A finished span's attributes as a plain dict, not copied where the SDK's own dict can be
    read (``attributes.attribute_dict``: no Python-level lookup per key)."""
    attrs = attribute_dict(span)
    return attrs if type(attrs) is dict else dict(attrs)


def _rest_json(attrs: dict[str, Any], whole: list[str], some: list[str]) -> str | None:
    """The JSON of the attributes no column took."""
    if not attrs:
        return None
    rest = attrs  # copied only when a key goes (most spans hold no promoted attribute)
    for k in whole:  # a key given as None stays (as null), as build_row leaves it
        if rest.get(k) is not None:
            if rest is attrs:
                rest = attrs.copy()
            del rest[k]
    for k in some:
        if rest is attrs:
            rest = attrs.copy()
        del rest[k]
    return _json(rest) if rest else None


def _events_json(span: ReadableSpan) -> str | None:
    if not span.events:
        return None
    return _json([{"name": e.name, "time_unix_nano": e.timestamp,
                   "attributes": _plain(e.attributes)} for e in span.events])


def _links_json(span: ReadableSpan) -> str | None:
    if not span.links:
        return None
    return _json([{"trace_id": f"{lk.context.trace_id:032x}",
                   "span_id": f"{lk.context.span_id:016x}",
                   "attributes": _plain(lk.attributes)} for lk in span.links])


def _promoted(values: list[Any], typ: pa.DataType) -> tuple[pa.Array, list[int] | None]:
    """(column, indices whose value went into it) for one promoted attribute; None for the
    indices when every value that is not None did."""
    kinds = set(map(type, values))
    if kinds == {_NONE}:
        return pa.nulls(len(values), typ), None
    if pa.types.is_list(typ):
        fast = _number_lists(values, typ, kinds)
        if fast is not None:
            return fast
    elif pa.types.is_string(typ):
        if kinds <= {str, _NONE}:
            return _strings(values), None
    elif pa.types.is_int32(typ):
        if kinds <= {int, _NONE}:
            present = [v for v in values if v is not None]
            if _INT32_MIN <= min(present) and max(present) <= _INT32_MAX:
                return _numbers(values, "i", typ), None
    elif kinds <= {float, _NONE}:
        return _numbers(values, "d", typ), None
    # value by value, as build_row does
    column: list[Any] = []
    taken = []
    for i, v in enumerate(values):
        fits, converted = _fit(v, typ) if v is not None else (False, None)
        if fits:
            taken.append(i)
            column.append(converted)
        else:
            column.append(None)
    return pa.array(column, type=typ), taken  # the reference conversion (rare)


def _number_lists(values: list[Any], typ: pa.DataType, kinds: set[type]
                  ) -> tuple[pa.Array, None] | None:
    """A list column from tuples of one number type each, or None when a value is anything
    else (the caller then checks value by value)."""
    ints = pa.types.is_int32(typ.value_type)
    checked = IntList if ints else FloatList
    if not kinds <= {checked, tuple, list, _NONE}:
        return None
    unchecked = [v for v in values if v and type(v) is not checked]
    if unchecked:
        # a float list with ints in it goes value by value (ints past 2**53 are not floats)
        elements = set(map(type, itertools.chain.from_iterable(unchecked)))
        if not elements <= ({int} if ints else {float}):
            return None
    missing = _NONE in kinds
    lengths = [len(v) if v is not None else 0 for v in values] if missing else \
        list(map(len, values))
    total = sum(lengths)
    # struct packs a whole column in C, three times faster than np.fromiter; an int out of
    # int32 range raises here (the element types were checked above)
    try:
        data = struct.pack(f"={total}{'i' if ints else 'd'}",
                           *itertools.chain.from_iterable(filter(None, values)))
    except (struct.error, OverflowError, TypeError):
        return None
    child = pa.Array.from_buffers(typ.value_type, total, [None, pa.py_buffer(data)])
    array = pa.Array.from_buffers(typ, len(values), [
        _validity(values) if missing else None, _offsets(lengths)], children=[child])
    return array, None


def _offsets(lengths: list[int]) -> pa.Buffer:
    # OverflowError past 2**31 values or bytes in one column of one batch: the caller falls
    # back to the reference path
    return pa.py_buffer(array("i", itertools.accumulate(lengths, initial=0)))


def _validity(values: list[Any]) -> pa.Buffer:
    bits = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bits)


def _strings(values: list[str | None]) -> pa.Array:
    n = len(values)
    first = values[0] if n else None
    if n > 1 and values.count(first) == n:  # one value (kinds, models, services): repeated
        if first is None:
            return pa.nulls(n, pa.string())
        if type(first) is str:
            one = first.encode()
            size = len(one)
            offsets = (array("i", range(0, size * n + 1, size)) if size
                       else array("i", [0]) * (n + 1))
            return pa.Array.from_buffers(pa.string(), n, [
                None, pa.py_buffer(offsets), pa.py_buffer(one * n)])
    missing = None in values
    texts = [v if v is not None else "" for v in values] if missing else values
    joined = "".join(texts)  # type: ignore[arg-type]
    if joined.isascii():  # one byte per character: no string encoded on its own
        data = joined.encode("ascii")
        lengths = list(map(len, texts))  # type: ignore[arg-type]
    else:
        encoded = [t.encode() for t in texts]  # type: ignore[union-attr]
        data = b"".join(encoded)
        lengths = list(map(len, encoded))
    return pa.Array.from_buffers(pa.string(), n, [
        _validity(values) if missing else None, _offsets(lengths), pa.py_buffer(data)])


def _int64s(values: list[int | None]) -> pa.Array:
    return _numbers(values, "q", pa.int64())


def _numbers(values: list[Any], code: str, typ: pa.DataType) -> pa.Array:
    """A column of numbers (``array`` type code of the column's width) with nulls."""
    missing = None in values
    data = array(code, [0 if v is None else v for v in values] if missing else values)
    return pa.Array.from_buffers(typ, len(values), [
        _validity(values) if missing else None, pa.py_buffer(data)])
