"""APO's settings, named as Agent Lightning's APO names them (``beam_width``,
``branch_factor``, ``beam_rounds``, ``gradient_batch_size``, ``val_batch_size``,
``gradient_model``, ``apply_edit_model``, ``diversity_temperature``).

``ApoSearchConfig`` is the search itself: the loop's ``[apo]`` table (``algorithm = "apo"``),
where the loop supplies the rest (its team, tasks, registry, server and gate). ``ApoConfig``
adds what the batch job ``agl-bridge apo`` must be told instead; its flags are both, flat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agl_bridge.settings import at_least, check_choices, setting

GateRule = Literal["not_worse", "better", "off"]


@dataclass(frozen=True)
class ApoSearchConfig:
    """How wide the search is, and which model critiques and rewrites."""

    optimizer_base_url: str | None = setting(
        None, help="the optimizer's OpenAI-compatible endpoint (default: the team's); API "
                   "key: $OPENAI_API_KEY")
    gradient_model: str = setting(
        "base", help="the model that writes the critique (the textual gradient)")
    apply_edit_model: str | None = setting(
        None, help="the model that rewrites the prompt from the critique (default: "
                   "gradient_model)")
    beam_width: int = setting(4, help="prompts kept after each round")
    branch_factor: int = setting(4, help="rewrites proposed per prompt of the beam per round")
    beam_rounds: int = setting(3, help="rounds of critique, rewrite and selection")
    gradient_batch_size: int = setting(
        4, help="episodes shown to the critique: the best half and the worst half by reward")
    val_batch_size: int = setting(
        16, help="tasks each candidate plays (the first N of the held-out tasks; in the loop, "
                 "of the round's training tasks)")
    diversity_temperature: float = setting(
        1.0, help="the rewriter's temperature: higher, more varied candidates")
    max_episode_chars: int = setting(
        3000, help="each episode's transcript is cut to this many characters for the critique")
    timeout: float = setting(300.0, help="seconds per optimizer request")
    seed: int = setting(0, help="which stored episodes are sampled for each critique")

    def __post_init__(self) -> None:
        check_choices(self)
        at_least(self, 1, "beam_width", "branch_factor", "beam_rounds", "gradient_batch_size",
                 "val_batch_size")
        at_least(self, 100, "max_episode_chars")


@dataclass(frozen=True)
class ApoConfig(ApoSearchConfig):
    """The batch job: what is optimised, against what, where winners go."""

    agents: list[str] = setting(
        default_factory=list, help="the agents whose system prompts are optimised, one after "
                                   "another (each against the others' live prompts)")
    registry: str | None = setting(
        None, help="the registry directory the winners are published to (prompts.json: set "
                   "AGL_BRIDGE_PROMPTS to it)")
    team: str | None = setting(
        None, help="the team command that plays held-out tasks (configured by environment, "
                   "as the loop runs it)")
    val_tasks: str | None = setting(
        None, help="JSON lines of held-out tasks the candidates are scored on (never shown to "
                   "the optimizer)")
    base_url: str | None = setting(
        None, help="the team's OpenAI-compatible endpoint (OPENAI_BASE_URL of the team)")
    rollouts: int = setting(1, help="episodes per held-out task (each task's score is their "
                                    "mean)")
    temperature: float = setting(0.0, help="the team's sampling temperature on held-out tasks")
    rule: GateRule = setting(
        "not_worse", help="the gate between the best candidate and the live prompt (the "
                          "loop's [gate] rule)")
    tolerance: float = setting(0.0, help="the gate's tolerance")
    tokenizer: str | None = setting(
        None, help="the served model's tokenizer, to read stored episodes captured with token "
                   "ids only")
    publish: bool = setting(True, help="publish the winner if it passes the gate (false: only "
                                       "report it)")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "rollouts")

    def missing(self) -> list[str]:
        """The settings a run needs that were not given."""
        return [n for n in ("registry", "team", "val_tasks", "base_url")
                if not getattr(self, n)] + ([] if self.agents else ["agents"])
