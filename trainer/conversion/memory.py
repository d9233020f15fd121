"""Memory of a long conversion: handing freed memory back, and allocators for short-lived
arrays.

``release_memory`` gives back what the conversion freed (called every few dozen batches; it
changes nothing for other code). ``short_lived_arrays`` changes process-wide allocator
settings for its duration, so only the process's owner uses it: the ``agl-bridge convert``
command does, and a library caller may (``convert(..., tune_allocators=True)``).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import pyarrow as pa


def _malloc_trim() -> Callable[[int], int] | None:
    if os.name != "posix":
        return None
    try:
        return cast(Callable[[int], int], ctypes.CDLL("libc.so.6").malloc_trim)
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Give freed memory back to the system: Arrow's pool, and the C heap (numpy's
    temporaries; glibc keeps large freed blocks otherwise). A bound on slow growth from
    fragmentation on very long inputs."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


@contextmanager
def short_lived_arrays() -> Iterator[None]:
    """Allocators suited to memory that lives for one batch, for the block, then restored.

    Each batch allocates a few hundred MiB and frees them. Memory handed back to the kernel
    comes back zeroed at its next touch (``clear_page``), in 2 MiB huge pages where the
    allocator asked for them, so a conversion kept paying for zeroing:

    * numpy asks for huge pages for every array of 4 MiB or more: off (numpy's private
      switch; nothing happens if it is gone);
    * Arrow's default pool (mimalloc) returned the Parquet reader's growing buffers and
      faulted them in again batch after batch; jemalloc keeps freed extents for reuse a while.
      Used where the wheel has it, unless ``ARROW_DEFAULT_MEMORY_POOL`` chooses a pool.

    Both switches are process-wide: other threads allocating meanwhile get the same
    allocators, which is harmless (buffers remember their pool), but it is the process
    owner's decision. Measured effect: ``benchmarks/README_convert.md``.
    """
    restore: list[Callable[[], Any]] = []
    hugepage = _hugepage_switch()
    if hugepage is not None:
        previous = hugepage(False)
        restore.append(lambda: hugepage(previous))
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pool = pa.jemalloc_memory_pool()
        except NotImplementedError:  # a build without jemalloc (Windows wheels)
            pool = None
        if pool is not None:
            previous_pool = pa.default_memory_pool()
            pa.set_memory_pool(pool)
            restore.append(lambda: pa.set_memory_pool(previous_pool))
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()


def _hugepage_switch() -> Callable[[bool], bool] | None:
    """numpy's private switch (numpy 2: ``numpy._core``, 1.x: ``numpy.core``), if it exists."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        switch = getattr(module, "_set_madvise_hugepage", None)
        if switch is not None:
            return cast(Callable[[bool], bool], switch)
    return None
