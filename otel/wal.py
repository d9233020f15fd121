"""The write-ahead log's on-disk format: names, durable appends, reading back.

A log is an Arrow IPC stream: a schema message carrying the partition in its metadata, then one
record-batch message per appended batch. Messages are serialized in memory and written with
``os.write``, not through a stream writer, so that a failed append (disk full, I/O error) can
be cut back to the last whole batch with ``ftruncate``: a log never holds a torn batch followed
by good ones, which no reader could get past.

A log's name fixes the name of the Parquet file it becomes:
``_wal/<pid>-<utc>-<seq>-<rand>.arrows`` -> ``<partition>/part-<utc>-<pid>-<seq>-<rand>.parquet``.
So whoever finds a log (its writer retrying, or ``recover`` after a kill) can see whether the
rotation already got as far as the rename, in which case only deleting the log is left. That is
what makes rotation idempotent under a kill at any step, with no second record to keep in sync.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

logger = logging.getLogger(__name__)

WAL_DIR = "_wal"
LOG_SUFFIX = ".arrows"
PARTITION_KEY = b"agl_bridge.partition"
_NAME = re.compile(r"^(\d+)-(\d{8}T\d{6})-(\d+)-([0-9a-f]+)$")
# what ``parquet_writer._partition`` produces; anything else in a log is refused, so a forged
# log cannot make recovery write outside the directory
_PARTITION = re.compile(r"^date=[0-9-]{1,16}/service=[A-Za-z0-9._-]{1,100}$")


class UnreadableLog(Exception):
    """A log whose contents cannot be read (permissions, I/O error, not a log): kept, reported."""


def new_log_name(seq: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{os.getpid()}-{stamp}-{seq:06d}-{uuid.uuid4().hex[:8]}{LOG_SUFFIX}"


def log_pid(path: str | os.PathLike[str]) -> int:
    """The pid of the process that wrote the log, or -1 if the name carries none."""
    head = Path(path).name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def parquet_name(log_path: str | os.PathLike[str]) -> str:
    """The Parquet file name a log becomes (deterministic, see the module docstring)."""
    stem = Path(log_path).name.removesuffix(LOG_SUFFIX)
    m = _NAME.match(stem)
    if m:
        pid, stamp, seq, rand = m.groups()
        return f"part-{stamp}-{pid}-{seq}-{rand}.parquet"
    return f"part-recovered-{stem}.parquet"  # a log named by an earlier version


def append_durably(fd: int, good_size: int, chunks: Iterable[bytes | memoryview | pa.Buffer]
                   ) -> int:
    """Write ``chunks`` at the end of ``fd`` (whose last complete record ends at
    ``good_size``) and fsync; return the new size. On failure the file is cut back to
    ``good_size`` (best effort) and the error re-raised, so no torn record stays in the middle.
    """
    size = good_size
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                n = os.write(fd, view)
                view = view[n:]
                size += n
        os.fsync(fd)
    except BaseException:
        try:
            os.ftruncate(fd, good_size)
            os.lseek(fd, good_size, os.SEEK_SET)
        except OSError:
            pass  # the caller stops appending to this file; readers stop at the torn tail
        raise
    return size


class LogFile:
    """One open log, appended to by one writer. Not thread-safe (the writer holds a lock)."""

    def __init__(self, path: Path, partition: str, schema: pa.Schema) -> None:
        self.path = path
        self.partition = partition
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        schema = schema.with_metadata({**(schema.metadata or {}),
                                       PARTITION_KEY: partition.encode()})
        self.size = 0
        try:
            self.size = append_durably(self._fd, 0, [schema.serialize()])
        except BaseException:  # an empty log holds nothing: recovery deletes it
            self.close()
            raise

    def append(self, table: pa.Table) -> None:
        """Append ``table``'s batches; durable on return."""
        if self._fd is None:
            raise ValueError(f"log {self.path} is closed")
        self.size = append_durably(self._fd, self.size,
                                   [b.serialize() for b in table.to_batches()])

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def iter_log(path: Path, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The whole batches of a log its writer closed, read one at a time, so memory holds one
    batch, not the file. A torn last batch (an append whose cut-back failed) ends the log, as
    in ``read_log``, and is logged; an I/O error raises (rotation retries, or ``recover``)."""
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.open_stream(f)
        _partition_of(reader.schema)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid as exc:
                logger.warning("agl_bridge: %s ends in a torn batch (%s); the batches before "
                               "it are kept", path, exc)
                return
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def _partition_of(schema: pa.Schema) -> str:
    """The partition a log's schema names; ``UnreadableLog`` if it names none we write."""
    partition = (schema.metadata or {}).get(PARTITION_KEY, b"").decode(errors="replace")
    if not _PARTITION.match(partition):
        raise UnreadableLog(f"no valid partition in its schema metadata ({partition!r})")
    return partition


@dataclass
class LogContents:
    partition: str | None  # None: the log is empty (its writer died before the schema)
    table: pa.Table | None  # None: no whole batch
    cut: str | None = None  # why reading stopped before the end: a torn last batch


def read_log(path: Path) -> LogContents:
    """Every whole batch of a log. Raises ``UnreadableLog`` when the file cannot be read at
    all or is not a log; a torn last batch (a kill mid-append) is not an error: ``cut``.

    The bytes are read with ``read``, not mapped: an I/O error is then an exception, which a
    memory map would turn into SIGBUS.
    """
    try:
        with open(path, "rb") as f:
            source = pa.py_buffer(f.read())
    except OSError as exc:
        raise UnreadableLog(f"cannot read it: {exc.strerror or exc}") from exc
    if source.size == 0:
        return LogContents(None, None)
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UnreadableLog(f"not an Arrow IPC stream ({exc})") from exc
    partition = _partition_of(reader.schema)
    batches, cut = [], None
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as exc:  # bytes in memory: a torn tail, not I/O
            cut = str(exc)
            break
    table = pa.Table.from_batches(batches, schema=reader.schema) if batches else None
    return LogContents(partition, table, cut)
