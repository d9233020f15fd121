"""Arrow <-> numpy without a Python object per value, shared by the converter and the reward rules.

Arrow arrays are built from numpy buffers and back (``np_array``, ``to_numpy``, ``lit``), never
through ``pa.array``, ``pa.scalar`` or ``Array.to_numpy``: those import pandas when it is
installed (about half a second and 40 MiB), as ``Table.group_by`` imports Acero.

List columns are read as ``Lists``: one flat numpy buffer of values plus a start and a length
per row, so merging a turn's calls is gathering slices of that buffer (``segments``), and token
ids never become Python objects.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.schema import values_list

_NUMPY_TYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
_NUMPY_TYPES.update({"float": np.dtype(np.float32), "double": np.dtype(np.float64)})

# ``segments``: at least this many runs, of fewer values than this on average, go by one index
# (a slice costs about as much as indexing 64 values)
_FEW_RUNS, _SHORT_RUN = 64, 64

# Arrow's list offsets are int32: a list array holds fewer values than this per chunk
MAX_LIST_VALUES = 2**31 - 1


def arr(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One array. (``ChunkedArray.combine_chunks`` copies even a single chunk.)"""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def to_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow array as numpy: numbers without nulls zero-copy, booleans unpacked (null as
    False), numbers with nulls refused."""
    a = arr(col)
    if pa.types.is_boolean(a.type):
        n, off = len(a), a.offset
        bits = np.frombuffer(a.buffers()[1], np.uint8)
        out = np.unpackbits(bits, bitorder="little", count=off + n)[off:].astype(bool)
        if a.null_count:
            valid = np.unpackbits(np.frombuffer(a.buffers()[0], np.uint8), bitorder="little",
                                  count=off + n)[off:].astype(bool)
            out &= valid
        return out
    if a.null_count:
        raise ValueError("to_numpy: nulls in a number array")
    dtype = _NUMPY_TYPES[str(a.type)]
    buf = a.buffers()[1]
    if buf is None:
        return np.zeros(0, dtype)
    # a buffer may be longer than its values need, by any number of bytes (``pa.nulls`` gives
    # an empty list's values a 52-byte one): read only the values
    return np.frombuffer(buf, dtype, count=a.offset + len(a))[a.offset:]


def lit(value: str | bool | int | float, typ: pa.DataType | None = None) -> pa.Scalar:
    """A Python value as an Arrow scalar for compute functions (which would otherwise convert
    it with ``pa.scalar``, importing pandas when installed)."""
    if isinstance(value, str):
        data = value.encode()
        offsets = np.array([0, len(data)], np.int32)
        return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(data)])[0]
    if isinstance(value, bool):
        return np_array(np.array([value], bool))[0]
    if isinstance(value, int):
        return np_array(np.array([value], typ.to_pandas_dtype() if typ is not None
                                 else np.int64))[0]
    if isinstance(value, float):
        return np_array(np.array([value], np.float64))[0]
    raise TypeError(f"lit: {type(value).__name__}")


def np_array(values: Any, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy array (numbers or bools; ``valid``: optional mask of non-null) as an Arrow
    array, zero-copy for numbers."""
    values = np.ascontiguousarray(values)
    bitmap = None
    if valid is not None:
        valid = np.asarray(valid, bool)
        if not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if values.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(values), [
            bitmap, pa.py_buffer(np.packbits(values, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [bitmap, pa.py_buffer(values)])


def codes(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Dense int64 codes of a column, null a value of its own; equal values, equal codes."""
    enc = pc.dictionary_encode(arr(col), null_encoding="encode")
    return to_numpy(enc.indices).astype(np.int64, copy=False)


def combine(*parts: np.ndarray) -> np.ndarray:
    """One dense code per distinct tuple of codes."""
    out = parts[0]
    for c in parts[1:]:
        out = np.unique(out * (int(c.max(initial=0)) + 1) + c, return_inverse=True)[1]
    return out.astype(np.int64, copy=False).reshape(-1)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the ranges [starts[i], starts[i] + lengths[i]), concatenated."""
    total = int(lengths.sum())
    shift = starts - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def segments(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
             dtype: np.dtype | None = None) -> np.ndarray:
    """values[starts[i]:starts[i] + lengths[i]] concatenated. Adjacent segments are copied as
    one run; long runs one slice each (Arrow's list ``take`` and numpy fancy indexing build an
    index per value: on token id lists they are 3-5x slower), many short ones (observations,
    follow-up completions) by one fancy index, as a slice each costs a microsecond of Python."""
    nz = lengths > 0
    if not nz.all():
        starts, lengths = starts[nz], lengths[nz]
    if len(starts) == 0:
        return np.zeros(0, dtype or values.dtype)
    ends = starts + lengths
    cut = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    runs = len(cut) + 1
    if runs >= _FEW_RUNS and int(lengths.sum()) < _SHORT_RUN * runs:
        out = values[ranges(starts, lengths)]
        return out if dtype is None else out.astype(dtype, copy=False)
    first = np.concatenate(([0], cut)).tolist()
    last = (np.concatenate((cut, [len(starts)])) - 1).tolist()
    s, e = starts.tolist(), ends.tolist()
    return np.concatenate([values[s[a]:e[b]] for a, b in zip(first, last)], dtype=dtype)


def second_mask(first_len: np.ndarray, second_len: np.ndarray) -> np.ndarray:
    """int8 per value of pieces laid out first[0], second[0], first[1], ...: 1 in the second
    pieces. For merged turns it is the completion mask itself (observation 0, completion 1)."""
    lengths = np.empty(2 * len(first_len), np.int64)
    lengths[0::2], lengths[1::2] = first_len, second_len
    return np.repeat(np.tile(np.array([0, 1], np.int8), len(first_len)), lengths)


def interleave(first: np.ndarray, second: np.ndarray, second_mask: np.ndarray,
               dtype: np.dtype) -> np.ndarray:
    """Values of ``first`` where ``second_mask`` is False and of ``second`` where it is True,
    each in order: two gathered piece streams zipped back into their pieces' order."""
    out = np.empty(len(second_mask), dtype)
    out[~second_mask] = first
    out[second_mask] = second
    return out


def note(counter: Counter[str], reason: str, n: int | np.integer) -> None:
    """Count ``n`` occurrences of ``reason`` (nothing when 0, so summaries stay short)."""
    if n:
        counter[reason] += int(n)


class Lists:
    """A list column as flat numpy values, per-row start and length, and validity.

    A list with a null inside (only tables built by hand hold one: capture promotes whole
    lists of numbers) is treated as absent: a hole cannot be trained on, and the transition
    schema's lists hold no nulls. ``holey`` marks those rows."""

    def __init__(self, col: pa.Array | pa.ChunkedArray) -> None:
        self.array = arr(col)
        offsets = to_numpy(self.array.offsets)
        self.starts = offsets[:-1].astype(np.int64)
        self.lengths = np.diff(offsets).astype(np.int64)
        self.valid = (to_numpy(self.array.is_valid()) if self.array.null_count
                      else np.ones(len(self.array), bool))
        self.holey = np.zeros(len(self.array), bool)
        self._values: np.ndarray | None = None
        first, last = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
        used = self.array.values.slice(first, last - first)
        if used.null_count:
            at = np.flatnonzero(~to_numpy(used.is_valid())) + first
            self.holey[np.searchsorted(offsets, at, side="right") - 1] = True
            self.holey &= self.valid
            self.valid = self.valid & ~self.holey

    @property
    def values(self) -> np.ndarray:
        """All values (positions relative to the array's value buffer, as ``starts``)."""
        if self._values is None:
            values = self.array.values
            if values.null_count:  # only inside holey lists, which are never read
                values = pc.fill_null(values, lit(0, values.type))
            self._values = to_numpy(values)
        return self._values


def list_array(lengths: np.ndarray, values: pa.Array, mask: np.ndarray | None = None
               ) -> pa.ChunkedArray:
    """Lists of ``lengths`` over ``values`` (null where ``mask``), in as many chunks as int32
    offsets need (a chunk holds fewer than 2**31 values)."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    typ = values_list(values.type)
    if offsets[-1] <= MAX_LIST_VALUES:
        return pa.chunked_array([_list_chunk(offsets, values, mask)], typ)
    chunks, row = [], 0
    while row < len(lengths):
        end = int(np.searchsorted(offsets, offsets[row] + MAX_LIST_VALUES, side="right")) - 1
        end = max(end, row + 1)
        base = int(offsets[row])
        part = values.slice(base, int(offsets[end]) - base)
        chunks.append(_list_chunk(offsets[row:end + 1] - base, part,
                                  None if mask is None else mask[row:end]))
        row = end
    return pa.chunked_array(chunks, typ)


def _list_chunk(offsets: np.ndarray, values: pa.Array, mask: np.ndarray | None) -> pa.Array:
    return pa.ListArray.from_arrays(np_array(offsets.astype(np.int32)), values,
                                    type=values_list(values.type),
                                    mask=None if mask is None or not mask.any()
                                    else np_array(mask))


def take_lists(lists: Lists, rows: np.ndarray, *, valid: np.ndarray | None = None,
               dtype: np.dtype | None = None) -> pa.ChunkedArray:
    """The lists at ``rows`` (null where ``valid`` is False), values cast to ``dtype``."""
    lengths = lists.lengths[rows]
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    values = segments(lists.values, lists.starts[rows], lengths, dtype)
    return list_array(lengths, np_array(values),
                      mask=None if valid is None or valid.all() else ~valid)
