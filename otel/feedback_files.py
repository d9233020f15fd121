"""``agl-bridge feedback FILE --out SPANS_DIR``: scores exported by support tools and annotation
UIs (CSV, JSON lines or Parquet) imported into the span store as evaluation records.

Columns: ``id`` (an episode id, trace id or ``gen_ai.response.id``, optionally prefixed
``episode:``/``trace:``/``response:``) and ``value`` (a number; in JSON lines also an object of
named parts), optional ``name``, ``kind``, ``agent``, ``label``, ``explanation`` and ``time``
(unix seconds or ISO 8601: which of two scores for the same target and name is the latest;
without it, the import time, later lines winning). A bad row is reported as ``file:line`` with
the reason and quarantined; the others are imported. Written through the span Parquet writer,
so an import killed midway keeps every batch it wrote (``agl-bridge recover``) and a re-run
of the same file counts once at conversion (same target and name: the latest wins).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.evaluations import evaluation_attributes
from agl_bridge.otel.parquet_writer import SpanParquetWriter
from agl_bridge.otel.rows import evaluation_row

COLUMNS = ("id", "value", "name", "kind", "agent", "label", "explanation", "time")
MAX_UNIX_S = 2**63 / 1e9  # int64 nanoseconds
MAX_BAD_LISTED = 50
_BATCH = 5_000


@dataclass
class FeedbackImport:
    files: int = 0
    rows: int = 0
    imported: int = 0
    bad: list[str] = field(default_factory=list)  # "file:line: reason", the first MAX_BAD_LISTED
    bad_count: int = 0


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line, record) per data row; a string instead of a record says why the row is bad."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        missing = [c for c in ("id", "value") if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing} (has: {table.column_names})")
        yield from enumerate(table.select([c for c in COLUMNS if c in table.column_names])
                             .to_pylist(), 1)
        return
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    if name.endswith((".jsonl", ".ndjson", ".json")):
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                yield lineno, f"not JSON ({exc})"
                continue
            yield lineno, record if isinstance(record, dict) else "not a JSON object"
        return
    if not name.endswith((".csv", ".tsv")):
        raise ValueError(f"{path}: not a feedback file (.csv, .tsv, .jsonl, .json, .parquet)")
    reader = csv.DictReader(io.StringIO(text), delimiter="\t" if name.endswith(".tsv") else ",")
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in ("id", "value") if c not in header]
    if missing:
        raise ValueError(f"{path}:1: missing column(s) {missing} in the header {header}")
    reader.fieldnames = header
    for record in reader:
        if None in record:  # more cells than the header has names
            yield reader.line_num, "more cells than the header has columns"
            continue
        yield reader.line_num, {k: v for k, v in record.items() if v not in (None, "")}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what} is a boolean, not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{what} {value!r} is not a number") from None
    if not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise ValueError(f"{what} is past the range of a number ({len(str(value))} digits)"
                         ) from None
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return value


def _time_ns(value: Any) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _unix_ns(_number(value, "time"))
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return _unix_ns(_number(seconds, "time"))
    try:
        when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {text!r} is neither unix seconds nor ISO 8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return _unix_ns(when.timestamp())


def _unix_ns(seconds: float) -> int:
    """Nanoseconds since 1970, refused outside what a span's timestamp holds (year 2262)."""
    if not 0 <= seconds < MAX_UNIX_S:
        raise ValueError(f"time {seconds!r} is not unix seconds between 1970 and 2262")
    return int(seconds * 1e9)


def _row(record: dict[str, Any], now_ns: int) -> dict[str, Any]:
    unknown = sorted(set(record) - set(COLUMNS))
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; expected {list(COLUMNS)}")
    target = record.get("id")
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"id must be a non-empty string, got {target!r}")
    raw = record.get("value")
    if raw is None:
        raise ValueError("value is missing")
    value: float | dict[str, float]
    if isinstance(raw, dict):
        value = {str(k): _number(v, f"value part {k!r}") for k, v in raw.items()}
    else:
        value = _number(raw, "value")
    kind = record.get("kind") or "human"
    attributes = evaluation_attributes(
        target.strip(), value, name=record.get("name"), kind=kind, agent=record.get("agent"),
        label=record.get("label"), explanation=record.get("explanation"))
    when = _time_ns(record["time"]) if record.get("time") not in (None, "") else now_ns
    return evaluation_row(attributes, service_name="agl_bridge.feedback", time_unix_nano=when)


def import_feedback(sources: list[str | os.PathLike[str]], out: str | os.PathLike[str]
                    ) -> FeedbackImport:
    """Import feedback files (or the files of a directory) into the span store at ``out``."""
    summary = FeedbackImport()
    writer = SpanParquetWriter(out)
    quarantined: list[dict[str, Any]] = []
    try:
        for path in _files(sources):
            summary.files += 1
            rows: list[dict[str, Any]] = []
            start = time.time_ns()
            try:
                for lineno, record in _records(path):
                    summary.rows += 1
                    where = f"{path}:{lineno}"
                    try:
                        if isinstance(record, str):
                            raise ValueError(record)
                        rows.append(_row(record, start + lineno))  # later lines win ties
                    except (ValueError, TypeError, ArithmeticError) as exc:  # one row: named
                        summary.bad_count += 1
                        if len(summary.bad) < MAX_BAD_LISTED:
                            summary.bad.append(f"{where}: {exc}")
                        quarantined.append({"source": where, "error": str(exc),
                                            "record": record})
                    if len(rows) >= _BATCH:
                        writer.write_rows(rows)
                        summary.imported += len(rows)
                        rows = []
            except (OSError, ValueError) as exc:  # the file itself: named, the others go on
                summary.bad_count += 1
                summary.bad.append(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
            writer.write_rows(rows)
            summary.imported += len(rows)
        if quarantined:
            writer.quarantine(quarantined)
    finally:
        writer.close()
    return summary


def _files(sources: list[str | os.PathLike[str]]) -> Iterator[Path]:
    for source in sources:
        p = Path(source)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.is_file() and not q.is_symlink()
                              and q.suffix.lower() in (".csv", ".tsv", ".jsonl", ".ndjson",
                                                       ".json", ".parquet"))
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
