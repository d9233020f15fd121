"""Where spans come from: span Parquet files (one, a tree of partitions, a list) or the
OpenTelemetry Collector's OTLP/JSON files, checked before anything is converted.

A path that is no span Parquet file (a FIFO or device named ``*.parquet``, a broken or looping
link, not Parquet, truncated, a required column missing) or whose columns have the wrong types
is skipped, named in the notes with why, and the others are converted: the live loop converts a
whole trace directory, where one odd file must not stop training.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge.parquet_io import SchemaError, iter_parquet_files, read_checked
from agl_bridge.schema import REQUIRED_SPAN_COLUMNS, SPAN_SCHEMA
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.config import ConversionStats

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

OTLP_JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


class WrongTypes(ValueError):
    """A span file whose columns do not have the span schema's types."""


def otlp_json_files(source: Source) -> list[Path]:
    """The OTLP/JSON files of ``source``: files named ``*.json[l][.gz]``, and those under a
    directory that holds no Parquet (a Collector file exporter's output folder)."""
    out: list[Path] = []
    for s in _sources(source):
        p = Path(s)
        if p.is_file() and p.name.endswith(OTLP_JSON_SUFFIXES):
            out.append(p)
        elif p.is_dir() and not any(p.rglob("*.parquet")):
            out += sorted(q for q in p.rglob("*") if q.is_file()
                          and q.name.endswith(OTLP_JSON_SUFFIXES))
    return out


def span_files(source: Source, skipped: list[tuple[Path, str]] | None = None) -> list[Path]:
    """The span Parquet files of ``source``. A path that is none (a FIFO or a device named
    ``*.parquet``, which would block or never end; a broken or looping link; not Parquet; no
    required column) is left out and added to ``skipped`` with why: one odd file in a live
    directory must not stop the conversion of the others. Without ``skipped``, it is an error
    naming it."""
    files: list[Path] = []
    for path in iter_parquet_files(_sources(source)):
        try:
            if not path.is_file():  # never opened: a FIFO's reader waits for a writer
                raise OSError(f"{path}: not a regular file")
            names = pq.read_schema(path).names  # the footer only
            missing = [c for c in REQUIRED_SPAN_COLUMNS if c not in names]
            if missing:
                raise SchemaError(f"{path}: missing required column(s) "
                                  f"{', '.join(repr(c) for c in missing)} (not span Parquet)")
        except (OSError, pa.ArrowInvalid, SchemaError) as exc:
            if skipped is None:
                raise
            text = str(exc)
            skipped.append((path, text.split(": ", 1)[1] if text.startswith(f"{path}: ")
                            else why(exc)))
            continue
        files.append(path)
    if not files:
        raise FileNotFoundError(f"no span Parquet files under {source} (nor OTLP/JSON files)"
                                + "".join(f"; skipped {p}: {w}" for p, w in (skipped or [])[:5]))
    return files


def _sources(source: Source) -> list[str | os.PathLike[str]]:
    return [source] if isinstance(source, (str, os.PathLike)) else list(source)


def type_problems(schema: pa.Schema, columns: Iterable[str]) -> list[str]:
    """What is wrong with the types of ``columns`` in a file's ``schema`` (empty: nothing).
    Lists compare by value type (older files declare nullable values), an all-null column
    of type null fits anything."""
    problems = []
    for name in columns:
        if name not in schema.names:
            continue
        got, want = schema.field(name).type, SPAN_SCHEMA.field(name).type
        if not _fits(got, want):
            problems.append(f"column {name!r} is {got}, expected {want}")
    return problems


def _fits(got: pa.DataType, want: pa.DataType) -> bool:
    """Same type, or numbers of another width (cast on read; a value that does not fit
    makes the file unreadable, named), lists of such, or the null type."""
    if got == want or pa.types.is_null(got):
        return True
    if pa.types.is_list(got) or pa.types.is_large_list(got):
        return pa.types.is_list(want) and _fits(got.value_type, want.value_type)
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_floating(got) or pa.types.is_integer(got)
    if pa.types.is_string(want):
        return pa.types.is_large_string(got)
    return False


def check_file(path: Path, columns: Sequence[str]) -> pq.ParquetFile:
    """The file opened (memory-mapped), refused when a required column is missing
    (``SchemaError``) or a column it has is of the wrong type (``WrongTypes``)."""
    pf = pq.ParquetFile(path, memory_map=True)
    names = pf.schema_arrow.names
    if any(c not in names for c in REQUIRED_SPAN_COLUMNS):
        read_checked(path, REQUIRED_SPAN_COLUMNS)  # raises, naming file and column
    problems = type_problems(pf.schema_arrow, columns)
    if problems:
        raise WrongTypes("; ".join(problems))
    return pf


def read_tables(files: Iterable[Path], stats: ConversionStats | None,
                columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """Each readable file's ``columns`` (all span columns without), in span schema types.
    A file that cannot be read, or of the wrong types, is counted in ``stats`` and skipped
    (raised when ``stats`` is None)."""
    wanted = list(columns) if columns is not None else SPAN_SCHEMA.names
    for path in files:
        try:
            pf = check_file(path, wanted)
            table = conform_types(pf.read(columns=[c for c in wanted
                                                   if c in pf.schema_arrow.names]))
        except SchemaError:
            raise
        except (pa.ArrowInvalid, OSError, WrongTypes) as exc:
            if stats is None:
                raise
            stats.notes[reasons.unreadable_file(path.name, why(exc))] += 1
            continue
        if stats is not None:
            stats.files += 1
        yield table


def why(exc: Exception) -> str:
    """How a skipped file's note says what was wrong."""
    return str(exc) if isinstance(exc, WrongTypes) else type(exc).__name__


def conform_types(table: pa.Table) -> pa.Table:
    """The table's columns in span schema types and order (lists with non-null values)."""
    keep = [c for c in SPAN_SCHEMA.names if c in table.column_names]
    table = table.select(keep)
    target = pa.schema([SPAN_SCHEMA.field(c) for c in keep])
    return table if table.schema.equals(target) else table.cast(target)


def read_spans(source: Source, stats: ConversionStats | None = None,
               columns: Sequence[str] | None = None) -> pa.Table:
    """Span Parquet (file, directory tree or list) as one table. See ``read_tables``; with
    ``stats``, what is no span file is skipped and named there too."""
    skipped: list[tuple[Path, str]] | None = [] if stats is not None else None
    tables = list(read_tables(span_files(source, skipped), stats, columns))
    for path, why in skipped or []:
        stats.notes[reasons.unreadable_file(path.name, why)] += 1  # type: ignore[union-attr]
    if not tables:
        return SPAN_SCHEMA.empty_table() if columns is None else pa.schema(
            [SPAN_SCHEMA.field(c) for c in columns]).empty_table()
    return pa.concat_tables(tables, promote_options="default")


def with_columns(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``columns`` in schema order, those a file lacks (older writers) as nulls."""
    for name in columns:
        if name not in table.column_names:
            f = SPAN_SCHEMA.field(name)
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(list(columns))
