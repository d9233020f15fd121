"""How spans become transitions (``ConvertConfig``) and what happened (``ConversionStats``)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal

from agl_bridge.settings import check_choices, setting
from agl_bridge.trainer.rewards.credit import AdvantageUnit, Algorithm

if TYPE_CHECKING:
    from agl_bridge.trainer.rewards.recipes import Recipe

MissingReward = Literal["drop"] | float


@dataclass(frozen=True)
class ConvertConfig:
    """How spans become transitions (``agl-bridge convert``, ``train``'s conversion, the
    loop's ``[convert]`` table). Defaults: AT-GRPO."""

    algorithm: Algorithm = setting(
        "at_grpo", help="credit and groups: at_grpo (task, agent, turn; r = alpha * team + "
                        "local), lightning_rl (the team reward to every transition; task) or "
                        "ppo (each reward at the end of its turn, team and agent rewards on "
                        "the agent's last turn; training fits a critic and takes GAE "
                        "advantages over the agent's turns)")
    alpha: float = setting(1.0, help="AT-GRPO and PPO: weight of the team reward in r = alpha "
                                     "* team + local")
    gamma: float = setting(1.0, help="discount over an agent's turns (1: none): at_grpo and "
                                     "lightning_rl discount the team reward per turn; ppo's "
                                     "GAE per generated token (verl's and TRL's gamma)")
    use_turn_scores: bool = setting(
        True, help="a turn-scoped reward counts for its turn (ppo: at the end of that turn); "
                   "off, for the agent's whole episode (ppo: on its last turn; at_grpo: on "
                   "each of its turns), as verl multi-turn PPO's use_turn_scores")
    advantage_unit: AdvantageUnit = setting(
        "transition", help="what counts once in a group's mean and std")
    scale_advantages: bool = setting(
        True, help="divide advantages by the group's std (GRPO); off: mean-centre only "
                   "(Dr. GRPO)")
    missing_reward: MissingReward = setting(
        "drop", help="an episode with no reward: 'drop' it, or a number to give it")
    merge_turn_calls: bool = setting(
        True, help="an agent's calls in one turn become one transition when each extends the "
                   "context so far")
    retokenize: str | None = setting(
        None, help="a tokenizer directory: rebuild ids from captured messages for spans "
                   "without them (flagged), and count disagreements with recorded ids")
    evaluation_weights: Mapping[str, float] | None = setting(
        None, help="evaluations (feedback, gen_ai.evaluation.result, judges) that count as "
                   "rewards, NAME=WEIGHT (unset: every name, weight 1; once set, only the names "
                   "given)")
    evaluation_labels: Mapping[str, float] | None = setting(
        None, help="scores of label-only evaluations, LABEL=VALUE (e.g. pass=1, fail=0)")
    rewards: str | None = setting(
        None, help="a reward recipe (TOML): rewards derived from what the spans hold (tool "
                   "failures, votes, DAG tasks, cost) and which evaluations count")
    # the recipe itself, when a program builds one (``rewards`` is read into it otherwise)
    recipe: Recipe | None = setting(None, help="a Recipe object", python_only=True)
    baseline: str | tuple[str, ...] = setting(
        ("group", "batch"), help="what rewards are compared with, first that applies: group "
                                 "(the rollouts of the same task; followed by another: groups "
                                 "of two or more), batch (the same agent and turn over the "
                                 "whole output: traffic that never repeats), key:ATTRIBUTE "
                                 "(leave-one-out over episodes sharing it)")
    per_agent_advantages: bool = setting(
        False, help="normalise advantages with each agent's own statistics (Dr. MAS)")

    def __post_init__(self) -> None:
        from agl_bridge.trainer.rewards.baselines import parse_baselines

        check_choices(self)
        if not 0.0 <= self.gamma <= 1.0:  # before any span is read (ppo's GAE would refuse it)
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")
        object.__setattr__(self, "baseline", parse_baselines(self.baseline))
        if self.recipe is None and self.rewards is not None:
            from agl_bridge.trainer.rewards.recipes import load_recipe

            object.__setattr__(self, "recipe", load_recipe(self.rewards))

    @property
    def baselines(self) -> tuple[str, ...]:
        return tuple(self.baseline)

    @property
    def key_attributes(self) -> tuple[str, ...]:
        """The attributes ``key:`` baselines group by."""
        from agl_bridge.trainer.rewards.baselines import KEY_PREFIX, key_attribute

        return tuple(key_attribute(b) for b in self.baselines if b.startswith(KEY_PREFIX))

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """Span columns read besides the converter's own: the recipe's, and the attributes
        JSON when a key baseline groups by an attribute that is not a column."""
        from agl_bridge.schema import SPAN_SCHEMA

        extra: tuple[str, ...] = self.recipe.columns if self.recipe is not None else ()
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

    MAX_LISTED = 20  # rejected rewards listed by place; all are counted in ``notes``

    def merge(self, other: ConversionStats) -> None:
        """Every count added (a new field is merged without a line here); the place lists
        keep their first ``MAX_LISTED``."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):  # Counters, and the recipe's sums
                for key, value in theirs.items():
                    mine[key] += value
            elif f.name in ("rejected_rewards", "unknown_evaluations"):
                mine += theirs[:max(0, self.MAX_LISTED - len(mine))]
            elif isinstance(mine, list):
                mine += theirs
            else:
                setattr(self, f.name, mine + theirs)

    def summary(self, algorithm: str | None = None) -> str:
        """The counts as text. ``algorithm`` (the conversion's): under ``ppo`` the groups,
        their reward variance and baselines are labelled as what the file holds, not what
        trains (the critic's GAE advantages do; the file's group advantages are not read)."""
        groups = (f"{self.groups} groups ({self.zero_variance_groups} with zero reward "
                  "variance)" + ("; baselines: " + ", ".join(f"{name} {n}" for name, n in
                                                            sorted(self.baselines.items()))
                                 if set(self.baselines) - {"group"} else ""))  # a fallback
        head = (f"{self.spans} spans, {self.episodes} episodes, {self.llm_spans} LLM calls -> "
                f"{self.transitions} transitions")
        lines = [f"{head}; ppo: trained on the critic's GAE advantages, not the file's group "
                 f"advantages ({groups})" if algorithm == "ppo" else f"{head} in {groups}"]
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
