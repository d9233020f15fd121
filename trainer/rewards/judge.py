"""LLM judges, the pure part: rubrics, prompts for both modes, verdict parsing, groups, keys.

A judge model scores episodes against a rubric. Two modes:

* **absolute**: one episode per request, scored against the rubric alone;
* **relative** (after OpenPipe ART's RULER): the episodes of one group (same task) in one
  request, scored on one scale. Group-relative training (GRPO) only uses differences within
  a group, and a model ranks side by side more consistently than it scores alone.

Nothing here does IO: ``agl_bridge.trainer.judging`` reads the spans, calls the model, caches
and writes the scores. So every rule below is testable on plain values.

The verdict is asked for as one JSON object (absolute: ``{"explanation", "score"}``;
relative: ``{"scores": [{"id", "explanation", "score"}, ...]}``). Parsing is lenient about
the wrapping (code fences, prose around the object), strict about the content: a score
outside the rubric's scale, a missing, duplicated or unknown episode id is an unparsable
verdict (``VerdictError``, retried by the runner), never clamped or guessed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_bridge import semconv as sc

ABSOLUTE = "absolute"
RELATIVE = "relative"
MODES = (ABSOLUTE, RELATIVE)

# bumped whenever the prompts or their settings change meaning: part of every cache key, so
# a changed prompt never reuses verdicts given to the old one
PROMPT_VERSION = "1"
DEFAULT_MAX_EPISODE_CHARS = 12_000
MAX_EXPLANATION_CHARS = 2_000
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_RUBRIC_KEYS = {"name", "instructions", "scale"}


class RubricError(ValueError):
    """A rubric that cannot be used; the message names its source."""


class VerdictError(ValueError):
    """A judge's answer that does not hold a usable verdict; the message says what is wrong."""


