"""The real MassGen 0.1.97 in a venv of its own (it pins openai 2.2.0), with this tree's wheel:
``tests/conftest.py`` makes it the ``massgen_python`` fixture; ``RUNNER`` runs a MassGen team
in it, against a scripted server whose tool calls ``call`` builds."""

import json
import subprocess
import sys
from pathlib import Path

from tests.paths import AGENTS, ROOT

RUNNER = AGENTS / "massgen_run.py"
VENV = ROOT / ".cache" / "venv-massgen"
MASSGEN = "massgen==0.1.97"
# MassGen asks for langchain-core>=1.0, whose newest release needs a certifi this registry lacks;
# left open, pip backtracks for many minutes. Installed in one step with our OpenTelemetry set it
# backtracks too, so: MassGen first (it brings the SDK, the OTLP exporters and pyarrow), then the
# rest of our core on top of what it chose.
# mcp 2 (2026) dropped the streamablehttp_client that MassGen 0.1.97 imports at start.
FIRST = [MASSGEN, "langchain-core==1.7.2", "mcp<2"]
THEN = ["opentelemetry-instrumentation", "wrapt"]


def build_massgen_python(built_wheel: Path) -> Path:
    """The venv's python: MassGen installed once (kept in ``.cache/``), our wheel every time."""
    python = VENV / "bin" / "python"
    marker = VENV / f".deps-ok-{'-'.join(FIRST).replace('<', 'lt')}"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        for step in (FIRST, THEN):
            deps = subprocess.run([str(python), "-m", "pip", "install", "-q", *step],
                                  capture_output=True, text=True)
            assert deps.returncode == 0, deps.stdout[-3000:] + deps.stderr[-3000:]
        marker.touch()
    ours = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                           "--force-reinstall", str(built_wheel)], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    return python


def call(name, **arguments):
    return {"id": f"call_{name}", "name": name, "arguments": json.dumps(arguments)}
