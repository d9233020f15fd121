"""The registry directory: the alias table agents read, the history of published versions, and
the lock that makes every change to them one step, whichever process makes it.

Several publishers (one per trained agent, a rollback from the command line, a collector) share
one registry. Each change is a read-modify-write of ``history.json`` and ``aliases.json``; done
from a copy held in memory, two of them lose each other's entries (the last writer wins). So
every change runs in ``Registry.transaction()``: it takes ``fcntl.flock`` on ``.registry.lock``,
re-reads both files from disk, lets the caller change them, writes them back (each atomically:
temp file + rename) and releases the lock. The lock is held only for that, never while loading
adapters into servers, which takes seconds. A process killed while holding it releases it with
its file descriptor (the kernel drops flock locks of a dead process): the next one proceeds.

Order of writes: the alias table first, then the history. A kill between the two leaves the
alias on the new version with the history one step behind; the next transaction reconciles
(a version the history calls live that the alias no longer names is retired). The other order
could leave agents on a version the history calls retired, and unload it under them.

States of a version: ``loading`` (a publisher or rollback is loading it now; the collector
leaves it alone), ``live`` (the alias names it), ``retired`` (superseded, maybe still serving
requests), ``unloaded`` (removed from the servers; a rollback loads it again).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, cast

from agl_bridge.aliases import AliasTable
from agl_bridge.settings import replace_text
from agl_bridge.trainer.serving.errors import PublishError

ALIASES_FILE = "aliases.json"
HISTORY_FILE = "history.json"
LOCK_FILE = ".registry.lock"
STATES = ("loading", "live", "retired", "unloaded")
V = TypeVar("V")


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold ``flock`` on ``lock_path`` for the body: the one lock of a registry directory, for
    its adapter versions and its prompt versions (``prompts.py``) alike."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock (and so does the kernel if this process dies)


def version_number(name: str) -> int | None:
    """N of a served name ``alias@vN`` (or ``alias@vN-<digest>``, the name a version gets where
    another registry's adapter holds ``alias@vN``); None for any other name."""
    m = re.fullmatch(r".+@v(\d+)(?:-[0-9a-f]{8})?", name)
    return int(m.group(1)) if m else None


@dataclass
class Version:
    name: str
    directory: str
    published_unix: float
    state: str = "live"
    retired_unix: float | None = None  # when it stopped being live (the drain clock)
    pinned_unix: float | None = None  # when a publisher or rollback started loading it


@dataclass
class State:
    """The registry as read under the lock; a transaction writes back what it changes."""

    history: dict[str, list[Version]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def find(self, alias: str, name: str) -> Version | None:
        return next((v for v in self.history.get(alias, []) if v.name == name), None)

    def versions(self) -> Iterator[Version]:
        for vs in self.history.values():
            yield from vs

    def make_live(self, alias: str, version: Version, now: float) -> None:
        """Switch ``alias`` to ``version``; the version live before it is retired."""
        for v in self.history.get(alias, []):
            if v.state == "live" and v is not version:
                v.state, v.retired_unix = "retired", now
        version.state, version.retired_unix, version.pinned_unix = "live", None, None
        self.aliases[alias] = version.name


def read_json(path: Path, missing: Any, what: str) -> Any:
    """A registry file as JSON, ``missing`` if there is none; not JSON: ``what`` is damaged."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return missing
    try:
        return json.loads(text)
    except ValueError as exc:
        raise PublishError(f"{path}: not valid JSON ({exc}): {what} is damaged") from None


def parse_history(raw: Any, path: Path, make: type[V], entry_ok: Callable[[str, dict], bool],
                  what: str) -> dict[str, list[V]]:
    """A history file (name -> its versions, each a ``make`` dataclass) as read; an entry
    with a string ``name`` that ``entry_ok`` accepts, or ``what`` is damaged."""
    if not isinstance(raw, dict):
        raise PublishError(f"{path}: not a JSON object: {what} is damaged")
    names = {f.name for f in fields(cast(Any, make))}
    out: dict[str, list[V]] = {}
    for key, entries in raw.items():
        if not isinstance(entries, list):
            raise PublishError(f"{path}: {key!r} is not a list of versions")
        out[key] = []
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or \
                    not entry_ok(key, e):
                raise PublishError(f"{path}: {key!r} has a damaged entry {str(e)[:200]}")
            out[key].append(make(**{k: v for k, v in e.items() if k in names}))
    return out


def encode_history(history: Mapping[str, list[Any]]) -> str:
    return json.dumps({a: [asdict(v) for v in vs] for a, vs in history.items()}, indent=2)


class Registry:
    """``history.json`` + ``aliases.json`` in ``directory``, changed only under its lock."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.table = AliasTable(self.directory / ALIASES_FILE)
        self.history_path = self.directory / HISTORY_FILE
        self.lock_path = self.directory / LOCK_FILE

    def read_history(self) -> dict[str, list[Version]]:
        """The history as last written (no lock: each file is replaced atomically)."""
        what = "the registry's history"
        return parse_history(read_json(self.history_path, {}, what), self.history_path, Version,
                             lambda _, e: isinstance(e.get("directory"), str)
                             and e.get("state") in STATES, what)

    def read_aliases(self) -> dict[str, str]:
        try:
            raw = self.table.read()
        except ValueError as exc:
            raise PublishError(f"{self.table.path}: not valid JSON ({exc})") from None
        aliases = raw.get("aliases", {}) if isinstance(raw, dict) else None
        if not isinstance(aliases, dict):
            raise PublishError(f"{self.table.path}: no alias object: the alias table is "
                               f"damaged")
        return dict(aliases)

    def locked(self) -> AbstractContextManager[None]:
        """The registry's lock, held for one transaction (adapters' or prompts')."""
        return locked(self.lock_path)

    @contextmanager
    def transaction(self) -> Iterator[State]:
        """Lock, read both files from disk, let the caller change them, write back what
        changed. Nothing is written if the body raises."""
        with self.locked():
            state = State(self.read_history(), self.read_aliases())
            before = (encode_history(state.history), dict(state.aliases))
            self._reconcile(state)  # written back with the caller's changes
            yield state
            if state.aliases != before[1]:
                self.table.write(state.aliases)
            history = encode_history(state.history)
            if history != before[0]:
                replace_text(self.history_path, history)

    @staticmethod
    def _reconcile(state: State) -> None:
        """After a kill between the two writes the alias table (what agents use) is right and
        the history a step behind: the version the alias names is live, any other the history
        calls live is retired. Otherwise the collector could unload the version agents use."""
        now = time.time()
        for alias, vs in state.history.items():
            for v in vs:
                named = state.aliases.get(alias) == v.name
                if v.state == "live" and not named:
                    v.state, v.retired_unix = "retired", now
                elif named and v.state != "live":
                    v.state, v.retired_unix, v.pinned_unix = "live", None, None
