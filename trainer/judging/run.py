"""``judge_spans``: score the episodes of a span directory with an LLM judge, write the scores
into it as evaluations, and remember them.

1. The episodes are read as text (``spans``); malformed files and spans are named.
2. They become units (``rewards.judge.units_for``): an episode each (absolute) or a group per
   task (relative); ``max_episodes`` takes the first units, never splitting a group.
3. A unit whose verdict is in the cache (``cache``) costs nothing. The others are judged
   concurrently (a bounded thread pool; a progress bar on stderr): an answer that holds no
   usable verdict is asked again, up to ``retries`` times (sampled at temperature 0.7 or more:
   at 0 the same prompt would give the same answer), as are timeouts and transient HTTP
   errors; after that the unit's episodes are reported by id with the reason and the start of
   the last answer, and the others go on.
4. Each verdict is written as evaluation records (``agl_bridge.feedback.evaluation_row``:
   target ``episode:<id>``, name ``judge:<rubric>``, kind ``judge``; the explanation only at
   capture level ``messages``) through the crash-safe span writer, then cached.

The judge's own requests are plain HTTP (``client``): they never become spans, so never
training data.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.capture import capture_messages
from agl_bridge.feedback import evaluation_attributes, evaluation_row, flush_feedback, write_rows
from agl_bridge.trainer.judging.cache import JudgeCache
from agl_bridge.trainer.judging.client import JudgeHTTPError, chat
from agl_bridge.trainer.judging.spans import read_episodes, tokenizer_decoder
from agl_bridge.trainer.rewards.judge import (
    ABSOLUTE,
    DEFAULT_MAX_EPISODE_CHARS,
    MODES,
    RELATIVE,
    Rubric,
    Unit,
    Verdict,
    VerdictError,
    absolute_messages,
    answer_start,
    cache_key,
    limit_units,
    parse_rubric,
    parse_verdict,
    prompt_order,
    relative_messages,
    units_for,
    verdict_schema,
)

RETRY_TEMPERATURE = 0.7
SERVICE_NAME = "agl_bridge.judge"
MAX_LISTED = 20


@dataclass
class JudgeSummary:
    """What a run did. ``failed``: episode id -> why it has no score (unreadable, unparsable
    verdicts after the retries, HTTP errors)."""

    mode: str
    model: str
    rubric: str
    episodes: int = 0  # readable episodes taken for judging
    unreadable: int = 0  # episodes whose text could not be built (in failed, named)
    scored: int = 0  # judged now and written
    cached: int = 0  # verdicts from the cache: nothing asked, nothing written
    failed: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    answers: int = 0  # requests that got an answer
    unparsable: int = 0  # answers that held no usable verdict
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)  # malformed files, spans, cache lines

    @property
    def parse_rate(self) -> float | None:
        return None if not self.answers else 1.0 - self.unparsable / self.answers

    def summary(self) -> str:
        rate = f" (parse rate {self.parse_rate:.0%})" if self.parse_rate is not None else ""
        speed = (f", {self.scored / self.seconds:.2f} episodes/s judged"
                 if self.scored and self.seconds else "")
        unreadable = (f"; {self.unreadable} episode(s) could not be read"
                      if self.unreadable else "")
        lines = [f"judge {self.model}, {self.mode}, rubric {self.rubric}: {self.episodes} "
                 f"episode(s): {self.scored} scored, {self.cached} from the cache, "
                 f"{len(self.failed) - self.unreadable} failed{unreadable}; {self.requests} "
                 f"request(s), {self.answers} answer(s), {self.unparsable} unparsable{rate}; "
                 f"{self.seconds:.1f} s{speed}"]
        for episode, why in list(self.failed.items())[:MAX_LISTED]:
            lines.append(f"  failed: episode {episode}: {why}")
        if len(self.failed) > MAX_LISTED:
            lines.append(f"  ... and {len(self.failed) - MAX_LISTED} more failed episode(s)")
        return "\n".join(lines)


def load_rubric(path: str | os.PathLike[str]) -> Rubric:
    """A rubric file: ``.toml`` (name, instructions, scale), else plain text (named after
    the file)."""
    from agl_bridge.settings import read_text

    p = Path(path)
    text = read_text(p, "rubric")
    return parse_rubric(text, source=str(p), toml=p.suffix.lower() == ".toml",
                        default_name=p.stem)


@dataclass
class _Outcome:
    unit: Unit
    verdict: Verdict | None = None
    error: str | None = None
    requests: int = 0
    answers: int = 0
    unparsable: int = 0


@dataclass(frozen=True)
class _Settings:
    base_url: str
    model: str
    mode: str
    rubric: Rubric
    retries: int
    timeout_s: float
    temperature: float
    max_tokens: int | None
    api_key: str | None
    structured: bool
    max_episode_chars: int
    extra_body: dict[str, Any] | None = None


def _body(s: _Settings, unit: Unit, temperature: float) -> dict[str, Any]:
    n = len(unit.episodes)
    if s.mode == ABSOLUTE:
        messages = absolute_messages(s.rubric, unit.episodes[0], max_chars=s.max_episode_chars)
    else:
        messages = relative_messages(s.rubric, unit.episodes, max_chars=s.max_episode_chars)
    max_tokens = s.max_tokens or (400 if s.mode == ABSOLUTE else 150 + 100 * n)
    body: dict[str, Any] = {"model": s.model, "messages": messages,
                            "temperature": temperature, "max_tokens": max_tokens}
    if s.structured:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "verdict", "strict": True, "schema": verdict_schema(s.mode, s.rubric, n)}}
    if s.extra_body:
        body.update(s.extra_body)
    return body


def _judge_unit(s: _Settings, unit: Unit) -> _Outcome:
    """Ask until a usable verdict comes back or the retries are spent (runs in a worker)."""
    out = _Outcome(unit)
    for attempt in range(1 + s.retries):
        temperature = s.temperature if attempt == 0 else max(s.temperature, RETRY_TEMPERATURE)
        out.requests += 1
        try:
            answer = chat(s.base_url, _body(s, unit, temperature), timeout_s=s.timeout_s,
                          api_key=s.api_key)
        except JudgeHTTPError as exc:
            out.error = f"{exc} (after {out.requests} request(s))"
            if not exc.transient:
                return out
            if attempt < s.retries:
                time.sleep(min(0.2 * 2 ** attempt, 5.0))
            continue
        out.answers += 1
        try:
            out.verdict = parse_verdict(s.mode, answer.text, s.rubric, unit.episodes)
            out.error = None
            return out
        except VerdictError as exc:
            out.unparsable += 1
            cut = " (cut short at max_tokens)" if answer.finish_reason == "length" else ""
            out.error = (f"unparsable verdict after {out.requests} request(s): {exc}{cut}; "
                         f"the answer began: {answer_start(answer.text)!r}")
    return out


def _write(directory: Path, s: _Settings, verdict: Verdict) -> None:
    """The verdict's scores as evaluation records, durable on return."""
    now = time.time_ns()
    rows = []
    for episode, score in verdict.scores.items():
        attributes = evaluation_attributes(
            f"{sc.TARGET_EPISODE}:{episode}", score.value, name=s.rubric.evaluation_name,
            kind=sc.RewardKind.JUDGE, explanation=score.explanation)
        attributes.update({sc.JUDGE_MODEL: s.model, sc.JUDGE_RUBRIC_SHA256: s.rubric.sha256,
                           sc.JUDGE_MODE: s.mode})
        rows.append(evaluation_row(attributes, service_name=SERVICE_NAME, time_unix_nano=now))
    write_rows(directory, rows)


