"""How spans become transitions (``ConvertConfig``) and what happened (``ConversionStats``)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.rewards.baselines import KEY_PREFIX, key_attribute, parse_baselines
from agl_bridge.trainer.rewards.credit import AdvantageUnit, Algorithm
from agl_bridge.trainer.rewards.recipes import Recipe

MissingReward = Literal["drop"] | float


@dataclass(frozen=True)
class ConvertConfig:
    """How spans become transitions. Defaults: AT-GRPO."""

    algorithm: Algorithm = "at_grpo"
    alpha: float = 1.0  # AT-GRPO: weight of the team reward in r = alpha * team + local
    gamma: float = 1.0  # discount of the team reward over an agent's turns
    advantage_unit: AdvantageUnit = "transition"
    scale_advantages: bool = True  # divide by the group's std (GRPO); off: Dr. GRPO
    missing_reward: MissingReward = "drop"  # an episode with no reward
    merge_turn_calls: bool = True
    # a tokenizer directory: rebuild ids from captured messages for spans without them
    # (flagged ``retokenized``), and count how often the rebuild disagrees with recorded ids
    retokenize: str | None = None
    # evaluations (feedback, gen_ai.evaluation.result, judges) that count as rewards: name ->
    # weight (None: every name, weight 1; 0 leaves a name out); labels scores label-only ones
    evaluation_weights: Mapping[str, float] | None = None
    evaluation_labels: Mapping[str, float] | None = None
    # rewards derived from what the spans hold (``rewards.recipes``); its [evaluations] table
    # sets the two above when they are not given
    recipe: Recipe | None = None
    # what rewards are compared with (``rewards.baselines``): "group", "batch",
    # "key:ATTRIBUTE", in order of preference ("group,batch" or a sequence)
    baseline: str | tuple[str, ...] = ("group",)
    per_agent_advantages: bool = False  # Dr. MAS: each agent's own statistics

    def __post_init__(self) -> None:
        object.__setattr__(self, "baseline", parse_baselines(self.baseline))

    @property
    def baselines(self) -> tuple[str, ...]:
        return cast(tuple[str, ...], self.baseline)

    @property
    def key_attributes(self) -> tuple[str, ...]:
        """The attributes ``key:`` baselines group by."""
        return tuple(key_attribute(b) for b in self.baselines if b.startswith(KEY_PREFIX))

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """Span columns read besides the converter's own: the recipe's, and the attributes
        JSON when a key baseline groups by an attribute that is not a column."""
        extra = self.recipe.columns if self.recipe is not None else ()
        if any(a not in SPAN_SCHEMA.names for a in self.key_attributes):
            extra = (*extra, "attributes")
        return extra + tuple(a for a in self.key_attributes if a in SPAN_SCHEMA.names)


AgentTurn = tuple[str | None, int | None]
TermAgent = tuple[str, str | None]


@dataclass
class ConversionStats:
    """Counts of one conversion; ``merge`` adds the counts of a part (a batch, a bucket)."""

    spans: int = 0
    episodes: int = 0
    llm_spans: int = 0
    transitions: int = 0
    files: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> LLM calls not converted
    notes: Counter[str] = field(default_factory=Counter)  # reason -> worth knowing, not fatal
    rejected_rewards: list[str] = field(default_factory=list)  # where, first 20
    unknown_evaluations: list[str] = field(default_factory=list)  # what they named, first 20
    per_agent_turn: Counter[AgentTurn] = field(default_factory=Counter)  # -> transitions
    rewards: list[float] = field(default_factory=list)
    zero_variance_groups: int = 0
    groups: int = 0
    # (term, agent) -> the summed value of its rewards
    recipe: defaultdict[TermAgent, float] = field(default_factory=lambda: defaultdict(float))
    recipe_rewards: Counter[TermAgent] = field(default_factory=Counter)  # -> rewards derived
    baselines: Counter[str] = field(default_factory=Counter)  # baseline -> transitions
    global_groups: int = 0  # groups of the batch and key baselines (whole output)

    MAX_LISTED = 20  # rejected rewards listed by place; all are counted in ``notes``

    def merge(self, other: ConversionStats) -> None:
        self.spans += other.spans
        self.episodes += other.episodes
        self.llm_spans += other.llm_spans
        self.transitions += other.transitions
        self.zero_variance_groups += other.zero_variance_groups
        self.groups += other.groups
        self.skipped.update(other.skipped)
        self.notes.update(other.notes)
        self.per_agent_turn.update(other.per_agent_turn)
        for key, value in other.recipe.items():
            self.recipe[key] += value
        self.recipe_rewards.update(other.recipe_rewards)
        self.baselines.update(other.baselines)
        self.rewards += other.rewards
        room = max(0, self.MAX_LISTED - len(self.rejected_rewards))
        self.rejected_rewards += other.rejected_rewards[:room]
        room = max(0, self.MAX_LISTED - len(self.unknown_evaluations))
        self.unknown_evaluations += other.unknown_evaluations[:room]

    def summary(self) -> str:
        lines = [f"{self.spans} spans, {self.episodes} episodes, {self.llm_spans} LLM calls -> "
                 f"{self.transitions} transitions in {self.groups} groups "
                 f"({self.zero_variance_groups} with zero reward variance)"]
        if self.baselines and set(self.baselines) != {"group"}:
            lines.append("  baselines: " + ", ".join(
                f"{name} {n}" for name, n in sorted(self.baselines.items())))
        if self.rewards:
            r = sorted(self.rewards)

            def q(f: float) -> float:
                return r[min(len(r) - 1, int(f * len(r)))]

            lines.append(f"  reward: mean {math.fsum(r) / len(r):+.4f}, min {r[0]:+.4f}, "
                         f"p50 {q(0.5):+.4f}, max {r[-1]:+.4f}")
        if self.per_agent_turn:
            cells = ", ".join(f"{a}@{t}: {n}" for (a, t), n in sorted(
                self.per_agent_turn.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)))
            lines.append(f"  transitions per agent@turn: {cells}")
        for (term, agent), total in sorted(self.recipe.items(), key=lambda kv: (kv[0][0],
                                                                                str(kv[0][1]))):
            n = self.recipe_rewards[(term, agent)]
            lines.append(f"  recipe {term}: {agent if agent is not None else '(episode)'} "
                         f"{total:+.4f} in {n} reward(s)")
        lines += [f"  skipped {n} LLM call(s): {why}" for why, n in sorted(self.skipped.items())]
        lines += [f"  note: {n} x {why}" for why, n in sorted(self.notes.items())]
        lines += [f"  rejected reward: {where}" for where in self.rejected_rewards]
        lines += [f"  evaluation for an unknown id: {what}" for what in self.unknown_evaluations]
        return "\n".join(lines)
