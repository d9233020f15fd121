"""The layout stays findable: docs/layout.md names every product module, and a module's tests
are found from its path (``tests/<its folder>/test_<module>.py``, or a test file importing it).

A product module is every ``.py`` under ``agl_bridge/``, ``otel/``, ``integrations/`` and
``trainer/`` but ``__init__.py``, named by its path from the repository root
(``trainer/loop/engine.py``), as the first column of the tables in docs/layout.md names it.
"""

import ast
import re
from functools import cache

from tests.paths import ROOT, TESTS

# product root folder -> the import name it installs as
PRODUCT = {"agl_bridge": "agl_bridge", "otel": "agl_bridge.otel",
           "integrations": "agl_bridge.integrations", "trainer": "agl_bridge.trainer"}
LAYOUT = ROOT / "docs" / "layout.md"
# a table row whose first cell is a module path: | `trainer/loop/engine.py` | ... |
ROW = re.compile(r"^\|\s*`([\w./-]+\.py)`\s*\|", re.MULTILINE)

# Modules with neither a test file named for them in the mirrored folder nor a test file that
# imports them: 50 of 125 when tests moved into folders mirroring the product (issue 28, item
# 6), 46 of 128 once the settings were declared once, 43 of 130 with tests of the loop's
# state file and of credit assignment. The number may go down (lower it here when it does),
# never up: a new module comes with its tests/<folder>/test_<module>.py, or with a test that
# imports it.
UNTESTED_AT_MOST = 43


def product_modules() -> list[str]:
    """Every product module's path from the repository root, ``__init__.py`` left out."""
    return sorted(path.relative_to(ROOT).as_posix()
                  for root in PRODUCT for path in (ROOT / root).rglob("*.py")
                  if path.name != "__init__.py" and "__pycache__" not in path.parts)


def import_name(module: str) -> str:
    """``trainer/loop/engine.py`` -> ``agl_bridge.trainer.loop.engine``."""
    root, *rest = module.removesuffix(".py").split("/")
    return ".".join([PRODUCT[root], *rest])


@cache
def imported_by_tests() -> frozenset[str]:
    """Every module a test file imports (anywhere in it, functions included): ``import a.b``
    gives ``a.b``; ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (``c`` may be a module)."""
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def untested_modules() -> list[str]:
    """Product modules whose tests cannot be found from their path."""
    untested = []
    for module in product_modules():
        folder, name = module.rsplit("/", 1)
        if (TESTS / folder / f"test_{name}").exists():
            continue
        if import_name(module) not in imported_by_tests():
            untested.append(module)
    return untested


def test_the_layout_page_names_every_module():
    named = set(ROW.findall(LAYOUT.read_text()))
    missing = [m for m in product_modules() if m not in named]
    assert not missing, ("docs/layout.md, 'What lives where', has no row for: "
                         + ", ".join(missing))


def test_the_layout_page_names_no_module_that_is_gone():
    gone = [m for m in sorted(set(ROW.findall(LAYOUT.read_text())))
            if m.split("/", 1)[0] in PRODUCT and not (ROOT / m).is_file()]
    assert not gone, "docs/layout.md names modules that do not exist: " + ", ".join(gone)


def test_modules_without_tests_findable_from_their_path_do_not_grow():
    untested = untested_modules()
    print(f"{len(untested)} of {len(product_modules())} modules have neither "
          "tests/<folder>/test_<module>.py nor a test file importing them:")
    print("\n".join(untested))
    assert len(untested) <= UNTESTED_AT_MOST, (
        f"{len(untested)} modules (at most {UNTESTED_AT_MOST}) have neither "
        "tests/<their folder>/test_<module>.py nor a test file importing them: "
        + ", ".join(untested))


def test_the_helpers_agree_on_a_known_module():
    assert import_name("trainer/loop/engine.py") == "agl_bridge.trainer.loop.engine"
    assert import_name("agl_bridge/scope.py") == "agl_bridge.scope"
    assert "trainer/loop/engine.py" in product_modules()
    assert "agl_bridge.trainer.loop.engine" in imported_by_tests()
