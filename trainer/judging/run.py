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
from agl_bridge.trainer.judging.config import JudgeConfig
from agl_bridge.trainer.judging.spans import read_episodes, tokenizer_decoder
from agl_bridge.trainer.rewards.judge import (
    ABSOLUTE,
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
class _Judge:
    """A run's settings with the rubric read, the key found and the endpoint checked."""

    config: JudgeConfig
    rubric: Rubric
    base_url: str
    model: str
    api_key: str | None

    def body(self, unit: Unit, temperature: float) -> dict[str, Any]:
        c, n = self.config, len(unit.episodes)
        if c.mode == ABSOLUTE:
            messages = absolute_messages(self.rubric, unit.episodes[0],
                                         max_chars=c.max_episode_chars)
        else:
            messages = relative_messages(self.rubric, unit.episodes,
                                         max_chars=c.max_episode_chars)
        max_tokens = c.max_tokens or (400 if c.mode == ABSOLUTE else 150 + 100 * n)
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "temperature": temperature, "max_tokens": max_tokens}
        if c.structured:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "verdict", "strict": True,
                "schema": verdict_schema(c.mode, self.rubric, n)}}
        if c.extra_body:
            body.update(c.extra_body)
        return body

    def ask(self, unit: Unit) -> _Outcome:
        """Ask until a usable verdict comes back or the retries are spent (runs in a worker)."""
        c, out = self.config, _Outcome(unit)
        for attempt in range(1 + c.retries):
            temperature = c.temperature if attempt == 0 else max(c.temperature,
                                                                 RETRY_TEMPERATURE)
            out.requests += 1
            try:
                answer = chat(self.base_url, self.body(unit, temperature), timeout_s=c.timeout,
                              api_key=self.api_key)
            except JudgeHTTPError as exc:
                out.error = f"{exc} (after {out.requests} request(s))"
                if not exc.transient:
                    return out
                if attempt < c.retries:
                    time.sleep(min(0.2 * 2 ** attempt, 5.0))
                continue
            out.answers += 1
            try:
                out.verdict = parse_verdict(c.mode, answer.text, self.rubric, unit.episodes)
                out.error = None
                return out
            except VerdictError as exc:
                out.unparsable += 1
                cut = " (cut short at max_tokens)" if answer.finish_reason == "length" else ""
                out.error = (f"unparsable verdict after {out.requests} request(s): {exc}{cut}; "
                             f"the answer began: {answer_start(answer.text)!r}")
        return out

    def write(self, directory: Path, verdict: Verdict) -> None:
        """The verdict's scores as evaluation records, durable on return."""
        now = time.time_ns()
        rows = []
        for episode, score in verdict.scores.items():
            attributes = evaluation_attributes(
                f"{sc.TARGET_EPISODE}:{episode}", score.value, name=self.rubric.evaluation_name,
                kind=sc.RewardKind.JUDGE, explanation=score.explanation)
            attributes.update({sc.JUDGE_MODEL: self.model,
                               sc.JUDGE_RUBRIC_SHA256: self.rubric.sha256,
                               sc.JUDGE_MODE: self.config.mode})
            rows.append(evaluation_row(attributes, service_name=SERVICE_NAME,
                                       time_unix_nano=now))
        write_rows(directory, rows)

    def cache_entry(self, key: str, verdict: Verdict) -> dict[str, Any]:
        keep_text = capture_messages()  # explanations are free text: the messages level only
        return {"key": key, "mode": self.config.mode, "model": self.model,
                "rubric": self.rubric.name, "rubric_sha256": self.rubric.sha256,
                "time_unix_nano": time.time_ns(),
                "scores": {episode: ({"score": score.value, "explanation": score.explanation}
                                     if keep_text and score.explanation
                                     else {"score": score.value})
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


def judge_spans(spans: str | os.PathLike[str], config: JudgeConfig, *,
                rubric: Rubric | None = None, api_key: str | None = None,
                episode_ids: Collection[str] | None = None,
                progress: bool = True) -> JudgeSummary:
    """Judge the episodes of the span directory ``spans`` with ``config`` (``JudgeConfig``,
    which needs ``base_url`` and ``model``) and write the scores into it.

    ``rubric``: a ``Rubric`` object, else ``config.rubric`` is read as a rubric file.
    ``config.extra_body`` and ``config.structured`` are not part of the cache key (they shape
    how the verdict is written, not what is asked). ``api_key`` defaults to
    ``$OPENAI_API_KEY``. ``config.max_episodes``: ask about at most this many episodes not
    judged before, the earliest first (so each run with it judges the next ones).
    ``episode_ids``: judge only these episodes (the loop passes the ones that arrived since its
    last round); the rest of the directory is still read, so an episode split across files is
    whole. Raises on unusable arguments; everything else is in the summary.
    """
    if not config.base_url or not config.model or not (rubric or config.rubric):
        raise ValueError("the judge needs a base URL, a model name and a rubric")
    directory = Path(spans)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a span directory (the scores and the "
                                f"cache are written into it)")
    started = time.perf_counter()
    mode, model = config.mode, config.model
    if rubric is None:
        rubric = load_rubric(str(config.rubric))
    judge = _Judge(config, rubric, config.base_url, model,
                   api_key or os.environ.get("OPENAI_API_KEY"))
    summary = JudgeSummary(mode=mode, model=model, rubric=rubric.evaluation_name)
    episodes = read_episodes(directory, tokenizer_decoder(config.tokenizer)
                             if config.tokenizer else None)
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
        key = cache_key(mode, model, rubric, unit.episodes, config.max_episode_chars)
        if cache.get(key) is not None:
            summary.cached += len(unit.episodes)
        else:
            uncached.append(unit)
            keys[unit.key] = key
    pending = [(keys[u.key], u) for u in limit_units(uncached, config.max_episodes)]
    summary.episodes = summary.cached + sum(len(u.episodes) for _, u in pending)
    bar = _Progress(len(pending), "episode" if mode == ABSOLUTE else "group", progress)
    try:
        with _pool(min(config.concurrency, max(1, len(pending)))) as pool:
            futures: dict[Future[_Outcome], str] = {
                pool.submit(judge.ask, unit): key for key, unit in pending}
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
                    judge.write(directory, outcome.verdict)
                    cache.put(judge.cache_entry(futures[future], outcome.verdict))
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