# -- rubrics ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rubric:
    """What the judge scores for, and on which scale (``low`` worst, ``high`` best)."""

    name: str
    instructions: str
    low: float = 0.0
    high: float = 1.0

    @property
    def evaluation_name(self) -> str:
        """The ``gen_ai.evaluation.name`` of the scores: conversion weights it by this name."""
        return sc.JUDGE_EVALUATION_PREFIX + self.name

    @property
    def sha256(self) -> str:
        """Identity for the cache: the same text and scale always give the same digest."""
        canonical = json.dumps({"name": self.name, "instructions": self.instructions,
                                "scale": [self.low, self.high]}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def scale_text(self) -> str:
        return f"{_num(self.low)} to {_num(self.high)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def parse_rubric(text: str, *, source: str, toml: bool, default_name: str) -> Rubric:
    """A rubric from a file's text: TOML (``name``, ``instructions``, ``scale = [low, high]``)
    or plain text (all of it is the instructions, named ``default_name``, scale 0 to 1).
    Unknown TOML keys are refused: a typo (``scael``) must not silently mean the default."""
    if not toml:
        return _checked(default_name, text, (0.0, 1.0), source)
    from agl_bridge.settings import SettingError, loads

    try:
        data = loads(text, f"rubric {source}")
    except SettingError as exc:
        raise RubricError(str(exc)) from None
    unknown = sorted(set(data) - _RUBRIC_KEYS)
    if unknown:
        raise RubricError(f"rubric {source}: unknown key(s) {', '.join(unknown)} "
                          f"(expected {', '.join(sorted(_RUBRIC_KEYS))})")
    if "instructions" not in data:
        raise RubricError(f"rubric {source}: no 'instructions' (what the judge scores for)")
    scale = data.get("scale", [0, 1])
    if (not isinstance(scale, list) or len(scale) != 2
            or not all(_is_number(v) for v in scale)):
        raise RubricError(f"rubric {source}: 'scale' must be two numbers [low, high], "
                          f"got {scale!r}")
    name = data.get("name", default_name)
    instructions = data["instructions"]
    if not isinstance(instructions, str):
        raise RubricError(f"rubric {source}: 'instructions' must be a string")
    return _checked(name, instructions, (float(scale[0]), float(scale[1])), source)


def _checked(name: Any, instructions: str, scale: tuple[float, float], source: str) -> Rubric:
    if not isinstance(name, str) or not _NAME.match(name):
        raise RubricError(f"rubric {source}: name {name!r} must be letters, digits, '.', '_' "
                          f"or '-' (it becomes the evaluation name judge:<name>); set name = "
                          f"\"...\" in a TOML rubric")
    if not instructions.strip():
        raise RubricError(f"rubric {source}: the instructions are empty")
    low, high = scale
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise RubricError(f"rubric {source}: scale must be finite with low < high, "
                          f"got [{low}, {high}]")
    return Rubric(name, instructions.strip(), low, high)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# -- episodes as the judge sees them, and groups ---------------------------------------------------
@dataclass(frozen=True)
class EpisodeText:
    """One episode's text as lines (one message each), ready for a prompt."""

    episode: str
    task: str | None
    blocks: tuple[str, ...]
    start: int = 0  # unix ns of its first call: the order episodes and groups are taken in

    @property
    def text(self) -> str:
        return "\n".join(self.blocks)

    @property
    def sha256(self) -> str:
        """What the verdict is about: an episode that grew since it was judged is judged anew."""
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Unit:
    """What one judge request scores: one episode (absolute) or a group (relative)."""

    key: str  # group key (``task:T``, or ``episode:E`` alone) or the episode id
    episodes: tuple[EpisodeText, ...]


def group_by_task(episodes: Sequence[EpisodeText]) -> list[Unit]:
    """Episodes of the same task together (what GRPO compares), in order of their first
    episode's start. An episode without a task id is a group of its own (``episode:E``), as
    conversion groups it: it is never compared with another task's episodes."""
    groups: dict[str, list[EpisodeText]] = {}
    for e in sorted(episodes, key=lambda e: (e.start, e.episode)):
        key = f"task:{e.task}" if e.task is not None else f"episode:{e.episode}"
        groups.setdefault(key, []).append(e)
    return [Unit(key, tuple(members)) for key, members in groups.items()]


def units_for(mode: str, episodes: Sequence[EpisodeText]) -> list[Unit]:
    """The requests a run makes before the cache is consulted, in start order."""
    if mode == RELATIVE:
        return group_by_task(episodes)
    if mode != ABSOLUTE:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ordered = sorted(episodes, key=lambda e: (e.start, e.episode))
    return [Unit(e.episode, (e,)) for e in ordered]


def limit_units(units: Sequence[Unit], max_episodes: int | None) -> list[Unit]:
    """The first units holding at most ``max_episodes`` episodes in all. A group is never
    split (its scores share one scale only when judged together): taking stops at the first
    group that does not fit."""
    if max_episodes is None:
        return list(units)
    out, total = [], 0
    for unit in units:
        if total + len(unit.episodes) > max_episodes:
            break
        out.append(unit)
        total += len(unit.episodes)
    return out


def prompt_order(episodes: Sequence[EpisodeText]) -> list[EpisodeText]:
    """A group's episodes in the order the judge sees them: shuffled by a hash of their ids,
    so no episode is always first (position bias) and the same group always reads the same."""
    return sorted(episodes, key=lambda e: hashlib.sha256(e.episode.encode()).hexdigest())


def cache_key(mode: str, model: str, rubric: Rubric, episodes: Iterable[EpisodeText],
              max_episode_chars: int) -> str:
    """The identity of a verdict: prompt version, mode, judge model, rubric, and each
    episode's id and text (for relative mode: the whole group, as one set)."""
    members = sorted((e.episode, e.sha256) for e in episodes)
    canonical = json.dumps([PROMPT_VERSION, mode, model, rubric.sha256, max_episode_chars,
                            members])
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- prompts ---------------------------------------------------------------------------------------
def shorten(text: str, max_chars: int) -> str:
    """At most about ``max_chars``: the start and the end kept (the task and the outcome),
    the middle replaced by a note of how much was left out."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail:]}"


_ABSOLUTE_FORMAT = ('Answer with one JSON object and nothing else: {{"explanation": "<one or '
                    'two sentences>", "score": <a number from {scale}>}}')


def _relative_format(n: int, rubric: Rubric) -> str:
    return (f"Answer with one JSON object and nothing else, with one entry for each episode id "
            f'from 1 to {n}: {{"scores": [{{"id": 1, "explanation": "<one sentence>", "score": '
            f"<a number from {rubric.scale_text()}>}}, ...]}}")


_READING = ("An episode is the record of one or more AI agents working on one task: the "
            "messages each agent received and what it answered, in time order. Each line starts "
            "with the agent's name in brackets, then the message's role.")


def absolute_messages(rubric: Rubric, episode: EpisodeText, *,
                      max_chars: int = DEFAULT_MAX_EPISODE_CHARS) -> list[dict[str, str]]:
    """The chat messages of an absolute request: the rubric as the system message, the
    episode as the user message, and the answer's format again at its end (small judges
    follow the last instruction they read)."""
    system = (
        f"You are a careful, strict judge of AI agent episodes. {_READING}\n\n"
        f"Score the episode against the rubric below on a scale from {rubric.scale_text()} "
        f"({_num(rubric.high)} is best).\n\n"
        f"Rubric ({rubric.name}):\n{rubric.instructions}\n\n"
        f"{_ABSOLUTE_FORMAT.format(scale=rubric.scale_text())}")
    user = (f"<episode>\n{shorten(episode.text, max_chars)}\n</episode>\n\n"
            f"Score this episode. {_ABSOLUTE_FORMAT.format(scale=rubric.scale_text())}")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def common_prefix(episodes: Sequence[EpisodeText]) -> int:
    """How many leading lines all episodes share (the task as given): shown once, as context.
    Zero for a single episode, or when all are identical (then each is shown in full)."""
    if len(episodes) < 2 or len({e.blocks for e in episodes}) == 1:
        return 0
    n = 0
    for lines in zip(*(e.blocks for e in episodes)):
        if any(line != lines[0] for line in lines[1:]):
            break
        n += 1
    return n


def relative_messages(rubric: Rubric, episodes: Sequence[EpisodeText], *,
                      max_chars: int = DEFAULT_MAX_EPISODE_CHARS) -> list[dict[str, str]]:
    """The chat messages of a relative request. ``episodes`` in the order given (see
    ``prompt_order``); they are called 1..N in the prompt, never by their real ids (short,
    and nothing in an id can hint at a score)."""
    n = len(episodes)
    system = (
        f"You are a careful, strict judge of AI agent episodes. {_READING}\n\n"
        f"All {n} episodes below were given the same task. Consider each of them, compare them "
        f"with each other, and give each a score from {rubric.scale_text()} "
        f"({_num(rubric.high)} is best) on one common scale: a clearly better episode gets a "
        f"clearly higher score, a slightly better one a slightly higher score.\n\n"
        f"Rubric ({rubric.name}):\n{rubric.instructions}\n\n"
        f"{_relative_format(n, rubric)}")
    shared = common_prefix(episodes)
    parts = []
    if shared:
        context = "\n".join(episodes[0].blocks[:shared])
        parts.append(f"<context shared by all episodes>\n{shorten(context, max_chars)}\n"
                     f"</context>")
    for i, e in enumerate(episodes, start=1):
        body = "\n".join(e.blocks[shared:]) or "(nothing beyond the shared context)"
        parts.append(f'<episode id="{i}">\n{shorten(body, max_chars)}\n</episode>')
    # the format again, last: small judges follow the last instruction they read
    parts.append(f"Score these {n} episodes. {_relative_format(n, rubric)}")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def verdict_schema(mode: str, rubric: Rubric, n: int = 1) -> dict[str, Any]:
    """A JSON schema of the verdict, for servers that constrain their output to one
    (OpenAI ``response_format`` ``json_schema``; vLLM's structured outputs)."""
    score = {"type": "number", "minimum": rubric.low, "maximum": rubric.high}
    explanation = {"type": "string", "maxLength": 300}
    if mode == ABSOLUTE:
        return {"type": "object", "properties": {"explanation": explanation, "score": score},
                "required": ["explanation", "score"], "additionalProperties": False}
    entry = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1,
                                                     "maximum": n},
                                              "explanation": explanation, "score": score},
             "required": ["id", "explanation", "score"], "additionalProperties": False}
    return {"type": "object", "properties": {"scores": {"type": "array", "items": entry,
                                                        "minItems": n, "maxItems": n}},
            "required": ["scores"], "additionalProperties": False}


