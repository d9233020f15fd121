"""The alias table: what agents ask for (``coder``) -> the adapter version live now (``coder@v7``).

The publisher writes it (atomically: temp file + rename); every agent process reads it through
the OpenAI instrumentor on each call, so a new version goes live for running agents with no code
change. Reading is cheap: one ``os.stat`` per call, and the JSON is parsed again only when the
file's modification time or size changed. ``AGL_BRIDGE_ALIASES`` names the file; unset, nothing
is resolved and nothing is read.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

ALIASES_ENV = "AGL_BRIDGE_ALIASES"


class AliasTable:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._aliases: dict[str, str] = {}
        self._lock = threading.Lock()

    def resolve(self, name: str) -> str | None:
        """The live version for alias ``name``, or None if it is not an alias."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        data = json.loads(self.path.read_text())
                        self._aliases = dict(data.get("aliases", {}))
                        self._stamp = stamp
                    except (OSError, ValueError):
                        return self._aliases.get(name)  # mid-replace or damaged: keep the last
        return self._aliases.get(name)

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"aliases": {}}

    def write(self, aliases: dict[str, str]) -> None:
        """Replace the table atomically: readers see the old or the new one, never a mix."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps({"aliases": aliases, "updated_unix": time.time()}, indent=2))
        os.replace(tmp, self.path)


_default: AliasTable | None = None
_default_path: str | None = None


def default_table() -> AliasTable | None:
    """The table named by ``AGL_BRIDGE_ALIASES``, or None (then agents' model names are used
    as they are)."""
    global _default, _default_path
    path = os.environ.get(ALIASES_ENV)
    if not path:
        return None
    if path != _default_path:
        _default, _default_path = AliasTable(path), path
    return _default
