"""``LoopConfig``: everything ``agl-bridge loop`` needs, each setting declared once.

The loop's own settings (where episodes come from, the held-out evaluation, the budget) are
declared here; the stages it drives keep theirs and are nested as tables: ``[convert]``
(``ConvertConfig``), ``[train]`` (``GRPOConfig``), ``[judge]`` (``JudgeConfig``), ``[serve]``
(``ServeConfig``), ``[gate]`` and ``[watch]``. The same names are the keys of ``--config
loop.toml``, the flags (``--train.learning-rate``: a table's settings are dotted) and the
keywords of the dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agl_bridge.settings import at_least, check_choices, setting, values
from agl_bridge.trainer.conversion.config import ConvertConfig
from agl_bridge.trainer.judging.config import JudgeConfig
from agl_bridge.trainer.loop.apo.config import ApoSearchConfig
from agl_bridge.trainer.loop.gate import GateRule
from agl_bridge.trainer.serving.config import ServeConfig
from agl_bridge.trainer.training.config import GRPOConfig, check_algorithm

# what a round changes: the adapters (lora), the agents' system prompts (apo), or each in turn
Algorithm = Literal["lora", "apo", "apo+lora"]


@dataclass
class GateConfig:
    """The held-out comparison of each candidate with the live version (``gate.py``)."""

    rule: GateRule = setting(
        "not_worse", help="publish a candidate only if it is not worse than the live version "
                          "beyond noise (not_worse), better beyond noise (better), or always "
                          "(off)")
    tolerance: float = setting(0.0, help="how much worse (mean score) still counts as not "
                                         "worse")
    tasks: str | None = setting(
        None, help="JSON lines of held-out tasks the gate compares on (unset: eval_tasks)")
    inputs: int = setting(
        0, help="a live service without held-out tasks: compare on this many of the round's "
                "newest real inputs, each replayed on the live version and on the candidate "
                "(replay_team, at temperature) and scored by the judge, the recipe or the "
                "team's own rewards; under apo, the prompt search and its critiques never see "
                "them (0: on held-out tasks)")
    temperature: float | None = setting(
        None, help="the gate's sampling temperature (unset: temperature, as the team is "
                   "served: a candidate that wins greedily can lose what users get)")
    rollouts: int = setting(2, help="episodes per gate task and version (a task's score is "
                                    "their mean)")
    partial: bool = setting(
        False, help="when the team's score passes but a role's own is worse beyond noise, "
                    "publish the roles that passed and keep the others' live versions (off: "
                    "one role's refusal refuses the whole candidate). The combination "
                    "published was not itself gated: the watch judges it live")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.inputs < 0:
            raise ValueError(f"inputs must be 0 or more, got {self.inputs!r}")
        at_least(self, 1, "rollouts")
        if self.temperature is not None and not self.temperature >= 0:
            raise ValueError(f"temperature must be 0 or more, got {self.temperature!r}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be 0 or more, got {self.tolerance!r}")


@dataclass
class WatchConfig:
    """The live reward of a new version against the previous one (``watch.py``)."""

    episodes: int = setting(32, help="rewarded episodes of the new version before judging it")
    margin: float = setting(0.0, help="how much lower its mean reward may be before it is "
                                      "rolled back, beyond noise (0: any drop beyond noise)")
    window: int = setting(3, help="compared with the best of the last this many versions "
                                  "(1: the previous one only): a slide over several versions, "
                                  "each step within noise, is rolled back too")

    def __post_init__(self) -> None:
        check_choices(self)
        at_least(self, 1, "episodes")
        if self.margin < 0:
            raise ValueError(f"margin must be 0 or more, got {self.margin!r}")
        at_least(self, 1, "window")


@dataclass
class LoopConfig:
    workdir: str = setting("agl_bridge_loop", help="where the loop keeps its state, rounds, "
                                                   "adapters and report")
    # -- the model and its server -------------------------------------------------------------
    model: str = setting("", help="a local model directory (required)")
    server: str | None = setting(
        None, help="an OpenAI-compatible vLLM base URL to use (unset: the loop starts one)")
    agents: list[str] = setting(help="the aliases the team's agents ask for (one adapter each)",
                                default_factory=list)
    # -- where episodes come from: the loop runs the team, or a service writes traces ----------
    team: str | None = setting(None, help="the team command (see trainer/loop/team.py)")
    tasks: str | None = setting(
        None, help="JSON lines of training tasks the team plays, in order")
    tasks_per_round: int = setting(32, help="training tasks per round")
    rollouts: int = setting(4, help="episodes per task per round (a group)")
    temperature: float = setting(0.6, help="the rollouts' sampling temperature")
    max_tokens: int = setting(64, help="per answer (the team reads AGL_BRIDGE_MAX_TOKENS)")
    traces: str | None = setting(
        None, help="a live span directory the user's service writes to (instead of team)")
    settle_s: float = setting(
        30.0, help="live: a span file is used once this many seconds old (feedback may follow)")
    min_episodes: int = setting(64, help="live: rewarded episodes a round needs ...")
    max_wait_s: float = setting(600.0, help="... or this many seconds, whichever comes first")
    replay_k: int = setting(
        0, help="play each input of new episodes again this many times, so that it forms a "
                "group (live traces; 0: off)")
    replay_inputs: int = setting(8, help="live: inputs replayed per round at most (the "
                                         "newest episodes')")
    replay_team: str | None = setting(
        None, help="the command that replays them (unset: eval_team, else team)")
    replay_field: str | None = setting(
        None, help="a span column or attribute that holds an episode's input")
    # -- the held-out evaluation before the first round and after the last --------------------
    eval_team: str | None = setting(None, help="the command run on held-out tasks (unset: "
                                               "team)")
    eval_tasks: str | None = setting(
        None, help="JSON lines of held-out tasks (never trained on)")
    eval_rollouts: int = setting(1, help="held-out episodes per task")
    eval_temperature: float = setting(0.0, help="held-out sampling temperature (0: greedy)")
    # -- budget -------------------------------------------------------------------------------
    rounds: int = setting(10, help="at most this many rounds")
    minutes: float = setting(60.0, help="time budget: no round starts that would end after it")
    # -- the stages' own settings -------------------------------------------------------------
    algorithm: Algorithm = setting(
        "lora", help="what each round changes: lora (trains LoRA adapters from the round's "
                     "episodes: [convert], [train]), apo (optimises the agents' system prompts "
                     "from them, published to the registry's prompt table: [apo]; no training, "
                     "no LoRA serving), apo+lora (the two in turn, one per round: apo in round "
                     "0, 2, ..., lora in 1, 3, ...)")
    convert: ConvertConfig = setting(help="conversion and rewards",
                                     default_factory=ConvertConfig)
    train: GRPOConfig = setting(help="training", default_factory=GRPOConfig)
    judge: JudgeConfig = setting(help="the LLM judge (live traces)",
                                 default_factory=JudgeConfig)
    serve: ServeConfig = setting(help="serving", default_factory=ServeConfig)
    gate: GateConfig = setting(help="the gate", default_factory=GateConfig)
    watch: WatchConfig = setting(help="the watch", default_factory=WatchConfig)
    apo: ApoSearchConfig = setting(help="prompt optimisation (algorithm apo or apo+lora)",
                                   default_factory=ApoSearchConfig)

    def check(self) -> LoopConfig:
        """Refuse what cannot work, naming the setting."""
        check_choices(self)
        if not self.model and not (self.algorithm == "apo" and self.server):
            raise ValueError("model: a local model directory is required (algorithm apo on a "
                             "given server needs none)")
        if self.algorithm != "lora" and self.traces is not None \
                and (self.replay_team or self.eval_team) is None:
            raise ValueError(f"algorithm {self.algorithm} on live traces: prompt candidates "
                             f"play the round's newest real inputs again: give replay_team "
                             f"(or eval_team), a command that writes result lines with a score")
        if (self.team is None) == (self.traces is None):
            raise ValueError("give either team (with tasks) or traces: where episodes come from")
        if self.team is not None and self.tasks is None:
            raise ValueError("team needs tasks: a JSON lines file of training tasks")
        if self.gate.rule != "off" and self.gate.inputs:
            if self.traces is None:
                raise ValueError("gate.inputs replays real inputs of a live traces directory: "
                                 "set traces")
            if (self.replay_team or self.eval_team or self.team) is None:
                raise ValueError("gate.inputs needs a command that replays them: replay_team")
        elif self.gate.rule != "off" and (self.gate.tasks or self.eval_tasks) is None:
            raise ValueError("the gate needs eval_tasks (held-out tasks), gate.inputs (real "
                             "inputs replayed: a live service), or gate.rule = 'off'")
        elif self.gate.rule != "off" and (self.eval_team or self.team) is None:
            raise ValueError("the gate needs eval_team (the team command run on eval_tasks)")
        if not self.agents:
            raise ValueError("agents: the aliases the team's agents ask for (one adapter each)")
        check_algorithm(self.train, self.convert.algorithm)  # ppo's settings, with the others
        wanted = self.train.train_agents
        if wanted is not None and not set(wanted) <= set(self.agents):
            raise ValueError(f"train.train_agents {sorted(wanted)} must be among agents "
                             f"{sorted(self.agents)}")
        if self.judge.rubric is not None:
            if self.traces is None:
                raise ValueError("judge.rubric scores a live traces directory: set traces")
            if not Path(self.judge.rubric).is_file():
                raise ValueError(f"judge.rubric: {self.judge.rubric} is not a rubric file")
        if self.replay_k:
            if self.traces is None:
                raise ValueError("replay plays the inputs of a live traces directory: set traces")
            if self.replay_k < 2:
                raise ValueError(f"replay_k must be at least 2 (a group), got {self.replay_k!r}")
            at_least(self, 1, "replay_inputs")
            if (self.replay_team or self.eval_team or self.team) is None:
                raise ValueError("replay needs a team command: replay_team (or eval_team)")
        at_least(self, 1, "tasks_per_round", "rollouts", "min_episodes", "rounds", "eval_rollouts",
                 "max_tokens")
        for name in ("temperature", "eval_temperature", "settle_s", "max_wait_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)!r}")
        if not self.minutes > 0:
            raise ValueError(f"minutes must be more than 0, got {self.minutes!r}")
        return self

    @property
    def work(self) -> Path:
        return Path(self.workdir).resolve()

    def settings(self) -> dict[str, Any]:
        return values(self)