# -- verdicts --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    value: float
    explanation: str | None = None


@dataclass
class Verdict:
    """Scores by episode id, from one answer."""

    scores: dict[str, Score] = field(default_factory=dict)


def json_objects(text: str) -> Iterator[Any]:
    """Every JSON value that starts with ``{`` in ``text``, in order: the answer may wrap
    its object in a code fence or in prose."""
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        yield obj
        i = text.find("{", end)


_SCORE_LINE = re.compile(r"""\bscore\b["']?\s*[:=]\s*(-?\d+(?:\.\d+)?)""", re.IGNORECASE)


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise VerdictError(f"{where} is {value!r}, not a number") from None
    if not _is_number(value) or not math.isfinite(float(value)):
        raise VerdictError(f"{where} is {value!r}, not a finite number")
    return float(value)


def _in_scale(value: float, rubric: Rubric, where: str) -> float:
    if not rubric.low <= value <= rubric.high:
        raise VerdictError(f"{where} is {_num(value)}, outside the rubric's scale "
                           f"{rubric.scale_text()}")
    return value


def _explanation(obj: dict[str, Any]) -> str | None:
    for key in ("explanation", "reason", "reasoning"):
        value = obj.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_EXPLANATION_CHARS]
    return None


def _lower_keys(obj: dict[Any, Any]) -> dict[str, Any]:
    return {str(k).strip().lower(): v for k, v in obj.items()}


