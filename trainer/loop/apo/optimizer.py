"""The optimizer model's two jobs: a critique of a prompt from how its episodes went (the
"textual gradient"), and a rewrite of the prompt that follows the critique.

Any OpenAI-compatible endpoint, called as the judge is (``trainer/judging/client.py``: plain
HTTP, never the instrumented openai client, so the optimizer's own calls never become training
data or a swapped prompt). The message builders are pure; ``Optimizer`` sends them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agl_bridge.trainer.judging.client import chat
from agl_bridge.trainer.loop.apo.transcripts import Transcript

CRITIQUE_SYSTEM = (
    "You improve the system prompts of LLM agents. You read an agent's current system prompt "
    "and transcripts of episodes it took part in, each with the reward the episode got (higher "
    "is better). Say concretely what in the prompt leads to the low-reward episodes and what "
    "the high-reward ones did right. Do not rewrite the prompt yet.")
REWRITE_SYSTEM = (
    "You rewrite the system prompt of an LLM agent so that it follows a critique. Keep what "
    "works, change what the critique asks for, keep it short. Answer with the new prompt only, "
    "between <prompt> and </prompt>.")
NO_PROMPT = "(none: the agent runs without a system prompt)"
PROMPT_TAGS = re.compile(r"<prompt>(.*?)(?:</prompt>|$)", re.DOTALL)


def _episodes(title: str, episodes: Sequence[Transcript]) -> str:
    if not episodes:
        return ""
    parts = [f"## {title}"]
    for i, t in enumerate(episodes, 1):
        parts.append(f"### Episode {i} (reward {t.reward:.3g})\n{t.text}")
    return "\n\n".join(parts)


def critique_messages(agent: str, prompt: str, best: Sequence[Transcript],
                      worst: Sequence[Transcript]) -> list[dict[str, str]]:
    body = "\n\n".join(p for p in (
        f"The agent is `{agent}`; lines starting with [{agent}] are its messages.",
        f"## Its current system prompt\n{prompt or NO_PROMPT}",
        _episodes("Episodes with the highest rewards", best),
        _episodes("Episodes with the lowest rewards", worst)) if p)
    return [{"role": "system", "content": CRITIQUE_SYSTEM}, {"role": "user", "content": body}]


def rewrite_messages(agent: str, prompt: str, critique: str) -> list[dict[str, str]]:
    body = (f"The agent is `{agent}`.\n\n## Its current system prompt\n"
            f"{prompt or NO_PROMPT}\n\n## The critique\n{critique}\n\n"
            "Write the improved system prompt.")
    return [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": body}]


def parse_rewrite(answer: str) -> str | None:
    """The new prompt from the rewriter's answer: the text between the tags if it used them,
    else the whole answer; None when nothing is left."""
    m = PROMPT_TAGS.search(answer)
    text = (m.group(1) if m else answer).strip()
    return text or None


@dataclass(frozen=True)
class Optimizer:
    """The optimizer endpoint and its two models."""

    base_url: str
    gradient_model: str
    apply_edit_model: str
    api_key: str | None = None
    timeout_s: float = 300.0
    max_tokens: int = 512

    def critique(self, agent: str, prompt: str, best: Sequence[Transcript],
                 worst: Sequence[Transcript]) -> str:
        body = {"model": self.gradient_model, "temperature": 0.0, "max_tokens": self.max_tokens,
                "messages": critique_messages(agent, prompt, best, worst)}
        return chat(self.base_url, body, timeout_s=self.timeout_s, api_key=self.api_key).text

    def rewrite(self, agent: str, prompt: str, critique: str, temperature: float) -> str | None:
        body = {"model": self.apply_edit_model, "temperature": temperature,
                "max_tokens": self.max_tokens,
                "messages": rewrite_messages(agent, prompt, critique)}
        answer = chat(self.base_url, body, timeout_s=self.timeout_s, api_key=self.api_key)
        return parse_rewrite(answer.text)
