"""FSDP2 (``parallelism="fsdp"``) on CPU with gloo: two processes train what one does, a sharded
checkpoint resumes the same trajectory, and the adapters come out in PEFT format; with
``algorithm="ppo"`` too, critic included.

One process with gradient accumulation 2 and two processes with accumulation 1 take the same
micro-batches into each optimizer step (the plan is the same: units of world x accumulation),
so their per-micro-batch losses must agree to float rounding. Every process runs one intra-op
thread (torchrun gives each rank one; the launcher gives the single process one too), so the
kernels sum in the same order; the reduce-scatter adds the two ranks' gradients and halves
them, which is what local accumulation of two halved micro-batch gradients does. GRPO's
tolerance: 1e-5 absolute on losses and final LoRA weights (observed: 2e-7 when the single
process ran two threads). PPO's: 1e-6 on every per-micro-batch metric (losses, values,
returns, advantages), 1e-5 on the final LoRA weights and value heads; observed: metrics within
5e-7, LoRA weights within 5e-6 after 8 steps, heads within 1e-7, from the gradient-norm clip
(its norm summed shard by shard under FSDP, as a whole in one process: bit-identical with
``max_grad_norm`` 1e9, checked; and with the value heads started at zero, where no clipped
step happened to round differently). On another CPU (an AMD EPYC, 2026-11-28) the same runs
came out 2.5e-6 apart on a value loss of 0.47 and up to 1.1e-5 apart on LoRA weights of
magnitude 0.37: the kernels round differently there, so the PPO comparisons of two processes
with one allow 1e-5 relative on the metrics (``SHARDED_RTOL``) and 5e-5 on the final weights
(``SHARDED_WEIGHT_ATOL``); a wrong reduction or a mis-sharded head moves them by the learning
rate's scale, 5e-2 a step, far above either. Resumed against never stopped is the same order
of operations and keeps 1e-6.
Why the single thread matters: Adam's first step moves a weight by ``lr * g / (|g| + eps)``,
so a gradient that differs in its last bits (another summation order) can move a weight by up
to ``lr * diff / eps``; with two threads in the single process the critic's values differed
by 1e-4 after a few steps, from float rounding alone."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.paths import TESTS

SCRIPT = TESTS / "distributed_fsdp.py"


def _launch(tiny, out: Path, mode: str, procs: int, accumulation: int,
            policy: str = "per_agent_lora", backend: str = "gloo",
            bf16: str = "auto", algorithm: str | None = None) -> subprocess.CompletedProcess:
    """``backend``: ``gloo`` hides any GPU (``CUDA_VISIBLE_DEVICES=""``: these tests stay CPU
    tests on a GPU machine, where the trainer would pick nccl and one GPU per rank); ``nccl``
    leaves the GPUs visible and runs under torchrun even as one process (tests/gpu). Every
    process runs one intra-op thread (the module's docstring says why)."""
    cmd = [sys.executable, str(SCRIPT), str(tiny), str(out), mode, str(accumulation), policy,
           bf16, *([algorithm] if algorithm else [])]
    if procs > 1 or backend == "nccl":
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               **({"CUDA_VISIBLE_DEVICES": ""} if backend == "gloo" else {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _run(tiny, out: Path, mode: str, procs: int, accumulation: int,
         policy: str = "per_agent_lora", backend: str = "gloo", bf16: str = "auto",
         algorithm: str | None = None) -> list[dict]:
    done = _launch(tiny, out, mode, procs, accumulation, policy, backend, bf16, algorithm)
    # a rank's own error, before torchrun's summary; with what it printed before (a native
    # abort prints no traceback of its own)
    first = max(done.stderr.find("Traceback"), 0)
    assert done.returncode == 0, (done.stdout[-2000:] + done.stderr[max(first - 3000, 0):
                                                                    first + 4000]
                                  + done.stderr[-1500:])
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(procs)]


def _interleave(ranks: list[dict], key: str = "losses") -> list[float]:
    """Rank r's micro-batch k is the k * world + r-th of the one-process plan."""
    return [value for group in zip(*(r[key] for r in ranks)) for value in group]


def _lora(adapters_dir: Path, name: str, version: str) -> dict[str, torch.Tensor]:
    return load_file(str(adapters_dir / name / version / "adapter_model.safetensors"))


def test_two_fsdp_processes_train_what_one_does_and_a_sharded_checkpoint_resumes(tiny,
                                                                                  tmp_path):
    from agl_bridge.trainer.serving.validation import validate_adapter

    one = _run(tiny, tmp_path / "one", "run", 1, 2)
    two = _run(tiny, tmp_path / "two", "run", 2, 1)
    assert one[0]["steps"] == two[0]["steps"] == two[1]["steps"] == 8  # 2 epochs x 16 / 2 / 2
    assert len(one[0]["losses"]) == 16 and len(two[0]["losses"]) == 8
    assert _interleave(two) == pytest.approx(one[0]["losses"], abs=1e-5)
    # every optimizer step trained one adapter on both ranks
    assert two[0]["adapter_per_micro"] == two[1]["adapter_per_micro"]
    assert set(two[0]["adapter_per_micro"]) == {"a", "b"}
    assert sorted(two[0]["adapters"]) == ["a", "b"] and two[1]["adapters"] == {}
    for name in ("a", "b"):
        a = _lora(tmp_path / "one" / "adapters", name, "v0001")
        b = _lora(tmp_path / "two" / "adapters", name, "v0001")
        assert a.keys() == b.keys() and a
        assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
        assert any(v.abs().sum() > 0 for k, v in b.items() if "lora_B" in k)  # it trained
        validate_adapter(tmp_path / "two" / "adapters" / name / "v0001", base_model=tiny)

    # stopped after 2 steps, checkpointing each: resumed, the same trajectory and weights
    resumed_dir = tmp_path / "resumed"
    stopped = _run(tiny, resumed_dir, "stop", 2, 1)
    assert stopped[0]["steps"] == 2
    ckpt = resumed_dir / "checkpoints" / "checkpoint-2"
    files = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    assert all(f.endswith((".safetensors", ".json")) for f in files), files  # nothing pickled
    assert [f for f in files if f.startswith("shards/")], files  # each rank wrote its shard
    resumed = _run(tiny, resumed_dir, "resume", 2, 1)
    for r in range(2):
        assert resumed[r]["losses"] == pytest.approx(two[r]["losses"], abs=1e-6)
    for name in ("a", "b"):
        a = _lora(tmp_path / "two" / "adapters", name, "v0001")
        b = _lora(resumed_dir / "adapters", name, "v0002")  # v0001: the stopped run's
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)

    # a rank killed (SIGKILL) inside the third save, its shards written, the rename not done:
    # the second checkpoint stays whole and the run resumes from it, the same trajectory
    killed_dir = tmp_path / "killed"
    killed = _launch(tiny, killed_dir, "kill", 2, 1)
    assert killed.returncode != 0
    ckpts = sorted(p.name for p in (killed_dir / "checkpoints").iterdir())
    assert "checkpoint-2" in ckpts and "checkpoint-3" not in ckpts, ckpts
    resumed = _run(tiny, killed_dir, "resume", 2, 1)
    for r in range(2):
        assert resumed[r]["losses"] == pytest.approx(two[r]["losses"], abs=1e-6)
    assert not [p for p in (killed_dir / "checkpoints").iterdir()
                if p.name.startswith(".tmp-")], "the half-written save was left behind"

    # one plain process does not load the shards: a clear refusal, nothing trained
    from agl_bridge.trainer.training import GRPOConfig, train_policy
    from tests.factories import transitions

    with pytest.raises(ValueError, match="sharded"):
        train_policy(transitions([1.0, 0.0]), tiny, tmp_path / "plain", progress=False,
                     checkpoint_dir=resumed_dir / "checkpoints", resume_from_checkpoint=True,
                     config=GRPOConfig())
    assert not (tmp_path / "plain").exists()


PPO_METRICS = ("losses", "policy_loss", "value_loss", "value_mean", "return_mean",
               "advantage_mean")
# two processes against one (the module's docstring says why these): the metrics relative to
# their size, the final weights absolute
SHARDED_RTOL = 1e-5
SHARDED_WEIGHT_ATOL = 5e-5


def _weights(adapters_dir: Path, name: str, version: str) -> dict[str, torch.Tensor]:
    """An adapter version's LoRA weights and its value head, in one dict."""
    from agl_bridge.trainer.training.critic import VALUE_HEAD_FILE

    head = load_file(str(adapters_dir / name / version / VALUE_HEAD_FILE))
    return _lora(adapters_dir, name, version) | {f"head.{k}": v for k, v in head.items()}


def test_ppo_under_fsdp_trains_what_one_process_does_and_resumes_critic_included(tiny,
                                                                                tmp_path):
    """``algorithm="ppo"``, per-agent LoRA, two-turn episodes: the value heads are sharded
    with the policy. Two processes compute the same GAE targets (returns, whitened advantages)
    and train the same policies and critics as one; a sharded checkpoint holds the heads, their
    optimizer state and the targets, and a resumed run equals one never stopped."""
    one = _run(tiny, tmp_path / "one", "run", 1, 2, algorithm="ppo")
    two = _run(tiny, tmp_path / "two", "run", 2, 1, algorithm="ppo")
    assert one[0]["steps"] == two[0]["steps"] == two[1]["steps"] == 8  # 2 x 16 / 2 / 2
    assert two[0]["adapter_per_micro"] == two[1]["adapter_per_micro"]
    for key in PPO_METRICS:
        assert _interleave(two, key) == pytest.approx(one[0][key], rel=SHARDED_RTOL,
                                                      abs=1e-6), key
    values = one[0]["value_mean"]
    # each new head starts at its agent's mean return (both agents' rewards alike: the
    # returns to the chain's end at gamma 0.9, 0.382 over the trained tokens), and learns
    assert values[:4] == pytest.approx([0.382] * 4, abs=1e-3)
    assert max(abs(v - values[0]) for v in values) > 0.1
    assert any(abs(a) > 0.1 for a in one[0]["advantage_mean"])  # per-token credit, not all 0
    for name in ("a", "b"):
        a = _weights(tmp_path / "one" / "adapters", name, "v0001")
        b = _weights(tmp_path / "two" / "adapters", name, "v0001")
        assert a.keys() == b.keys() and {"head.weight", "head.bias"} <= set(b)
        assert all(torch.allclose(a[k], b[k], atol=SHARDED_WEIGHT_ATOL) for k in a), name
        assert b["head.weight"].abs().sum() > 0 and b["head.weight"].shape == (1, 64)

    # stopped after 2 steps, checkpointing each: the critic is in the shards, the GAE targets
    # in rank 0's file; resumed, the same trajectory, policies and critics
    resumed_dir = tmp_path / "resumed"
    stopped = _run(tiny, resumed_dir, "stop", 2, 1, algorithm="ppo")
    assert stopped[0]["steps"] == 2
    ckpt = resumed_dir / "checkpoints" / "checkpoint-2"
    files = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    assert all(f.endswith((".safetensors", ".json")) for f in files), files  # nothing pickled
    sharded = set()
    for f in ckpt.glob("shards/*.safetensors"):
        sharded |= set(load_file(str(f)))
    assert {"critic/critic.heads.agl_a.weight", "critic/critic.heads.agl_b.bias"} <= sharded
    assert any(k.startswith("optimizer/critic.heads.") for k in sharded)  # trained before
    targets = [k for k in load_file(str(ckpt / "rank-00000.safetensors")) if k.startswith("gae/")]
    assert len(targets) == 16  # every transition's, from before the first update
    resumed = _run(tiny, resumed_dir, "resume", 2, 1, algorithm="ppo")
    for r in range(2):
        for key in PPO_METRICS:
            assert resumed[r][key] == pytest.approx(two[r][key], abs=1e-6), (r, key)
    for name in ("a", "b"):
        a = _weights(tmp_path / "two" / "adapters", name, "v0001")
        b = _weights(resumed_dir / "adapters", name, "v0002")  # v0001: the stopped run's
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), name

    # a run without a critic does not resume it: refused before training
    refused = _launch(tiny, resumed_dir, "resume", 2, 1)
    assert refused.returncode != 0
    assert "with a critic (algorithm ppo) cannot resume one without" in refused.stderr