def parse_absolute(answer: str, rubric: Rubric) -> Score:
    """The score of an absolute answer: the first JSON object with a ``score``; failing that,
    one ``score: X`` in the text (several different ones are ambiguous: refused)."""
    for obj in json_objects(answer):
        if isinstance(obj, dict):
            lowered = _lower_keys(obj)
            if "score" in lowered:
                value = _in_scale(_number(lowered["score"], "score"), rubric, "score")
                return Score(value, _explanation(lowered))
    found = sorted({float(m) for m in _SCORE_LINE.findall(answer)})
    if not found:
        raise VerdictError("no JSON object with a \"score\" and no 'score: X' in the answer")
    if len(found) > 1:
        raise VerdictError(f"several different scores in the answer: "
                           f"{', '.join(_num(v) for v in found)}")
    return Score(_in_scale(found[0], rubric, "score"))


def _entry_id(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        m = re.fullmatch(r"\s*(?:episode|trajectory)?\s*#?\s*(\d+)\s*", raw, re.IGNORECASE)
        return int(m.group(1)) if m else None
    return None


def _relative_entries(answer: str) -> list[tuple[Any, Any]]:
    """(id, entry) pairs of the first JSON object that holds ``scores``."""
    for obj in json_objects(answer):
        if not isinstance(obj, dict):
            continue
        scores = _lower_keys(obj).get("scores")
        if isinstance(scores, list):
            out = []
            for k, entry in enumerate(scores, start=1):
                if not isinstance(entry, dict):
                    raise VerdictError(f"entry {k} of \"scores\" is not an object")
                lowered = _lower_keys(entry)
                raw = next((lowered[key] for key in ("id", "trajectory_id", "episode_id",
                                                      "episode") if key in lowered), None)
                if raw is None:
                    raise VerdictError(f"entry {k} of \"scores\" has no \"id\"")
                out.append((raw, lowered))
            return out
        if isinstance(scores, dict):  # {"1": 0.5, "2": {"score": 0.7}}
            return list(scores.items())
    raise VerdictError("no JSON object with a \"scores\" list in the answer")


def parse_relative(answer: str, n: int, rubric: Rubric) -> list[Score]:
    """The scores of a relative answer for episodes 1..n, in that order. Every episode must
    be scored exactly once, by one answer: a partial answer is refused (its scores would
    share no scale with those of another request)."""
    got: dict[int, Score] = {}
    for raw, entry in _relative_entries(answer):
        ident = _entry_id(raw)
        if ident is None or not 1 <= ident <= n:
            raise VerdictError(f"unknown episode id {raw!r} (expected 1 to {n})")
        if ident in got:
            raise VerdictError(f"episode {ident} is scored twice")
        if isinstance(entry, dict):
            lowered = _lower_keys(entry)
            if "score" not in lowered:
                raise VerdictError(f"episode {ident} has no \"score\"")
            value, explanation = lowered["score"], _explanation(lowered)
        else:
            value, explanation = entry, None
        where = f"score of episode {ident}"
        got[ident] = Score(_in_scale(_number(value, where), rubric, where), explanation)
    missing = [i for i in range(1, n + 1) if i not in got]
    if missing:
        raise VerdictError(f"no score for episode(s) {', '.join(map(str, missing))} of {n}")
    return [got[i] for i in range(1, n + 1)]


def parse_verdict(mode: str, answer: str, rubric: Rubric,
                  episodes: Sequence[EpisodeText]) -> Verdict:
    """Scores by real episode id; ``episodes`` in the order the prompt showed them."""
    if mode == ABSOLUTE:
        (episode,) = episodes
        return Verdict({episode.episode: parse_absolute(answer, rubric)})
    scores = parse_relative(answer, len(episodes), rubric)
    return Verdict({e.episode: s for e, s in zip(episodes, scores)})


def answer_start(answer: str, limit: int = 120) -> str:
    """The start of an answer, on one line, for a report."""
    flat = " ".join(answer.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
