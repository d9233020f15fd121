"""The import contracts of ``[tool.importlinter]`` in pyproject.toml, run by ``make lint``.

Usage: ``.venv/bin/python scripts/check_imports.py [--tree DIR] [CONFIG]``; exits 1 when a
contract is broken and names the imports that break it.

Two things import-linter cannot do alone, done here:

- The root folders ``otel/``, ``integrations/`` and ``trainer/`` install as
  ``agl_bridge.otel``, ``.integrations`` and ``.trainer`` (pyproject's package-dir). grimp, which
  builds import-linter's graph, walks the package's folder, so on the repository (or through the
  editable install, whose finder grimp does not use) it would see ``agl_bridge/`` without them.
  So, as ``scripts/typecheck.sh`` does for mypy, a tree of links laid out as the installed
  package is built in a temporary folder and ``lint-imports`` runs there, with that tree first
  on its path. ``--tree DIR`` checks a tree already laid out (the tests build their own).
- import-linter's ``acyclic_siblings`` contract forbids cycles between the children of a
  package (each with its descendants), which misses a cycle between a package's
  ``__init__`` and one of its own modules. ``AcyclicModulesContract`` (type ``acyclic_modules``,
  registered in pyproject's ``contract_types``) forbids a cycle between any two modules. This
  file is importable as the module ``check_imports`` for that: the runner puts ``scripts/`` on
  ``lint-imports``'s path.

Both see every ``import`` statement, inside functions and under ``TYPE_CHECKING`` too.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent


class AcyclicModulesContract(Contract):
    """No import cycle between any two modules of ``packages`` (their descendants included).

    A strongly connected part of the import graph with more than one module is a cycle; each is
    reported with its modules and one shortest loop through them, line numbers on each import.
    ``ignore_imports`` as in import-linter's own contracts (an ignored import that no longer
    exists is an error, so the list cannot outlive what it excuses).
    """

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.ModuleField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(contract_utils.AlertLevel,
                                                         default=contract_utils.AlertLevel.ERROR)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph, ignore_imports=self.ignore_imports,
            unmatched_alerting=self.unmatched_ignore_imports_alerting)
        names: set[str] = set()
        for package in self.packages:  # type: ignore[attr-defined]
            names.add(package.name)
            names |= graph.find_descendants(package.name)
        edges = {m: sorted(graph.find_modules_directly_imported_by(m) & names)
                 for m in sorted(names)}
        cycles = []
        for component in strongly_connected(edges):
            loop = shortest_loop(edges, component)
            steps = [(a, b, tuple(d["line_number"] for d in
                                  graph.get_import_details(importer=a, imported=b)))
                     for a, b in itertools.pairwise(loop)]
            cycles.append({"modules": sorted(component), "loop": steps})
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles},
                             warnings=list(removal.warnings),
                             ignored_import_count=removal.ignored_import_count)

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle between {', '.join(cycle['modules'])}:")
            for importer, imported, lines in cycle["loop"]:
                where = ", ".join(f"l.{n}" for n in lines)
                output.print_error(f"- {importer} -> {imported} ({where})", bold=False)
            output.new_line()


def strongly_connected(edges: dict[str, list[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def shortest_loop(edges: dict[str, list[str]], component: set[str]) -> list[str]:
    """One shortest loop inside ``component``, through its first module: ``[m, ..., m]``."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in edges[node]:
                if nxt not in component or nxt in came_from:
                    continue
                came_from[nxt] = node
                if nxt == start:
                    loop = [start]
                    while True:
                        loop.append(came_from[loop[-1]])
                        if loop[-1] == start:
                            return loop[::-1]
                following.append(nxt)
        frontier = following
    raise AssertionError(f"no loop through {start}")  # a component always has one


def package_tree(root: Path, dest: Path) -> None:
    """Lay ``root``'s packages out under ``dest`` as they install: links to the real files,
    following ``[tool.setuptools.package-dir]`` (``agl_bridge.otel`` = ``otel``)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    config: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        target = dest.joinpath(*package.split("."))
        if "." not in package:  # a top-level package: a real folder, its entries linked
            target.mkdir(parents=True)
            for entry in (root / folder).iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:  # a subpackage from a folder of its own: one link, in place of any entry there
            if target.is_symlink():
                target.unlink()
            target.symlink_to(root / folder, target_is_directory=True)


def lint_imports(tree: Path, config: Path) -> int:
    """``lint-imports CONFIG`` run in ``tree``, with ``tree`` and this folder first on its path
    (``lint-imports`` puts its working folder first too)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(SCRIPTS)]))
    command = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(command), "--no-cache", "--no-logo", str(config)],
                          cwd=tree, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=ROOT / "pyproject.toml",
                        help="the file holding [tool.importlinter] (default: pyproject.toml)")
    parser.add_argument("--tree", type=Path,
                        help="check this tree as it is (default: the repository's package, "
                             "laid out as it installs)")
    args = parser.parse_args(argv)
    config = args.config.resolve()
    if args.tree is not None:
        return lint_imports(args.tree.resolve(), config)
    with tempfile.TemporaryDirectory(prefix="agl-bridge-imports-") as tmp:
        package_tree(ROOT, Path(tmp))
        return lint_imports(Path(tmp), config)


if __name__ == "__main__":
    sys.exit(main())
