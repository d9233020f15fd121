"""OpenLLMetry's OpenAI instrumentation as it was before it wrote ``gen_ai.input.messages``
(0.40.14: one flat ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*`` key per field), in a
venv of its own: it pins opentelemetry-semantic-conventions-ai 0.4.9, and the 0.62 in ours needs
0.5. openai stays below 2, the major version 0.40 was released against."""

import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

VENV = ROOT / ".cache" / "venv-openllmetry-0.40"
PACKAGES = ["opentelemetry-instrumentation-openai==0.40.14", "openai<2", "opentelemetry-sdk",
            "opentelemetry-exporter-otlp-proto-http"]


def build_openllmetry_python() -> Path:
    """The venv's python, built once (kept in ``.cache/``)."""
    python = VENV / "bin" / "python"
    marker = VENV / ".deps-ok-0.40.14"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        deps = subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES],
                              capture_output=True, text=True)
        assert deps.returncode == 0, deps.stdout[-3000:] + deps.stderr[-3000:]
        marker.touch()
    return python
