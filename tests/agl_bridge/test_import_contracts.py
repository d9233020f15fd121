"""The import contracts (pyproject's ``[tool.importlinter]``, run by ``make lint`` through
``scripts/check_imports.py``): the tree keeps them, and the checker does fail on a cycle, both in
this package laid out as it installs and in a small package of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import importlinter  # noqa: F401 - the dev extra's: a missing checker fails here, never skips
import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "scripts" / "check_imports.py"


def check_imports(*args: str | Path) -> tuple[int, str]:
    """``scripts/check_imports.py ARGS``: its exit status and its output, whitespace collapsed
    (import-linter wraps long lines)."""
    result = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                            capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    return result.returncode, " ".join((result.stdout + result.stderr).split())


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_keeps_its_import_contracts():
    status, out = check_imports()
    assert status == 0, out
    # the trainer's own contract ran: the tree the checker read holds agl_bridge.trainer
    assert "agl_bridge.trainer: loop > training, serving, judging, models > conversion > " \
           "rewards KEPT" in out
    assert "0 broken" in out


def test_a_cycle_added_to_the_package_fails_naming_it(tmp_path):
    """semconv, which schema imports, imports schema back inside a function: both cycle
    contracts break and name the two imports; the modules sit in one layer, so nothing else
    would catch it."""
    tree = tmp_path / "tree"
    checker().package_tree(ROOT, tree)
    semconv = tree / "agl_bridge" / "semconv.py"
    text = semconv.read_text()
    semconv.unlink()  # a link to the real file: replaced by an edited copy
    semconv.write_text(text + "\n\ndef _cycle():\n    from agl_bridge import schema\n\n"
                       "    return schema\n")

    status, out = check_imports("--tree", tree, ROOT / "pyproject.toml")

    assert status == 1
    assert "no import cycle between any two modules BROKEN" in out
    assert "Import cycle between agl_bridge.schema, agl_bridge.semconv:" in out
    assert "- agl_bridge.schema -> agl_bridge.semconv (l." in out
    assert "- agl_bridge.semconv -> agl_bridge.schema (l." in out
    assert "no import cycle between the children of any package BROKEN" in out


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def cycle_contracts_config(path: Path, package: str) -> Path:
    """pyproject's own cycle contracts (and contract types), for ``package``, without the
    imports they excuse."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = [c for c in options["contracts"]
                 if c["type"] in ("acyclic_modules", "acyclic_siblings")]
    assert len(contracts) == 2

    def value(v: object) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        assert isinstance(v, str)
        return '"' + v.replace("agl_bridge", package) + '"'

    lines = ["[tool.importlinter]", f'root_package = "{package}"',
             f"contract_types = {value(options['contract_types'])}"]
    for contract in contracts:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{key} = {value(v)}" for key, v in contract.items()
                  if key != "ignore_imports"]  # those name this package's modules
    path.write_text("\n".join(lines) + "\n")
    return path


ACYCLIC = {
    "cyc/__init__.py": "",
    "cyc/a.py": "from cyc import b\n",
    "cyc/b.py": "X = 1\n",
    "cyc/sub/__init__.py": "from cyc.sub.child import Y\n",
    "cyc/sub/child.py": "from cyc import b\n\nY = b.X\n",
}


@pytest.mark.parametrize("name, edit, named", [
    # a cycle closed inside a function (the lazy import that hides most cycles)
    ("in a function", {"cyc/b.py": "X = 1\n\n\ndef f():\n    from cyc import a\n\n    return a\n"},
     ["- cyc.a -> cyc.b (l.1)", "- cyc.b -> cyc.a (l.5)"]),
    # a cycle only for the type checker still ties the two modules together
    ("under TYPE_CHECKING", {"cyc/b.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:"
                                         "\n    from cyc import a\nX = 1\n"},
     ["- cyc.b -> cyc.a (l.4)"]),
    # a package's __init__ and its own module: between no two siblings, so acyclic_siblings
    # misses it; acyclic_modules does not
    ("a package and its module", {"cyc/sub/child.py": "from cyc import b\n\nY = b.X\n\n\n"
                                                      "def g():\n    from cyc.sub import Y\n\n"
                                                      "    return Y\n"},
     ["- cyc.sub -> cyc.sub.child (l.1)", "- cyc.sub.child -> cyc.sub (l.7)"]),
])
def test_the_cycle_contracts_fail_on_each_kind_of_cycle(tmp_path, name, edit, named):
    config = cycle_contracts_config(tmp_path / "pyproject.toml", "cyc")
    write_package(tmp_path / "tree", ACYCLIC)
    status, out = check_imports("--tree", tmp_path / "tree", config)
    assert status == 0 and "2 kept, 0 broken" in out, out

    write_package(tmp_path / "tree", edit)
    status, out = check_imports("--tree", tmp_path / "tree", config)
    assert status == 1, out
    assert "no import cycle between any two modules BROKEN" in out
    for step in named:
        assert step in out, out
