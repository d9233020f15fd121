"""What the GPU suite's tests share: a CUDA device that must be there.

The tests here are marked ``gpu`` (each module's ``pytestmark``), so the default run (pyproject's
``-m 'not gpu'``) deselects them and CI never runs them; ``make test-gpu`` selects them. Run on a
machine without CUDA they fail at this fixture, saying so: a GPU suite that skipped itself would
report success having checked nothing.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cuda():
    """The CUDA device the GPU tests run on (``torch.device('cuda', 0)``)."""
    import torch

    assert torch.cuda.is_available(), (
        "the gpu-marked tests need CUDA: torch.cuda.is_available() is False "
        f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    return torch.device("cuda", 0)
