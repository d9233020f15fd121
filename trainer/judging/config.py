"""``JudgeConfig``: the LLM judge's settings (``agl-bridge judge``, the loop's ``[judge]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agl_bridge.settings import at_least, check_choices, setting
from agl_bridge.trainer.rewards.judge import DEFAULT_MAX_EPISODE_CHARS

JudgeMode = Literal["absolute", "relative"]


@dataclass(frozen=True)
class JudgeConfig:
    """Who judges, against what, and how hard it is asked (``judge_spans`` takes it whole)."""

    rubric: str | None = setting(
        None, help="the rubric: TOML (name, instructions, scale = [low, high]) or plain text; "
                   "in the loop, setting it turns the judge on (live traces)")
    base_url: str | None = setting(
        None, help="the judge's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (API "
                   "key: $OPENAI_API_KEY); the loop's default: its own vLLM")
    model: str | None = setting(
        None, help="the judge model's name there; the loop's default: its base model")
    mode: JudgeMode = setting(
        "absolute", help="absolute: each episode alone; relative: the episodes of one task "
                         "together, on one scale (RULER-style)")
    tokenizer: str | None = setting(
        None, help="the served model's tokenizer, to read episodes captured with token ids "
                   "only; the loop's default: its model")
    concurrency: int = setting(4, help="requests in flight")
    retries: int = setting(2, help="asks again after an unparsable verdict or a transient "
                                   "error")
    max_episodes: int | None = setting(
        None, help="judge at most N episodes not judged before (a loop round's budget; "
                   "relative mode never splits a group)")
    timeout: float = setting(120.0, help="seconds per request")
    temperature: float = setting(0.0, help="the first ask's temperature (retries use at least "
                                           "0.7)")
    max_tokens: int | None = setting(
        None, help="per answer (unset: 400; relative: 150 + 100 per episode)")
    structured: bool = setting(
        False, help="ask for the verdict's JSON schema as response_format (vLLM, OpenAI)")
    max_episode_chars: int = setting(
        DEFAULT_MAX_EPISODE_CHARS, help="an episode's text is cut to this many characters "
                                        "(its start and end kept)")
    extra_body: dict[str, Any] | None = setting(
        None, help="more request fields, a JSON object merged into every request (e.g. "
                   "vLLM's {\"structured_outputs\": {\"regex\": \"...\"}})")

    def __post_init__(self) -> None:
        check_choices(self)
        at_least(self, 1, "concurrency", "max_episodes", "max_tokens")
        at_least(self, 0, "retries")
        at_least(self, 100, "max_episode_chars")
