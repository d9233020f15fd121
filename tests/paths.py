"""Paths the suite needs, the same from every folder of tests/: the repository root, tests/
itself (the helper scripts run as subprocesses), tests/agents/ and examples/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
AGENTS = TESTS / "agents"
EXAMPLES = ROOT / "examples"
