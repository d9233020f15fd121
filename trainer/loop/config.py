"""``LoopConfig``: everything ``agl-bridge loop`` needs, one documented configuration.

Given as a TOML file (``--config loop.toml``, the same names) and/or flags (flags win). The
names group as the loop's stages read them: where episodes come from (``team`` + ``tasks``, or a
live ``traces`` directory), how they are rewarded and compared (``rewards``, ``baseline``, ...),
training, the gate, the watch, the budget.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.trainer.loop.gate import RULES, GateRule
from agl_bridge.trainer.rewards.baselines import parse_baselines
from agl_bridge.trainer.training.config import SFT_SELECTS, TRAIN_ALGORITHMS, one_of


@dataclass
class LoopConfig:
    workdir: str = "agl_bridge_loop"
    # -- the model and its server -------------------------------------------------------------
    model: str = ""  # a local model directory
    server: str | None = None  # an OpenAI-compatible vLLM base URL to use; None: start one
    registry: str | None = None  # its alias table's directory (with server); default workdir
    agents: list[str] = field(default_factory=list)  # the aliases the team's agents ask for
    max_model_len: int = 1024
    max_lora_rank: int = 16
    # -- where episodes come from: the loop runs the team, or a service writes traces ----------
    team: str | None = None  # the team command (see trainer/loop/team.py)
    tasks: str | None = None  # JSON lines of training tasks the team plays, in order
    tasks_per_round: int = 32
    rollouts: int = 4  # episodes per task per round (a group)
    temperature: float = 0.6
    traces: str | None = None  # a live span directory the user's service writes to
    settle_s: float = 30.0  # live: a span file is used once this old (feedback may follow)
    min_episodes: int = 64  # live: rewarded episodes a round needs ...
    max_wait_s: float = 600.0  # ... or this long, whichever comes first
    # -- rewards and advantages ---------------------------------------------------------------
    rewards: str | None = None  # a reward recipe (TOML)
    baseline: str = "group"  # group | batch | key:ATTRIBUTE, comma-separated: first that applies
    per_agent_advantages: bool = False
    missing_reward: str = "drop"  # or a number
    judge: str | None = None  # live: a rubric file; an LLM judge scores new unrewarded episodes
    judge_model: str | None = None  # the judge's served model name (default: the base model)
    judge_url: str | None = None  # its OpenAI-compatible URL (default: the loop's vLLM)
    judge_mode: str = "absolute"  # absolute | relative (RULER-style, per task)
    judge_max_episodes: int = 64  # episodes the judge scores per round at most
    judge_structured: bool = True  # constrain verdicts to their JSON schema (vLLM, OpenAI)
    judge_max_episode_chars: int = 12_000  # an episode's text is cut to this (start and end)
    judge_extra_body: str | None = None  # more fields for each judge request, a JSON object
    replay_k: int = 0  # live: play the inputs of new episodes again this many times each (0: off)
    replay_inputs: int = 8  # live: inputs replayed per round at most (the newest episodes')
    replay_team: str | None = None  # the command that replays them (default: eval_team, team)
    replay_field: str | None = None  # a span column or attribute that holds an episode's input
    # -- training -----------------------------------------------------------------------------
    algorithm: str = "at_grpo"
    policy: str = "per_agent_lora"
    learning_rate: float = 2e-4
    batch_size: int = 16
    epochs: int = 1
    lora_r: int = 16
    alpha: float = 1.0  # AT-GRPO team reward weight
    train_agents: list[str] | None = None  # train only these agents (None: all in agents)
    sft_select: str = "best"  # sft: the best of each group, or "threshold" (rejection sampling)
    sft_min_reward: float | None = None  # sft: the reward a transition (or a group's best) needs
    seed: int = 0
    # -- the gate: held-out evaluation of each candidate beside the live version -------------
    eval_team: str | None = None  # default: the team command
    eval_tasks: str | None = None  # JSON lines of held-out tasks (never trained on)
    gate_tasks: str | None = None  # held-out tasks the gate compares on (default: eval_tasks)
    eval_rollouts: int = 1
    eval_temperature: float = 0.0
    gate: str = "not_worse"  # not_worse | better | off
    gate_tolerance: float = 0.0
    # -- the watch: live reward of a new version against the previous one ---------------------
    watch_episodes: int = 32  # rewarded episodes of the new version before judging it
    watch_margin: float = 0.05
    # -- budget -------------------------------------------------------------------------------
    rounds: int = 10
    minutes: float = 60.0
    max_tokens: int = 64  # passed to the team as AGL_BRIDGE_MAX_TOKENS

    def check(self) -> LoopConfig:
        """Refuse what cannot work, naming the setting."""
        if not self.model:
            raise ValueError("model: a local model directory is required")
        if (self.team is None) == (self.traces is None):
            raise ValueError("give either team (with tasks) or traces: where episodes come from")
        if self.team is not None and self.tasks is None:
            raise ValueError("team needs tasks: a JSON lines file of training tasks")
        if self.gate not in RULES:
            raise ValueError(f"gate must be one of {RULES}, got {self.gate!r}")
        if self.gate != "off" and (self.gate_tasks or self.eval_tasks) is None:
            raise ValueError("the gate needs eval_tasks (held-out tasks), or gate = 'off'")
        if self.gate != "off" and (self.eval_team or self.team) is None:
            raise ValueError("the gate needs eval_team (the team command run on eval_tasks)")
        if not self.agents:
            raise ValueError("agents: the aliases the team's agents ask for (one adapter each)")
        if self.algorithm not in TRAIN_ALGORITHMS:
            raise ValueError(f"algorithm must be {one_of(TRAIN_ALGORITHMS)}, got "
                             f"{self.algorithm!r}")
        if self.sft_select not in SFT_SELECTS:
            raise ValueError(f"sft_select must be {one_of(SFT_SELECTS)}, got "
                             f"{self.sft_select!r}")
        if self.sft_select == "threshold" and self.sft_min_reward is None:
            raise ValueError("sft_select = 'threshold' needs sft_min_reward")
        if self.policy not in ("shared", "per_agent_lora", "per_agent_model"):
            raise ValueError(f"policy must be shared, per_agent_lora or per_agent_model, got "
                             f"{self.policy!r}")
        if self.train_agents is not None and not set(self.train_agents) <= set(self.agents):
            raise ValueError(f"train_agents {sorted(self.train_agents)} must be among agents "
                             f"{sorted(self.agents)}")
        parse_baselines(self.baseline)
        if self.judge is not None:
            if self.traces is None:
                raise ValueError("judge scores a live traces directory: set traces")
            if not Path(self.judge).is_file():
                raise ValueError(f"judge: {self.judge} is not a rubric file")
            if self.judge_mode not in ("absolute", "relative"):
                raise ValueError(f"judge_mode must be absolute or relative, got "
                                 f"{self.judge_mode!r}")
            self.judge_body()
        if self.replay_k:
            if self.traces is None:
                raise ValueError("replay plays the inputs of a live traces directory: set traces")
            if int(self.replay_k) < 2:
                raise ValueError(f"replay_k must be at least 2 (a group), got {self.replay_k!r}")
            if int(self.replay_inputs) < 1:
                raise ValueError(f"replay_inputs must be at least 1, got {self.replay_inputs!r}")
            if (self.replay_team or self.eval_team or self.team) is None:
                raise ValueError("replay needs a team command: replay_team (or eval_team)")
        if int(self.judge_max_episode_chars) < 100:
            raise ValueError(f"judge_max_episode_chars must be at least 100, got "
                             f"{self.judge_max_episode_chars!r}")
        for name in ("tasks_per_round", "rollouts", "min_episodes", "batch_size", "epochs",
                     "rounds", "eval_rollouts", "watch_episodes", "judge_max_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        return self

    def judge_body(self) -> dict[str, Any] | None:
        """``judge_extra_body`` parsed; a clear error when it is not a JSON object."""
        if not self.judge_extra_body:
            return None
        try:
            body = json.loads(self.judge_extra_body)
        except ValueError as exc:
            raise ValueError(f"judge_extra_body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise ValueError(f"judge_extra_body must be a JSON object, got "
                             f"{self.judge_extra_body!r:.80}")
        return body

    @property
    def gate_rule(self) -> GateRule:
        return self.gate  # type: ignore[return-value]  # checked in check()

    @property
    def work(self) -> Path:
        return Path(self.workdir).resolve()

    def settings(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "<config>") -> LoopConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(values))


def read_config(path: str) -> dict[str, Any]:
    """A TOML or JSON file of settings."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    text = Path(path).read_text()
    try:
        values = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a table of settings")
    return values


def setting_help() -> dict[str, str]:
    """Each setting's comment in this file, as its flag's help."""
    import inspect
    import re

    out: dict[str, str] = {}
    for line in inspect.getsource(LoopConfig).splitlines():
        m = re.match(r"\s+(\w+): [^=]+= .*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out