@pytest.mark.parametrize("algorithm", [None, "ppo"])
def test_per_agent_models_sharded_one_after_the_other(tiny, tmp_path, algorithm):
    """per_agent_model: a separate model per agent, each sharded in turn (under ppo with its
    own critic); 2 processes again train what 1 does."""
    one = _run(tiny, tmp_path / "one", "run", 1, 2, "per_agent_model", algorithm=algorithm)
    two = _run(tiny, tmp_path / "two", "run", 2, 1, "per_agent_model", algorithm=algorithm)
    assert one[0]["steps"] == two[0]["steps"] == 8  # 4 per agent's model
    for key in PPO_METRICS if algorithm else ("losses",):
        for agent in ("a", "b"):  # each model's micro-batches, in order
            mine = [v for v, a in zip(one[0][key], one[0]["adapter_per_micro"]) if a == agent]
            theirs = _interleave([{key: [v for v, a in zip(r[key], r["adapter_per_micro"])
                                         if a == agent]} for r in two], key)
            assert theirs == pytest.approx(mine, rel=SHARDED_RTOL if algorithm else None,
                                           abs=1e-6 if algorithm else 1e-5), (key, agent)
    assert sorted(two[0]["adapters"]) == ["a", "b"]
    for agent in ("a", "b") if algorithm else ():
        a = _weights(tmp_path / "one" / "adapters", agent, "v0001")
        b = _weights(tmp_path / "two" / "adapters", agent, "v0001")
        assert all(torch.allclose(a[k], b[k], atol=SHARDED_WEIGHT_ATOL) for k in a), agent
        assert b["head.weight"].abs().sum() > 0, agent