def _cache_entry(key: str, s: _Settings, verdict: Verdict) -> dict[str, Any]:
    keep_text = capture_messages()  # explanations are free text: the messages level only
    return {"key": key, "mode": s.mode, "model": s.model, "rubric": s.rubric.name,
            "rubric_sha256": s.rubric.sha256, "time_unix_nano": time.time_ns(),
            "scores": {episode: ({"score": score.value, "explanation": score.explanation}
                                 if keep_text and score.explanation else {"score": score.value})
                       for episode, score in verdict.scores.items()}}


class _Progress:
    """tqdm on stderr when it is installed, else a plain counter; nothing when off."""

    def __init__(self, total: int, unit: str, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.bar = total, 0, enabled and total > 0, None
        if self.enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit=unit, desc="judging", file=sys.stderr)
            except ImportError:
                pass

    def update(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            end = "\n" if self.done == self.total else ""
            print(f"\rjudging: {self.done}/{self.total}", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextmanager
def _pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agl-bridge-judge")
    try:
        yield pool
    finally:  # on Ctrl-C: requests in flight finish, the rest never start; what was
        # written before is cached, and a rerun asks only for the rest
        pool.shutdown(wait=True, cancel_futures=True)


def judge_spans(spans: str | os.PathLike[str], rubric: Rubric | str | os.PathLike[str], *,
                base_url: str, model: str, mode: str = ABSOLUTE,
                tokenizer: str | os.PathLike[str] | None = None, concurrency: int = 4,
                retries: int = 2, max_episodes: int | None = None, timeout: float = 120.0,
                temperature: float = 0.0, max_tokens: int | None = None,
                api_key: str | None = None, structured: bool = False,
                max_episode_chars: int = DEFAULT_MAX_EPISODE_CHARS,
                extra_body: dict[str, Any] | None = None,
                episode_ids: Collection[str] | None = None,
                progress: bool = True) -> JudgeSummary:
    """Judge the episodes of the span directory ``spans`` and write the scores into it.

    ``rubric``: a ``Rubric`` or a rubric file. ``base_url``: an OpenAI-compatible server
    (``http://host:port/v1``); ``model``: the name it serves the judge under. ``tokenizer``:
    the served model's tokenizer directory, for episodes captured with token ids only.
    ``structured``: ask for the verdict's JSON schema as ``response_format`` (servers that
    support structured outputs, e.g. vLLM and OpenAI). ``extra_body``: more request fields,
    merged into every request over ours (e.g. vLLM's ``{"structured_outputs": {"regex":
    ...}}``, ``top_k``); neither it nor ``structured`` is part of the cache key (they shape
    how the verdict is written, not what is asked). ``api_key`` defaults to
    ``$OPENAI_API_KEY``. ``max_episodes``: ask about at most this many episodes not judged
    before, the earliest first (so each run with it judges the next ones). ``episode_ids``:
    judge only these episodes (the loop passes the ones that arrived since its last round);
    the rest of the directory is still read, so an episode split across files is whole.
    Raises on unusable arguments; everything else is in the summary.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if concurrency < 1 or retries < 0 or (max_episodes is not None and max_episodes < 1):
        raise ValueError("concurrency and max_episodes must be at least 1, retries at least 0")
    if not base_url or not model:
        raise ValueError("the judge needs a base URL and a model name")
    directory = Path(spans)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a span directory (the scores and the "
                                f"cache are written into it)")
    started = time.perf_counter()
    rubric = rubric if isinstance(rubric, Rubric) else load_rubric(rubric)
    settings = _Settings(base_url, model, mode, rubric, retries, timeout, temperature,
                         max_tokens, api_key or os.environ.get("OPENAI_API_KEY"), structured,
                         max_episode_chars, dict(extra_body) if extra_body else None)
    summary = JudgeSummary(mode=mode, model=model, rubric=rubric.evaluation_name)
    episodes = read_episodes(directory, tokenizer_decoder(tokenizer) if tokenizer else None)
    summary.problems += episodes.problems
    texts, unreadable = episodes.texts, episodes.failed
    if episode_ids is not None:  # the others are not asked about, so not reported either
        wanted = set(episode_ids)
        texts = [e for e in texts if e.episode in wanted]
        unreadable = {e: why for e, why in unreadable.items() if e in wanted}
    summary.failed.update(unreadable)
    summary.unreadable = len(unreadable)
    cache = JudgeCache(directory)
    summary.problems += cache.problems
    uncached: list[Unit] = []
    keys: dict[str, str] = {}
    for unit in units_for(mode, texts):
        if mode == RELATIVE:
            unit = Unit(unit.key, tuple(prompt_order(unit.episodes)))
        key = cache_key(mode, model, rubric, unit.episodes, max_episode_chars)
        if cache.get(key) is not None:
            summary.cached += len(unit.episodes)
        else:
            uncached.append(unit)
            keys[unit.key] = key
    pending = [(keys[u.key], u) for u in limit_units(uncached, max_episodes)]
    summary.episodes = summary.cached + sum(len(u.episodes) for _, u in pending)
    bar = _Progress(len(pending), "episode" if mode == ABSOLUTE else "group", progress)
    try:
        with _pool(min(concurrency, max(1, len(pending)))) as pool:
            futures: dict[Future[_Outcome], str] = {
                pool.submit(_judge_unit, settings, unit): key for key, unit in pending}
            by_key = dict(pending)
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as exc:  # a bug must cost its unit, not the others' scores
                    outcome = _Outcome(by_key[futures[future]],
                                       error=f"{type(exc).__name__}: {exc}")
                summary.requests += outcome.requests
                summary.answers += outcome.answers
                summary.unparsable += outcome.unparsable
                if outcome.verdict is not None:
                    _write(directory, settings, outcome.verdict)
                    cache.put(_cache_entry(futures[future], settings, outcome.verdict))
                    summary.scored += len(outcome.verdict.scores)
                else:
                    for e in outcome.unit.episodes:
                        summary.failed[e.episode] = outcome.error or "no verdict"
                bar.update()
    finally:
        bar.close()
        flush_feedback()  # the scores become Parquet now, visible to conversion at once
        summary.seconds = time.perf_counter() - started
    return summary
