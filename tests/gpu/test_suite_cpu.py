"""The GPU suite seen from a machine without a GPU (these tests are not gpu-marked: CI runs them).

* every test under ``tests/gpu`` that needs a GPU is marked ``gpu``: ``-m gpu`` collects them and
  the default run (pyproject's ``-m 'not gpu'``) deselects every one of them, whatever the
  machine, so a CPU-only run never picks one up (nor skips it for a missing import);
* the bfloat16 comparison the GPU test makes works, and its tolerance is not loose: bfloat16 on
  the CPU against float32 on the CPU, the same step, falls inside it, with room;
* ``benchmarks/gpu_bench.py`` (``make bench-gpu``) refuses a machine without CUDA, and its
  summary puts each GPU figure beside its peer and the CPU figure recorded here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.gpu.one_step import TOLERANCE, compare, outside, step
from tests.paths import ROOT

# modules of tests/gpu that run on the CPU (not gpu-marked)
CPU_MODULES = {"test_suite_cpu.py", "test_setup_venv.py"}


def _collect(tmp_path, *args: str) -> dict:
    out = tmp_path / "collected.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "-p", "tests.gpu.collected", *args, "tests/gpu"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "AGL_COLLECTED": str(out)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def _module(test: dict) -> str:
    return test["id"].split("::")[0].rsplit("/", 1)[-1]


def test_gpu_tests_are_collected_with_the_marker_and_deselected_by_default(tmp_path):
    """The default options (pyproject's addopts) on tests/gpu: every GPU test is collected
    (an import error would fail this collection, not hide a test) and deselected."""
    run = _collect(tmp_path)
    selected, deselected = run["selected"], run["deselected"]
    # the suite the issue names: the bf16 step, training, torchrun, vLLM, the demo, the venv
    assert {"test_bf16_step.py", "test_training.py", "test_torchrun.py", "test_vllm.py",
            "test_demo.py", "test_setup_gpu.py"} <= {_module(t) for t in deselected}
    assert len(deselected) >= 16 and all(t["gpu"] for t in deselected), deselected
    # what the default run keeps of tests/gpu: the CPU modules' tests, none gpu-marked
    assert {_module(t) for t in selected} == CPU_MODULES, selected
    assert not any(t["gpu"] for t in selected)


def test_the_bf16_comparison_holds_for_bf16_on_the_cpu(tiny):
    """The same step on the CPU, float32 and bfloat16 (the GPU test's CUDA run stands in the
    second place): inside the stated tolerance, and not trivially (the errors are not zero,
    and a tenth of the tolerance would refuse them: it is not a bound nothing can fail)."""
    ref, ref_info = step(str(tiny), None)
    got, got_info = step(str(tiny), True)
    assert (ref_info["device"], ref_info["dtype"]) == ("cpu", "float32")
    assert (got_info["device"], got_info["dtype"]) == ("cpu", "bfloat16")
    errors = compare(ref, ref_info["nll"], got, got_info["nll"])
    assert not outside(errors), f"past {TOLERANCE}: {errors}"
    assert errors["grad_rel"] > TOLERANCE["grad_rel"] / 10 > 0, errors
    assert errors["logp_abs"] > 0 and errors["grad_cos_min"] < 1.0, errors
    # a wrong gradient is refused: the same gradients negated
    flipped = {k: -v if k.startswith("grad.") else v for k, v in got.items()}
    assert outside(compare(ref, ref_info["nll"], flipped, got_info["nll"]))


def _gpu_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_benchmarks_refuse_a_machine_without_cuda():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--quick"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and "no CUDA device here" in done.stderr, done.stderr[-2000:]


def test_the_gpu_benchmark_summary_puts_each_figure_beside_its_peers():
    """The summary from the JSON the three steps write (train_vs_trl.py's rows,
    publish_latency.py's figures, the demo's state.json), here made up."""
    train = {"rows": [
        {"trainer": "ours", "gradient_checkpointing": False, "tokens_per_s": 9000.0,
         "cuda_peak_mb": 900.0},
        {"trainer": "trl", "gradient_checkpointing": False, "tokens_per_s": 3000.0,
         "cuda_peak_mb": 1800.0},
        {"trainer": "ours", "gradient_checkpointing": True, "tokens_per_s": 6000.0,
         "cuda_peak_mb": 700.0}]}
    serve = {"requests": 128, "tokens_per_s": {"0 adapters": 5000.0, "1 adapter(s)": 4000.0,
                                               "4 adapter(s)": 3500.0},
             "ours": [{"total": t} for t in (0.30, 0.10, 0.20)], "in_place": []}
    demo = {"rounds": [{}], "seconds": {"start vLLM": 60.0, "convert + train": 120.0}}
    text = "\n".join(_gpu_bench().side_by_side(train, serve, demo, "NVIDIA H100"))
    assert "on NVIDIA H100" in text
    assert "9000.0" in text and "3000.0" in text and "3.00x" in text  # ours beside TRL
    assert "900" in text and "1800" in text  # peak CUDA memory of each
    off, on = (line.split() for line in text.splitlines()
               if line.strip().startswith(("off ", "on ")))
    assert off[1:4] == ["9000.0", "3000.0", "3.00x"]
    assert on[1:4] == ["6000.0", "-", "-"]  # TRL's failed run: a dash, not a made-up ratio
    row = next(line for line in text.splitlines() if line.strip().startswith("4 adapter(s)"))
    assert row.split()[-2:] == ["3500.0", "34.3"]  # GPU beside the CPU figure recorded
    assert "ours: new name per version" in text and " 200 " in text  # the median, ms
    assert "1 round(s) in 3.0 min" in text and "27.4 min" in text
    assert "(not run, or failed: see train.log)" in "\n".join(
        _gpu_bench().side_by_side(None, serve, demo, "x"))
