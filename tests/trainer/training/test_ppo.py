"""``algorithm = "ppo"`` on the tiny random model: the critic learns (its value loss falls and
its prediction comes to track a fixed reward; a new one starts at its round's mean return), is
saved beside its adapter and read back, is
checkpointed with the policy (a resumed run equals one never stopped), with the shared and
per-agent policies; and the conversion places each reward at the end of its turn."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import agl_bridge
from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.adapters import METADATA_FILE
from agl_bridge.trainer.training import GRPOConfig, train_policy
from agl_bridge.trainer.training.critic import VALUE_HEAD_FILE
from tests.factories import llm, reward, table


def episodes(rewards, agents=("a",)):
    """Each agent acts over two turns per episode; turn 1 holds a tool result (masked) before
    its own tokens; the reward sits on the last turn (as ``algorithm = "ppo"`` converts it)."""
    rows = []
    for e, r in enumerate(rewards):
        for k, agent in enumerate(agents):
            for turn in (0, 1):
                rows.append({
                    "episode_id": f"e{e}", "task_id": "t", "agent_name": agent,
                    "turn_index": turn, "prompt_ids": [257, 40 + e, 41 + k, 258 + turn],
                    "completion_ids": [60 + e, 61, 62] if turn == 0 else [70, 71, 63 + e, 64],
                    "completion_mask": [1, 1, 1] if turn == 0 else [0, 0, 1, 1],
                    "behaviour_logprobs": None, "reward": r if turn == 1 else 0.0,
                    "group_id": f"task:t|agent:{agent}", "advantage": None,
                    "merged_calls": 1 if turn == 0 else 2, "retokenized": False})
    return pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA)


def config(**overrides):
    return GRPOConfig(**{"learning_rate": 1e-3, "critic_learning_rate": 1e-2,
                         "per_device_train_batch_size": 4, "num_train_epochs": 8, "lam": 1.0,
                         **overrides})


def value_losses(result, adapter):
    return [m["value_loss"] for m in result.metrics if m["adapter"] == adapter]


def test_the_value_loss_falls_and_the_critic_comes_to_predict_a_fixed_reward(tiny, tmp_path):
    """Every episode ends with reward 1 (gamma 1, lam 1: every trained token's return is 1).
    The head starts at 0 here (``value_head_init = "zero"``: value loss 0.5); trained (a wide
    cliprange_value: the default keeps one round's move within 0.2), the next round's critic
    (read back from beside the adapter) predicts about 1 before any update of its own."""
    data = episodes([1.0] * 4)
    clipped = train_policy(data, tiny, tmp_path / "clip", config=config(value_head_init="zero"),
                           algorithm="ppo", progress=False)
    # cliprange_value 0.2: within a round, no prediction is pulled past 0.2 from its
    # pre-update 0 (TRL's and verl's clip): 0.5 * (1 - 0.2)^2 = 0.32 is where the loss stops
    assert clipped.metrics[-1]["value_loss"] == pytest.approx(0.32, abs=0.01)
    first = train_policy(data, tiny, tmp_path / "a", algorithm="ppo", progress=False,
                         config=config(cliprange_value=10.0, value_head_init="zero"))
    losses = value_losses(first, "policy")
    assert losses[0] == pytest.approx(0.5, abs=1e-6)  # values 0, returns 1
    # Adam's momentum overshoots a fixed target, then settles: the last steps' mean
    assert sum(losses[-4:]) / 4 < 0.1 * losses[0]
    assert first.metrics[0]["value_mean"] == 0.0
    # equal returns everywhere: whitened, every advantage is 0, so only the critic learns
    assert all(m["policy_loss"] == 0.0 for m in first.metrics)
    saved = first.adapter_dir / VALUE_HEAD_FILE
    assert set(load_file(str(saved))) == {"weight", "bias"}
    meta = json.loads((first.adapter_dir / METADATA_FILE).read_text())
    assert meta["algorithm"] == "ppo" and meta["gae"] == {"gamma": 1.0, "lam": 1.0}

    second = train_policy(data, tiny, tmp_path / "a", algorithm="ppo", progress=False,
                          init_adapters={"policy": first.adapter_dir},
                          config=config(num_train_epochs=1, cliprange_value=10.0))
    assert second.adapter_dir.name == "v0002"
    before = second.metrics[0]  # the pre-update values are the first round's critic's
    assert before["value_mean"] == pytest.approx(1.0, abs=0.3)
    assert before["value_loss"] < 0.1 * losses[0]


def test_mean_returns_per_adapter_discount_per_generated_token():
    """A new head's bias: the mean over an adapter's trained tokens of the return to its
    chain's end. Agent a: one chain of two turns (3 trained tokens, then 2 masked observation
    tokens and 2 trained), reward 1 at the end; gamma 0.5 per generated token: returns 1/16,
    1/8, 1/4 | 1/2, 1 (the masked tokens are no steps). Agent b: two one-turn chains of two
    tokens, rewards 2 and -1 on their last: returns 1, 2 and -1/2, -1. An adapter with no
    trained token: 0."""
    from agl_bridge.trainer.training.critic import mean_returns

    def row(adapter, episode, agent, turn, mask, reward):
        return {"adapter": adapter, "episode_id": episode, "agent_name": agent,
                "turn_index": turn, "completion_mask": mask, "reward": reward}

    rows = [row("a", "e0", "a", 1, [0, 0, 1, 1], 1.0), row("b", "e0", "b", 0, [1, 1], 2.0),
            row("a", "e0", "a", 0, [1, 1, 1], 0.0), row("b", "e1", "b", 0, [1, 1], -1.0),
            row("c", "e0", "c", 0, [0, 0], 5.0)]
    got = mean_returns(rows, gamma=0.5)
    assert got == pytest.approx({"a": (1 / 16 + 1 / 8 + 1 / 4 + 1 / 2 + 1) / 5,
                                 "b": (1 + 2 - 1 / 2 - 1) / 4, "c": 0.0})
    assert mean_returns(rows, gamma=1.0)["a"] == pytest.approx(1.0)


def test_a_new_critic_starts_at_its_first_rounds_mean_return(tiny, tmp_path):
    """Rewards as the retry team's before its reward was counted once (2.0 right, -0.4 wrong):
    far from 0. A new head starts at the round's mean return (gamma 0.9 per generated token:
    each episode's 5 trained tokens get 0.9^4..0.9^0 of its reward), so on the first
    micro-batch (the whole round; lam 1: the returns do not depend on the values) the
    critic's mean value is the mean return; at zero (as before ``value_head_init``) it is
    1.15 below it, and the clipped loss (0.2 a token from its pre-update value) keeps it far
    below all round. The next round reads the head back beside the adapter and keeps its
    learnt bias."""

    def gap(result):  # the round's mean |value - return| over its micro-batches
        return sum(abs(m["value_mean"] - m["return_mean"]) for m in result.metrics) / len(
            result.metrics)

    data = episodes([2.0, -0.4, 2.0, 2.0])
    mean = (2.0 - 0.4 + 2.0 + 2.0) / 4 * sum(0.9 ** k for k in range(5)) / 5
    kw = dict(algorithm="ppo", progress=False, gamma=0.9)
    fresh = train_policy(data, tiny, tmp_path / "a", **kw,
                         config=config(num_train_epochs=4, per_device_train_batch_size=8))
    first = fresh.metrics[0]
    assert first["return_mean"] == pytest.approx(mean, abs=1e-5)
    assert first["value_mean"] == pytest.approx(mean, abs=1e-5)
    assert gap(fresh) < 0.15  # 0.09 over the 4 micro-batches
    zero = train_policy(data, tiny, tmp_path / "z", **kw, config=config(
        num_train_epochs=4, per_device_train_batch_size=8, value_head_init="zero"))
    assert zero.metrics[0]["value_mean"] == 0.0
    assert gap(zero) > 0.6  # 0.87: 0, 0.32, 0.47, 0.53 against 1.15
    bias = load_file(str(fresh.adapter_dir / VALUE_HEAD_FILE))["bias"].item()
    later = train_policy(episodes([0.0] * 4), tiny, tmp_path / "a", **kw,
                         init_adapters={"policy": fresh.adapter_dir},
                         config=config(num_train_epochs=1, per_device_train_batch_size=8))
    assert load_file(str(later.adapter_dir / VALUE_HEAD_FILE))["bias"].item() != 0.0
    assert later.metrics[0]["value_mean"] == pytest.approx(
        fresh.metrics[-1]["value_mean"], abs=0.3)  # not the new round's mean return, 0
    assert bias != pytest.approx(mean, abs=1e-6)  # it learnt from there


def test_rewards_move_the_policy_through_per_token_advantages(tiny, tmp_path):
    """Two agents, each its own LoRA and value head: rewards 1 and 0 alternate, so the
    advantages are not all zero and both adapters move; the observation tokens get none."""
    data = episodes([1.0, 0.0, 1.0, 0.0], agents=("a", "b"))
    result = train_policy(data, tiny, tmp_path, policy="per_agent_lora", algorithm="ppo",
                          config=config(num_train_epochs=2, learning_rate=1e-2),
                          progress=False)
    assert set(result.adapters) == {"a", "b"}
    for name, directory in result.adapters.items():
        weights = load_file(str(directory / "adapter_model.safetensors"))
        assert any(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k), name
        head = load_file(str(directory / VALUE_HEAD_FILE))
        assert head["weight"].abs().sum() > 0, name
        assert value_losses(result, name)[-1] < value_losses(result, name)[0]
    assert all(m["advantage_abs_mean"] > 0 for m in result.metrics)
    per_model = train_policy(data, tiny, tmp_path / "pm", policy="per_agent_model",
                             algorithm="ppo", config=config(num_train_epochs=1),
                             progress=False)
    assert all((d / VALUE_HEAD_FILE).exists() for d in per_model.adapters.values())


def test_the_critic_learns_the_normalised_rewards(tiny, tmp_path):
    """``reward_normalization``: what the critic learns. Episodes all rewarded 1 have no
    spread, so under ``mean_std`` every reward becomes 0 and the critic has nothing to learn
    (its head stays at 0, where the same run unnormalised moves it towards 1); under ``mean``
    rewards 1, 0, 1, 0 become +-.5, which the micro-batches report."""
    kw = dict(algorithm="ppo", progress=False)
    flat = train_policy(episodes([1.0] * 4), tiny, tmp_path / "flat", **kw, config=config(
        num_train_epochs=2, reward_normalization={"method": "mean_std"}))
    head = load_file(str(flat.adapter_dir / VALUE_HEAD_FILE))
    assert head["bias"].item() == 0.0 and head["weight"].abs().sum().item() == 0.0
    assert all(m["reward_mean"] == 0.0 and m["value_loss"] == 0.0 for m in flat.metrics)
    raw = train_policy(episodes([1.0] * 4), tiny, tmp_path / "raw", **kw,
                       config=config(num_train_epochs=2))
    assert load_file(str(raw.adapter_dir / VALUE_HEAD_FILE))["bias"].item() > 0.0
    centred = train_policy(episodes([1.0, 0.0, 1.0, 0.0]), tiny, tmp_path / "mean", **kw,
                           config=config(num_train_epochs=1, per_device_train_batch_size=8,
                                         reward_normalization={"method": "mean"}))
    rewards = {m["reward_mean"] for m in centred.metrics}
    assert rewards == {0.0}  # +.5 and -.5 on last turns, 0 on first turns: one batch of 8


def test_resume_equals_a_run_never_stopped_critic_included(tiny, tmp_path):
    data = episodes([1.0, 0.0], agents=("a", "b"))
    kw = dict(policy="per_agent_lora", algorithm="ppo", gamma=0.9, progress=False)
    cfg = dict(num_train_epochs=2, per_device_train_batch_size=2, learning_rate=1e-2, lam=0.9)
    whole = train_policy(data, tiny, tmp_path / "a", config=config(**cfg), **kw)
    stopped = train_policy(data, tiny, tmp_path / "b", checkpoint_dir=tmp_path / "ckpt",
                           config=config(**cfg, save_steps=2, max_steps=3), **kw)
    assert stopped.steps == 3
    resumed = train_policy(data, tiny, tmp_path / "c", checkpoint_dir=tmp_path / "ckpt",
                           resume_from_checkpoint=tmp_path / "ckpt" / "checkpoint-2",
                           config=config(**cfg), **kw)
    assert len(resumed.metrics) == len(whole.metrics) == 8
    for key in ("loss", "value_loss", "policy_loss", "value_mean"):
        assert [m[key] for m in resumed.metrics] == pytest.approx(
            [m[key] for m in whole.metrics], abs=1e-6), key
    for name in ("a", "b"):
        for file in ("adapter_model.safetensors", VALUE_HEAD_FILE):
            a = load_file(str(whole.adapters[name] / file))
            c = load_file(str(resumed.adapters[name] / file))
            assert all(torch.allclose(a[k], c[k], atol=1e-6) for k in a), (name, file)
    with pytest.raises(ValueError, match=r"with a critic .* cannot resume one without"):
        train_policy(data, tiny, tmp_path / "d", checkpoint_dir=tmp_path / "ckpt",
                     resume_from_checkpoint=True, config=config(**cfg),
                     policy="per_agent_lora", progress=False)


def test_ppo_from_spans_places_each_reward_at_the_end_of_its_turn(tiny, tmp_path):
    """Spans: a solver's two turns and a checker's one per episode; the episode's reward,
    a reward for the solver as an agent and one for its turn 0. PPO's transitions hold the
    turn reward on turn 0, the rest on each agent's last turn; AT-GRPO's gave every turn the
    team reward."""
    rows = []
    for e, r in enumerate([1.0, 0.0]):
        rows += [llm(f"e{e}", e * 10, agent="solver", turn=0, prompt=[257, 40 + e],
                     completion=[60 + e, 258]),
                 llm(f"e{e}", e * 10 + 1, agent="checker", turn=0, prompt=[257, 50 + e],
                     completion=[61, 258]),
                 llm(f"e{e}", e * 10 + 2, agent="solver", turn=1, prompt=[257, 45 + e],
                     completion=[62 + e, 258]),
                 reward(f"e{e}", e * 10 + 3, r),
                 reward(f"e{e}", e * 10 + 4, 0.5, scope="agent", agent="solver"),
                 reward(f"e{e}", e * 10 + 5, 0.25, scope="turn", agent="solver", turn=0)]
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows), tmp_path / "spans" / "part.parquet")
    run = agl_bridge.train_from_traces(
        tmp_path / "spans", tiny, algorithm="ppo", policy="per_agent_lora", alpha=2.0,
        output_dir=tmp_path / "run", progress=False, learning_rate=1e-2)
    got = pq.read_table(run.transitions_path).to_pylist()
    placed = {(t["episode_id"], t["agent_name"], t["turn_index"]): t["reward"] for t in got}
    assert placed == {("e0", "solver", 0): 0.25, ("e0", "solver", 1): 2.0 + 0.5,
                      ("e0", "checker", 0): 2.0,
                      ("e1", "solver", 0): 0.25, ("e1", "solver", 1): 0.5,
                      ("e1", "checker", 0): 0.0}
    assert set(run.adapters) == {"solver", "checker"}
    assert all((d / VALUE_HEAD_FILE).exists() for d in run.adapters.values())
    saved = json.loads((run.output_dir / "run.json").read_text())
    assert saved["settings"]["convert"]["algorithm"] == "ppo"
    assert saved["settings"]["train"]["lam"] == 0.95


def test_two_process_data_parallel_ppo_ends_with_the_same_policy_and_critic(tiny, tmp_path):
    """torchrun, 2 CPU processes: both compute the same GAE targets, train half the batches
    each, and end with the same LoRA weights and value heads, which moved."""
    import subprocess
    import sys

    from tests.paths import TESTS

    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(TESTS / "distributed_train.py"), str(tiny),
                          str(tmp_path), "ppo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r0, r1 = (load_file(str(tmp_path / f"rank{i}.safetensors")) for i in (0, 1))
    assert r0.keys() == r1.keys() and any(k.startswith("critic.") for k in r0)
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert all(r0[k].abs().sum() > 0 for k in r0 if k.startswith("critic.") and "weight" in k)
    assert (tmp_path / "adapters" / "a" / "v0001" / VALUE_HEAD_FILE).exists()


def test_ppo_raises_the_likelihood_of_the_rewarded_turns(tiny, tmp_path):
    """One prompt, two answers: the one that ends its episode with reward 1 gains log-probability
    against the one with 0, measured with the trained adapter on and off (the base)."""
    from agl_bridge.trainer.training.data import collate
    from agl_bridge.trainer.training.model import completion_logprobs

    data = episodes([1.0, 0.0, 1.0, 0.0])  # e0, e2 answer [60, ...], [62, ...]: rewarded
    result = train_policy(data, tiny, tmp_path, algorithm="ppo", keep_model=True,
                          config=config(num_train_epochs=4, learning_rate=2e-2),
                          progress=False)
    rows = [r for r in data.to_pylist() if r["turn_index"] == 1]
    batch = collate(rows, 0, torch.device("cpu"))
    model = result.model
    model.eval()
    with torch.no_grad():
        trained = (completion_logprobs(model, batch) * batch["loss_mask"]).sum(-1)
        with model.disable_adapter():
            base = (completion_logprobs(model, batch) * batch["loss_mask"]).sum(-1)
    gain = (trained - base).tolist()
    rewarded = [g for g, r in zip(gain, rows) if r["reward"] == 1.0]
    others = [g for g, r in zip(gain, rows) if r["reward"] == 0.0]
    assert min(rewarded) > max(others)


def test_ppo_settings_out_of_range_and_sft_are_refused_before_any_model_loads(tmp_path):
    for bad, match in [({"lam": 1.5}, "lam must be in"), ({"vf_coef": -1.0}, "vf_coef"),
                       ({"cliprange_value": 0.0}, "cliprange_value"),
                       ({"critic_learning_rate": 0.0}, "critic_learning_rate")]:
        with pytest.raises(ValueError, match=match):
            GRPOConfig(**bad)
    data = episodes([1.0, 0.0])
    with pytest.raises(ValueError, match="algorithm ppo trains with objective grpo"):
        train_policy(data, tmp_path / "no-model", tmp_path, algorithm="ppo", objective="sft")
    with pytest.raises(ValueError, match="gamma must be in"):
        train_policy(data, tmp_path / "no-model", tmp_path, algorithm="ppo", gamma=1.5)
    with pytest.raises(ValueError, match="it needs algorithm ppo, got 'at_grpo'"):
        train_policy(data, tmp_path / "no-model", tmp_path, algorithm="at_grpo",
                     config=GRPOConfig(reward_normalization={"method": "asym_clip"}))
