"""Run a function when a module is first imported (a post-import hook), with the standard
library only.

Zero-code capture turns each instrumentor on when its framework is imported, so a program that
never imports openai never pays for it. ``wrapt.register_post_import_hook`` does this too, but
importing wrapt imports asyncio, and both would be paid by every ``AGL_BRIDGE_AUTO=1`` process
at start-up (benchmarks/startup_hook.py). Here: one ``sys.meta_path`` finder that, for a
watched top-level module, lets the regular finders find it and wraps the loader so the hooks run
right after the module has executed. A hook that raises is reported and does not fail the
user's import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.RLock()
_finding: set[str] = set()  # names this finder is resolving (its own find_spec call)


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once the top-level module ``name`` is imported: now, if it
    already is."""
    if "." in name:
        raise ValueError(f"post-import hooks watch top-level modules, not {name!r}")
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    _run(name, [hook], module)


def _run(name: str, hooks: Sequence[Hook], module: ModuleType) -> None:
    for hook in hooks:
        try:
            hook(module)
        except Exception as exc:  # capture must never break the user's import
            sys.stderr.write(f"agl-bridge: post-import hook for {name} failed: "
                             f"{type(exc).__name__}: {exc}\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        with _lock:
            if fullname not in _hooks or fullname in _finding:
                return None
            _finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders, as Python would
        finally:
            with _lock:
                _finding.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, then the hooks; everything else delegated to it."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader (importlib.resources and pkgutil read it)
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self._name, [])
        _run(self._name, hooks, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)