def test_a_rank_that_finished_its_work_exits_cleanly(tmp_path):
    """Ranks died of SIGABRT after their work (twice in CI): a gloo worker drops its last
    collective's tensors, which takes the GIL, while the interpreter ends. It happens when the
    group outlives the exit handler's ``destroy_process_group`` (FSDP's meshes, kept by
    DTensor's caches, hold it; ``hold`` stands for them). Without the handler's pause this
    test fails more often than not. Without such a holder, the group's workers end in the
    handler, although training imports FSDP and distributed checkpointing after the group
    starts (torch's ShardedGradScaler would hold the group by a default argument). A handler
    registered before the library's runs after it."""
    script = tmp_path / "group.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, sys
        import torch
        import torch.distributed as dist
        from agl_bridge.trainer.training.distributed import world_and_rank

        def workers():
            tasks = "/proc/self/task"
            return sum(open(f"{tasks}/{t}/comm").read().startswith("pt_gloo")
                       for t in os.listdir(tasks))

        def seen():  # registered first: runs after the library's handler
            with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
                f.write(f"{world} {dist.is_initialized()} {workers()} {started}")

        if sys.argv[2] == "free":
            atexit.register(seen)  # its file IO would hand the GIL over: not when "hold"
        world, rank = world_and_rank()
        import torch.distributed.checkpoint.state_dict  # as training does, after the group
        import torch.distributed.fsdp
        if sys.argv[2] == "hold":
            held = dist.group.WORLD
        for _ in range(3):
            dist.all_reduce(torch.ones(1), async_op=True).wait()
        started = workers()
    """))

    def launch(mode: str) -> list[list[str]]:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc_per_node=4", str(script), str(tmp_path), mode],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{mode}: {done.stderr[-3000:]}"
        return done

    launch("free")
    seen = [(tmp_path / r).read_text().split() for r in "0123"]
    assert all(s[:2] == ["4", "False"] and int(s[3]) > 0 for s in seen)
    assert [s[2] for s in seen] == ["0"] * 4  # no gloo worker left at the end
    for _ in range(3):
        launch("hold")


def test_running_workers_counts_gloo_threads_that_run_or_wait_for_a_core(tmp_path):
    """The exit handler pauses longer while a gloo worker still runs; ``/proc`` says which."""
    from agl_bridge.trainer.training.distributed import running_workers

    stats = {"1": "1 (python) R 0", "2": "2 (pt_gloo_runloop) R 1 2",
             "3": "3 (pt_gloo_runloop) S 1", "4": "4 (pt_gloo (x) y) D 1",
             "5": "5 (gloo_tcp_loop) R 1"}
    for tid, stat in stats.items():
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "stat").write_text(stat)
    (tmp_path / "6").mkdir()  # a thread that ended between the listing and the read
    assert running_workers(str(tmp_path)) == 2
    assert running_workers(str(tmp_path / "missing")) == 0
    assert running_workers() == 0  # this process runs no gloo worker


def test_unknown_parallelism_is_refused(tiny, tmp_path):
    from agl_bridge.trainer.training import GRPOConfig, train_policy
    from tests.factories import transitions

    # refused where the configuration is made, before any model is loaded
    with pytest.raises(ValueError, match="parallelism must be data or fsdp, got 'zero3'"):
        train_policy(transitions([1.0, 0.0]), tiny, tmp_path, progress=False,
                     config=GRPOConfig(parallelism="zero3"))  # type: ignore[arg-type]


def test_later_epochs_clip_against_first_visits_of_any_length(tiny, tmp_path):
    """Completions of different lengths over 2 epochs: each transition's first-visit
    log-probabilities are kept at its own length and padded to a later batch's width (they
    were kept at the first batch's width, and stacking them failed)."""
    import pyarrow as pa

    from agl_bridge.schema import TRANSITION_SCHEMA
    from agl_bridge.trainer.training import GRPOConfig, train_policy

    rows = [{"episode_id": f"e{i}", "task_id": "t", "agent_name": "a",
             "prompt_ids": [257, 40 + i, 258], "completion_ids": list(range(60, 60 + n)),
             "completion_mask": [1] * n, "behaviour_logprobs": None, "reward": r,
             "group_id": "g", "advantage": None, "merged_calls": 1, "retokenized": False}
            for i, (r, n) in enumerate([(1.0, 2), (0.0, 5), (0.5, 3), (0.2, 7), (0.9, 4)])]
    result = train_policy(pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA), tiny, tmp_path,
                          progress=False, config=GRPOConfig(
                              learning_rate=5e-2, per_device_train_batch_size=2,
                              num_train_epochs=2, share_prompts=False))
    assert len(result.metrics) == 6  # 3 micro-batches per epoch
    assert all(m["loss"] == m["loss"] for m in result.metrics)  # finite, not NaN
