"""``agl-bridge import``: OpenTelemetry Collector file-exporter output into span Parquet.

The Collector's file exporter writes one OTLP/JSON request per line (``.json``/``.jsonl``,
optionally gzipped). Each line goes through the same decoding and row mapping as the receiver:
a ``resourceSpans`` line as spans (``otlp``), a ``resourceLogs`` line as log records
(``otlp_logs``: evaluation events become rows, other records are counted and skipped; a file
exporter in both pipelines writes both kinds of line into one file). A malformed line is
reported with ``file:line`` and quarantined, the rest imported.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.otel import otlp, otlp_logs
from agl_bridge.otel.parquet_writer import SpanParquetWriter

_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_WRITE_EVERY_ROWS = 10_000


@dataclass
class ImportSummary:
    files: int = 0
    lines: int = 0
    lines_bad: int = 0  # an unreadable file counts as one bad line (its first)
    spans_written: int = 0
    spans_rejected: int = 0
    log_records_written: int = 0  # evaluation events
    log_records_rejected: int = 0
    log_records_ignored: int = 0  # log records that are not evaluation events
    bad: list[str] = field(default_factory=list)  # "file:line: why", in file order

    def summary(self) -> str:
        logs = (f"; {self.log_records_written} evaluation event(s) imported, "
                f"{self.log_records_rejected} quarantined, {self.log_records_ignored} other log "
                f"record(s) skipped") if (self.log_records_written or self.log_records_rejected
                                          or self.log_records_ignored) else ""
        return (f"imported {self.spans_written} span(s) from {self.lines} line(s) in "
                f"{self.files} file(s); {self.lines_bad} bad line(s), "
                f"{self.spans_rejected} span(s) quarantined{logs}")

    @property
    def rejected(self) -> int:
        """Spans and log records quarantined."""
        return self.spans_rejected + self.log_records_rejected


def decode_line(line: bytes) -> list[otlp.Conversion]:
    """One line of a Collector file: the traces and/or logs request it holds (a line holds one
    request; anything else, metrics for example, gives nothing). MalformedRequest if it is not
    OTLP/JSON."""
    obj = otlp.loads(line)
    if isinstance(obj, dict) and any(obj.get(k) is not None
                                     for k in ("resourceLogs", "resource_logs")):
        out: list[otlp.Conversion] = [otlp_logs.json_to_rows(obj)]
        if any(obj.get(k) is not None for k in ("resourceSpans", "resource_spans")):
            out.append(otlp.json_to_rows(obj))
        return out
    return [otlp.json_to_rows(obj)]


def otlp_json_files(sources: Sequence[str | os.PathLike[str]], *,
                    exclude: Path | None = None) -> list[Path]:
    """The files to import: given files as they are, directories searched for .json/.jsonl(.gz).

    ``exclude`` (the output directory) is skipped, or its own quarantine files would be read.
    A name that looks like a file but cannot be read as one (a symlink loop, a dangling link, a
    FIFO) is listed too, so that the import reports it rather than skipping it unsaid.
    """
    files: list[Path] = []
    outside = os.path.realpath(exclude) if exclude else None
    for src in sources:
        p = Path(src)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.name.endswith(_SUFFIXES)
                           and not q.is_dir() and not (
                               outside and Path(os.path.realpath(q)).is_relative_to(outside)))
            if not found:
                raise FileNotFoundError(f"no {', '.join(_SUFFIXES)} files under {p}")
            files.extend(found)
        elif os.path.lexists(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    for path in files:
        if _unreadable(path) is None:
            with open(path, "rb") as f:
                if f.read(4) == _ZSTD_MAGIC:
                    raise ValueError(f"{path} is zstd-compressed; decompress it first (zstd -d)")
    return files


def _unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a regular file, or None. Never opens it (a FIFO blocks)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if path.is_symlink():
            return f"a dangling symlink to {os.readlink(path)}"
        return exc.strerror or str(exc)
    return None if stat.S_ISREG(mode) else "not a regular file"


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as f:
        yield from enumerate(f, 1)


def import_otlp_json(sources: Sequence[str | os.PathLike[str]], writer: SpanParquetWriter,
                     *, on_bad_line: Callable[[str], None] | None = None) -> ImportSummary:
    """Import Collector file-exporter output (one OTLP/JSON request per line) into ``writer``.

    Bad lines and spans are quarantined with their source ``file:line``; the writer stays open.
    """
    summary = ImportSummary()
    rows: list[dict[str, Any]] = []
    quarantine: list[dict[str, Any]] = []

    def bad(source: str, error: str, line: bytes | None) -> None:
        summary.lines_bad += 1
        summary.bad.append(f"{source}: {error}")
        quarantine.append({"error": error, "source": source,
                           "line": None if line is None else line.decode("utf-8", "replace")})
        if on_bad_line is not None:
            on_bad_line(f"{source}: {error}")

    for path in otlp_json_files(sources, exclude=writer.directory):
        summary.files += 1
        lineno = 0
        why = _unreadable(path)
        if why is not None:  # nothing of it can be read: its first line is the bad one
            bad(f"{path}:1", f"cannot read: {why}", None)
            continue
        try:
            for lineno, line in _lines(path):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                summary.lines += 1
                try:
                    conversions = decode_line(line)
                except otlp.MalformedRequest as exc:
                    bad(f"{path}:{lineno}", str(exc)[:500], line)
                    continue
                for conversion in conversions:
                    rows.extend(conversion.rows)
                    quarantine.extend(dict(r, source=f"{path}:{lineno}")
                                      for r in conversion.rejected)
                    for name, n in conversion.counts().items():
                        setattr(summary, name, getattr(summary, name) + n)
                if len(rows) >= _WRITE_EVERY_ROWS:
                    writer.write_rows(rows)
                    rows = []
        except (OSError, EOFError, zlib.error) as exc:  # a gzip stream cut short or corrupt
            bad(f"{path}:{lineno + 1}", f"cannot read further: {exc}", None)
    writer.write_rows(rows)
    if quarantine:
        writer.quarantine(quarantine)
    return summary
