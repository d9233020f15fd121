"""The demo's settings: its own (``DemoConfig``), and the values it gives the loop's.

Kept apart from ``demo.py`` so that ``agl-bridge --help`` builds the demo's flags without
importing it. The demo is a client of the loop: every loop setting it exposes keeps the loop's
name, type and help; ``DEMO_OVERRIDES`` are the demo's values for its small model and short
budget, in this one place (``--print-config`` shows them as ``demo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agl_bridge.settings import at_least, check_choices, setting

DemoTask = Literal["add", "lower", "relay", "flow", "massgen", "retry"]
RewardsFrom = Literal["feedback", "judge", "both"]


@dataclass
class DemoConfig:
    """What the demo decides itself: the task family, its held-out set, production mode."""

    task: DemoTask | None = setting(
        None, help="add: arithmetic, solver and checker (default for smollm2); relay: a "
                   "reader passes the numbers of a word problem to a solver that never sees it "
                   "(both roles needed); flow: a planner writes a workflow (a DAG) for a price "
                   "question, an executor carries out each step with a calculator or a price "
                   "list; massgen: two agents of the real MassGen answer sums and vote, "
                   "through its workflow tool calls (its own environment, built once under the "
                   "cache); retry: one solver over several turns, told too high or too low "
                   "until right, rewarded only at the end (multi-turn: for --convert.algorithm "
                   "ppo); lower: a toy reward a random model can learn (default for tiny)")
    branch: int = setting(0, help="tree sampling in training rollouts, K ways per episode and "
                                   "the best continued (0: off): --task relay, the reader's "
                                   "turn; --task flow, the planner's workflow")
    apo: bool = setting(
        False, help="the team on the base model only, improved through its agents' system "
                    "prompts: the loop's algorithm apo (APO from each round's episodes, the "
                    "served base model as the optimizer, the gate, the prompt table the team "
                    "follows; [apo] settings as --apo.beam-width, ...); no training, unless "
                    "--algorithm apo+lora (the two levers in turn, the same small search)")
    seed: int = setting(0, help="draws the held-out and training tasks (and the tiny model); "
                                "seeds training unless --train.seed is given")
    eval_size: int = setting(100, help="held-out tasks, drawn before any training, never "
                                       "trained on")
    gate_size: int = setting(32, help="held-out tasks the gate compares on (the first of the "
                                      "set)")
    production: bool = setting(
        False, help="the team serves a stream of requests that never repeat, with no reward; "
                    "simulated users send feedback later for some; the loop trains on what "
                    "accumulated (live trace directory), gates and publishes while the service "
                    "runs")
    feedback_share: float = setting(0.5, help="production: requests whose users send feedback")
    rewards_from: RewardsFrom = setting(
        "feedback", help="production: feedback (the users' only), judge (no users: the LLM "
                         "judge, the base model on the same vLLM, scores episodes) or both "
                         "(the judge scores the episodes that got no feedback)")
    concurrency: int = setting(4, help="production: requests served at once")
    rate: float = setting(1.0, help="production: requests per second reaching the service (it "
                                    "shares the cores with training)")
    keep_serving_while_training: bool = setting(
        False, help="production: by default the service pauses while a round trains (on 2 "
                    "shared cores vLLM's threads and training slow each other down many times "
                    "over; production trains on other machines)")

    def __post_init__(self) -> None:
        check_choices(self)
        at_least(self, 1, "eval_size", "gate_size", "concurrency")
        at_least(self, 0, "branch")


# the loop settings the demo takes as flags (dotted paths; a table's name: all of it)
DEMO_SETTINGS: tuple[str, ...] = (
    "workdir", "model", "rounds", "minutes", "tasks_per_round", "rollouts", "temperature",
    "max_tokens", "eval_rollouts", "eval_temperature", "min_episodes", "replay_k",
    "replay_inputs", "convert", "train", "gate.rule", "gate.tolerance", "gate.partial",
    "gate.rollouts", "gate.temperature", "judge.max_episodes",
    "watch.margin", "algorithm", "apo")

# the demo's values for the loop's settings: SmolLM2-135M, LoRA on 2 CPU cores, 30 minutes
DEMO_OVERRIDES: dict[str, Any] = {
    "workdir": "runs/demo", "model": "smollm2", "rounds": 12, "minutes": 30.0,
    "max_tokens": 16,
    "train": {"policy": "per_agent_lora", "learning_rate": 2e-4,
              "per_device_train_batch_size": 16, "lora_r": 16, "lora_alpha": 32,
              # event files under WORKDIR/runs and each round's train/runs: light, no server
              "report_to": ["tensorboard"]},
}


def add_demo_flags(parser: Any) -> None:
    """The demo's flags: its file, ``--fresh``, its own settings and the loop's it exposes
    (with the demo's values as their defaults)."""
    from agl_bridge import settings
    from agl_bridge.trainer.loop.config import LoopConfig

    settings.add_file_flags(parser, "demo and loop settings")
    parser.add_argument("--fresh", action="store_true", help="discard an earlier run in "
                                                             "--workdir")
    settings.add_flags(parser, DemoConfig)
    settings.add_flags(parser, LoopConfig, only=DEMO_SETTINGS,
                       defaults=settings.paths_values(DEMO_OVERRIDES))


def derived_overrides(demo: DemoConfig, loop: Any) -> dict[str, Any]:
    """The demo's values that follow from other settings (shown as ``demo`` too): the watch
    waits for a round's worth of episodes; production compares live requests across the batch
    (replayed ones within their group first), lets the judge score 32 episodes a round, and
    fits the judge into the demo's context; training is seeded by ``seed``; ``apo`` runs the
    loop's algorithm apo with a search small enough for a round of a few minutes."""
    out: dict[str, Any] = {"train": {"seed": demo.seed}, "watch": {
        "episodes": loop.min_episodes if demo.production else
        loop.tasks_per_round * loop.rollouts}}
    if demo.apo:  # a small search: each candidate plays 16 of the round's questions x rollouts
        out["algorithm"] = "apo"
        out["apo"] = {"beam_width": 2, "branch_factor": 2, "beam_rounds": 1,
                      "val_batch_size": 16, "max_episode_chars": 1500}
    if demo.production:
        out["max_wait_s"] = 180.0
        # room for the judge's prompt (rubric ~250 tokens, an episode cut to fit, 400 out)
        out["serve"] = {"max_model_len": 2048}
        out["convert"] = {"baseline": "group,batch" if loop.replay_k else "batch"}
        out["judge"] = {"max_episodes": 32, **judge_fit(loop.model)}
    if demo.task == "massgen":  # tool calls: the hermes parser, a template that shows tools
        from agl_bridge.trainer.loop.teams.massgen_arith import CHAT_TEMPLATE

        out.update(max_tokens=96, serve={"tool_call_parser": "hermes", "max_model_len": 4096,
                                         "vllm_args": ["--chat-template", str(CHAT_TEMPLATE)]})
    return out


def judge_fit(model: str) -> dict[str, Any]:
    """Judge settings that fit the production demo's 2048-token context. SmolLM2 reads about
    3-4 characters a token, so 3,000 characters of episode fit, and its verdicts are
    constrained to their JSON schema. The tiny model's tokenizer is byte-level (a character a
    token) and its answers are random bytes: 400 characters, and the verdict constrained to the
    two answers the rubric allows, so that its scores parse (they say nothing about the
    episode: the tiny model only proves the path)."""
    if model == "tiny":
        return {"max_episode_chars": 400, "structured": False,
                "extra_body": {"structured_outputs": {"regex": r'\{"score": [01]\}'}}}
    return {"max_episode_chars": 3000, "structured": True}


def demo_settings(args: Any, file_values: dict[str, Any], file_label: str = "file"
                  ) -> tuple[DemoConfig, Any, dict[str, dict[str, str]]]:
    """The demo's own settings and the loop's, from the demo's values < the file < the flags
    (a file holds both: the demo's names and the loop's), and where each came from."""
    import dataclasses

    from agl_bridge import settings
    from agl_bridge.trainer.loop.config import LoopConfig

    own = {f.name for f in dataclasses.fields(DemoConfig)}
    exposed = set(DEMO_SETTINGS)
    outside = sorted(p for p in settings.paths(LoopConfig, {
        k: v for k, v in file_values.items() if k not in own})
        if p not in exposed and p.split(".")[0] not in exposed)
    if outside:
        raise settings.SettingError(f"{file_values and file_label}: the demo sets {outside[0]} "
                                    f"itself; it takes: {', '.join(sorted(own | exposed))}")
    demo, demo_origin = settings.resolve(DemoConfig, layers=[
        (file_label, {k: v for k, v in file_values.items() if k in own}),
        ("flag", settings.given_flags(args, DemoConfig))])
    layers = [(file_label, {k: v for k, v in file_values.items() if k not in own}),
              ("flag", settings.given_flags(args, LoopConfig))]
    first, _ = settings.resolve(LoopConfig, layers=[("demo", DEMO_OVERRIDES), *layers])
    overrides = settings.merge(DEMO_OVERRIDES, derived_overrides(demo, first))
    loop, origin = settings.resolve(LoopConfig, layers=[("demo", overrides), *layers])
    return demo, loop, {"demo": demo_origin, "loop": origin}
