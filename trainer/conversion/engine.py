"""``convert``: span files in, a transitions Parquet file out, by the route the input needs.

* OTLP/JSON (the Collector's file exporter) is imported to span Parquet first;
* span Parquet whose tasks are local in the input (as GRPO rollouts of one task run together)
  streams (``streaming.py``): memory follows a batch and the tasks in flight;
* a small input (at most ``max_rows_in_memory`` rows) that cannot stream is converted in
  memory; a larger one is spilled to buckets by task and converted bucket by bucket
  (``spill.py``), as is any input when retokenizing.

Every route ends in ``stages.convert_rows``, the one implementation of the converter's
semantics; ``spans_to_transitions`` is that function for a table already in memory.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge.parquet_io import write_table_atomic
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.columns import columns_to_read
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig, MissingReward
from agl_bridge.trainer.conversion.evaluations import (
    resolve_files,
    resolve_tables,
    scan_files,
    scan_tables,
)
from agl_bridge.trainer.conversion.finish import finish_files, finish_table, needs_finish
from agl_bridge.trainer.conversion.memory import short_lived_arrays
from agl_bridge.trainer.conversion.partition import Part, check_part, rows_in_part
from agl_bridge.trainer.conversion.sources import Source, otlp_json_files, read_spans, span_files
from agl_bridge.trainer.conversion.spill import convert_spilled
from agl_bridge.trainer.conversion.stages import convert_rows
from agl_bridge.trainer.conversion.streaming import convert_streaming, stream_plan
from agl_bridge.trainer.rewards.baselines import GROUP
from agl_bridge.trainer.rewards.evaluations import EvaluationReward, Resolved

Progress = Callable[[int, int], None]


def spans_to_transitions(spans: pa.Table, config: ConvertConfig | None = None, *,
                         missing_reward: MissingReward | None = None,
                         source: str = "") -> tuple[pa.Table, ConversionStats]:
    """Transitions from a span table (SPAN_SCHEMA columns; the required ones at least), and
    what happened. ``source`` names where the rows came from, for messages. Evaluation
    records in the table (feedback, ``gen_ai.evaluation.result``) are joined to their
    episodes."""
    cfg = _config(config, missing_reward)
    if cfg.retokenize:  # other instrumentors' sessions are episodes (foreign.py)
        from agl_bridge.trainer.conversion.foreign import trace_sessions, with_session_episodes

        spans = with_session_episodes(spans, trace_sessions([spans]))
    found = scan_tables([spans])
    resolved = resolve_tables(found, [spans], weights=cfg.evaluation_weights,
                              labels=cfg.evaluation_labels) if found else None
    table, stats = _convert_table(spans, cfg, source, resolved.rewards if resolved else None)
    _note(stats, resolved)
    return finish_table(table, cfg, stats), stats


def _convert_table(spans: pa.Table, cfg: ConvertConfig, source: str,
                   evaluations: Mapping[str, list[EvaluationReward]] | None
                   ) -> tuple[pa.Table, ConversionStats]:
    if not cfg.retokenize:
        return convert_rows(spans, cfg, source, evaluations=evaluations)
    from agl_bridge.trainer.conversion.foreign import normalize
    from agl_bridge.trainer.conversion.retokenize import fill_ids

    before = ConversionStats()
    spans = fill_ids(normalize(spans, before), cfg.retokenize, before)
    table, stats = convert_rows(spans, cfg, source, evaluations=evaluations)
    stats.notes.update(before.notes)
    return table, stats


def _note(stats: ConversionStats, resolved: Resolved | None) -> None:
    """What became of the evaluations: joined, superseded, unknown (listed), ..."""
    if resolved is not None:
        stats.notes.update(resolved.notes)
        stats.unknown_evaluations += resolved.unknown[:stats.MAX_LISTED]


def convert(source: Source, out_path: str | os.PathLike[str],
            config: ConvertConfig | None = None, *,
            missing_reward: MissingReward | None = None,
            max_rows_in_memory: int = 100_000, progress: Progress | None = None,
            tune_allocators: bool = False,
            evaluations_from: Source | None = None, part: Part | None = None,
            finish: bool = True) -> ConversionStats:
    """Spans under ``source`` -> transitions Parquet at ``out_path`` (written atomically).

    ``source``: span Parquet (a file, a directory tree of partitions, or a list), or OTLP/JSON
    files as the OpenTelemetry Collector's file exporter writes them (``*.json``, ``*.jsonl``,
    gzipped too, or a directory of them). Only the columns conversion uses are read.
    ``progress(done, total)`` is called per batch read (streaming) or per bucket.
    ``tune_allocators``: switch process-wide allocator settings for the call
    (``memory.short_lived_arrays``; the ``agl-bridge convert`` command does).
    ``evaluations_from``: span files (a directory) whose evaluation records count too, beside
    those in ``source`` (feedback lands anywhere; a loop converts only its new span files).
    ``part=(i, n)``: convert only part i of n of the tasks (``partition.py``: a range of the
    input's row groups when it streams, else a task hash); another process or machine converts
    each other part, and the parts together hold the rows of the whole conversion. Counts that
    are not per task (files read, evaluation records) are in part 0's statistics only. A part
    cannot finish the ``batch`` and ``key:`` baselines, which span all parts:
    ``convert_parallel`` does that after its parts (``finish=False`` is how it asks a part to
    leave them).
    """
    cfg = _config(config, missing_reward)
    if max_rows_in_memory < 1:
        raise ValueError(f"max_rows_in_memory must be positive, got {max_rows_in_memory}")
    if part is not None:
        part = check_part(part)
        if part[1] > 1 and finish and cfg.baselines[0] not in (GROUP, "none"):
            raise ValueError(_PART_BASELINE)  # every transition would need it: say so now
    # where late evaluations may be: an odd file there is skipped (and named if converted)
    extra = span_files(evaluations_from, []) if evaluations_from is not None else []
    job = _Job(Path(out_path), cfg, max_rows_in_memory, progress, part, finish)
    with short_lived_arrays() if tune_allocators else nullcontext():
        otlp = otlp_json_files(source)
        if otlp:
            return _convert_otlp(source, otlp, job)
        skipped: list[tuple[Path, str]] = []
        files = span_files(source, skipped)
        return _convert_files(files, f" (under {source})", job, extra, skipped)


@dataclass(frozen=True)
class _Job:
    """What every route of one ``convert`` call needs besides its input."""

    out_path: Path
    cfg: ConvertConfig
    max_rows_in_memory: int
    progress: Progress | None
    part: Part | None
    finish: bool

    @property
    def first_part(self) -> bool:
        """This process counts what is not per task (files read, evaluation records)."""
        return self.part is None or self.part[0] == 0


_PART_BASELINE = ("the batch and key: baselines compare transitions across all parts; a single "
                  "part cannot compute them: convert with workers (convert_parallel, "
                  "agl-bridge convert --workers N), or give each part --baseline group (the "
                  "default group,batch fell back to the batch for episodes without a "
                  "repeated task)")


def _config(config: ConvertConfig | None, missing_reward: MissingReward | None
            ) -> ConvertConfig:
    cfg = config or ConvertConfig()
    if missing_reward is not None:
        cfg = dataclasses.replace(cfg, missing_reward=missing_reward)
    recipe = cfg.recipe
    if recipe is not None:  # the recipe's [evaluations], unless given explicitly
        if cfg.evaluation_weights is None and recipe.evaluation_weights is not None:
            cfg = dataclasses.replace(cfg, evaluation_weights=recipe.evaluation_weights)
        if cfg.evaluation_labels is None and recipe.evaluation_labels is not None:
            cfg = dataclasses.replace(cfg, evaluation_labels=recipe.evaluation_labels)
    return cfg


def _convert_files(files: list[Path], where: str, job: _Job, extra: Sequence[Path] = (),
                   skipped: Sequence[tuple[Path, str]] = ()) -> ConversionStats:
    if not job.cfg.retokenize:
        return _convert_span_files(files, where, job, extra, skipped)
    from agl_bridge.trainer.conversion.foreign import session_episodes

    # other instrumentors' sessions are episodes: set before anything reads the files (the
    # extra evaluation sources among them are read as rewritten, once)
    seen = {p.resolve() for p in files}
    with session_episodes(files) as read:
        return _convert_span_files(read, where, job,
                                   [p for p in extra if p.resolve() not in seen], skipped)


def _convert_span_files(files: list[Path], where: str, job: _Job, extra: Sequence[Path] = (),
                        skipped: Sequence[tuple[Path, str]] = ()) -> ConversionStats:
    cfg, part = job.cfg, job.part
    seen = {p.resolve() for p in files}
    found = scan_files(files + [p for p in extra if p.resolve() not in seen])
    resolved = resolve_files(found, files, weights=cfg.evaluation_weights,
                             labels=cfg.evaluation_labels) if found else None
    stats = _route(files, where, job, resolved.rewards if resolved else None)
    if job.first_part:
        _note(stats, resolved)
        for path, why in skipped:  # named, the others converted
            stats.notes[reasons.unreadable_file(path.name, why)] += 1
    else:  # counted once, by part 0: the files, and what the evaluation records came to
        stats.files = 0
        for key in [k for k in stats.notes if k.startswith(reasons.UNREADABLE_FILE_PREFIX)]:
            del stats.notes[key]
    if job.finish:
        if part is not None and part[1] > 1 and needs_finish(stats):
            job.out_path.unlink(missing_ok=True)  # some transitions fell back to one
            raise ValueError(_PART_BASELINE)
        finish_files([job.out_path], cfg, stats)
    return stats


def _route(files: list[Path], where: str, job: _Job,
           evaluations: Mapping[str, list[EvaluationReward]] | None) -> ConversionStats:
    cfg, limit = job.cfg, job.max_rows_in_memory
    columns = columns_to_read(bool(cfg.retokenize), cfg.extra_columns)
    if not cfg.retokenize:
        plan = stream_plan(files, limit, columns, job.part)
        if plan is not None:
            return convert_streaming(plan, job.out_path, cfg, columns, where, job.progress,
                                     evaluations)
    total_rows = 0
    for path in files:
        try:
            total_rows += pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowInvalid, OSError):
            pass  # counted when read
    if total_rows > limit:
        return convert_spilled(files, job.out_path, columns, total_rows, limit,
                               lambda t: _convert_table(t, cfg, where, evaluations),
                               job.progress, job.part)
    read = ConversionStats()
    spans = read_spans(files, read, columns)
    if job.part is not None:
        spans = rows_in_part(spans, job.part)
    table, stats = _convert_table(spans, cfg, where, evaluations)
    stats.notes.update(read.notes)
    stats.files = read.files
    if job.progress:
        job.progress(1, 1)
    write_table_atomic(table, job.out_path)
    return stats


def _convert_otlp(source: Source, otlp: list[Path], job: _Job) -> ConversionStats:
    """OTLP/JSON files imported to span Parquet in a temporary directory, converted with the
    Parquet among the sources."""
    from agl_bridge.otel.collector_files import import_otlp_json
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    parquet = [s for s in sources if Path(s) not in otlp and not
               (Path(s).is_dir() and all(p in otlp for p in Path(s).rglob("*") if p.is_file()))]
    with tempfile.TemporaryDirectory(prefix="agl-bridge-otlp-") as tmp:
        writer = SpanParquetWriter(tmp, background_rotation=False, recover=False)
        summary = import_otlp_json(otlp, writer)
        writer.close()
        stats = _convert_files(span_files([tmp, *parquet]), f" (under {source})", job)
    if summary.lines_bad and job.first_part:
        stats.notes[reasons.OTLP_LINE_BAD] += summary.lines_bad
    return stats
