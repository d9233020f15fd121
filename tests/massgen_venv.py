"""The real MassGen 0.1.97 in a venv of its own (it pins openai 2.2.0), with this tree's wheel:
``tests/conftest.py`` makes it the ``massgen_python`` fixture; ``RUNNER`` runs a MassGen team
in it, against a scripted server whose tool calls ``call`` builds."""

import json
from pathlib import Path

from agl_bridge.trainer.loop.teams import massgen_env
from tests.paths import AGENTS, ROOT

RUNNER = AGENTS / "massgen_run.py"
VENV = ROOT / ".cache" / "venv-massgen"


def build_massgen_python(built_wheel: Path) -> Path:
    """The venv's python (``massgen_env``, the demo's builder): MassGen installed once (kept in
    ``.cache/``), our wheel every time."""
    return massgen_env.build_massgen_python(built_wheel, VENV)


def call(name, **arguments):
    return {"id": f"call_{name}", "name": name, "arguments": json.dumps(arguments)}
