"""A strict reader of safetensors headers: what a file claims to hold, checked against the
format before anything trusts it (no weights are read, no torch).

A safetensors file is ``<u64 little-endian N><N bytes of JSON header><data>``. The header maps
tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
data), plus an optional ``__metadata__`` of strings. The reference loader refuses a file whose
tensors overlap, leave gaps, or do not end exactly where the data ends; so does this reader,
with a message that says which tensor is wrong, because publishing must refuse the same files
a server's loader would, before any server sees them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

MAX_HEADER_BYTES = 100 * 2**20  # the reference implementation's limit

# bits per element; sub-byte types (F4, F6) pack, so sizes are checked in bits
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


class HeaderError(ValueError):
    """The file is not a well-formed safetensors file; the message says what is wrong."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON allows a key twice and keeps the last; two readers could then disagree about what
    a tensor is. Refuse instead."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise HeaderError(f"key {key!r} appears twice in the header")
        out[key] = value
    return out


def _tensor(name: str, info: Any) -> TensorInfo:
    if not isinstance(info, dict):
        raise HeaderError(f"entry {name!r} is {type(info).__name__}, not an object with "
                          f"dtype, shape and data_offsets")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise HeaderError(f"entry {name!r} has no {', '.join(missing)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise HeaderError(f"tensor {name!r} has shape {shape!r}, not a list of "
                          f"non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise HeaderError(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] "
                          f"with 0 <= begin <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits != (offsets[1] - offsets[0]) * 8:
        raise HeaderError(f"tensor {name!r} is {dtype} {shape}: {bits / 8:g} bytes, but its "
                          f"data_offsets {offsets} span {offsets[1] - offsets[0]} bytes")
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def _check_layout(tensors: list[TensorInfo], data_bytes: int) -> None:
    """Tensors tile the data exactly: no overlap (one tensor's bytes read as another's), no
    gap, nothing past the end (a truncated file), nothing after the last tensor."""
    for t in tensors:
        if t.end > data_bytes:
            raise HeaderError(f"tensor {t.name!r} runs past the end of the file (bytes "
                              f"{t.begin}-{t.end} of {data_bytes}: truncated)")
    position, previous = 0, None
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin < position and previous is not None:  # position > 0: there is one
            raise HeaderError(f"tensors {previous.name!r} and {t.name!r} overlap (bytes "
                              f"{previous.begin}-{previous.end} and {t.begin}-{t.end})")
        if t.begin > position:
            raise HeaderError(f"bytes {position}-{t.begin} of the data belong to no tensor")
        position, previous = t.end, t
    if position != data_bytes:
        raise HeaderError(f"{data_bytes - position} bytes after the last tensor belong to no "
                          f"tensor")


def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file holds, by name, after checking the header against the
    format and the file's size. Raises HeaderError (a ValueError) or OSError."""
    path = Path(path)
    if not path.is_file():
        raise HeaderError("not a regular file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise HeaderError("file shorter than a safetensors header")
        n = int.from_bytes(raw, "little")
        if n == 0 or n > MAX_HEADER_BYTES:
            raise HeaderError(f"implausible header length {n}")
        if 8 + n > size:
            raise HeaderError(f"header length {n} runs past the end of the file ({size} "
                              f"bytes: truncated)")
        text = f.read(n)
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except HeaderError:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise HeaderError(f"header is not valid JSON ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(v, str) for v in metadata.values())):
        raise HeaderError("__metadata__ is not an object of strings")
    tensors = [_tensor(name, info) for name, info in header.items()]
    _check_layout(tensors, size - 8 - n)
    return {t.name: t for t in tensors}
