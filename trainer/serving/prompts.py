"""Prompt versions as published resources, beside the adapter versions of the same registry.

A team that cannot fine-tune (a hosted model) still improves by changing its agents' system
prompts, and a team that can wants to compare and combine both levers; either way a prompt
change must be as safe as an adapter change: versioned, published in one step, rolled back in
one step, its history kept. So prompts live in the registry directory, under the registry's own
lock (``Registry.locked``: one transaction at a time for adapters and prompts alike), with the
same order of writes (the table agents read first, then the history; a kill between the two is
reconciled by the next transaction, as ``registry.py`` explains).

Files, all readable:

* ``prompts/<agent>/p<N>.txt``: the text of version N, written once, never changed;
* ``prompts.json``: the prompt table agents read (``agl_bridge.prompts``; set
  ``AGL_BRIDGE_PROMPTS`` to its path), each agent's live version with its text;
* ``prompt_history.json``: every version of every agent, with its state (``live``, ``retired``,
  ``recorded``: kept but never made live, such as the agent's own prompt p0 as seen in traces),
  its SHA-256, when it was published and a note saying where it came from.

Version 0 is the agent's own prompt; a rollback to p0 leaves the agent's messages untouched.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.prompts import (
    TABLE_KEY,
    PromptFileError,
    check_agent,
    parse_prompts,
    version_name,
)
from agl_bridge.settings import replace_text
from agl_bridge.trainer.serving.errors import PublishError
from agl_bridge.trainer.serving.registry import Registry, encode_history, parse_history, read_json

PROMPTS_FILE = "prompts.json"
PROMPT_HISTORY_FILE = "prompt_history.json"
PROMPTS_DIR = "prompts"
PROMPT_STATES = ("live", "retired", "recorded")


@dataclass
class PromptVersion:
    name: str  # writer@p3
    file: str | None  # relative to the registry: prompts/writer/p3.txt (None: p0 never seen)
    sha256: str | None
    published_unix: float
    state: str = "live"
    retired_unix: float | None = None
    note: str | None = None  # where it came from: a file, an APO run and its score

    @property
    def number(self) -> int:
        return int(self.name.rsplit("@p", 1)[1])


@dataclass
class PromptState:
    """The prompt history and table as read under the lock."""

    history: dict[str, list[PromptVersion]] = field(default_factory=dict)
    live: dict[str, str] = field(default_factory=dict)  # agent -> live version name

    def find(self, agent: str, name: str) -> PromptVersion | None:
        return next((v for v in self.history.get(agent, []) if v.name == name), None)

    def make_live(self, agent: str, version: PromptVersion, now: float) -> None:
        for v in self.history.get(agent, []):
            if v.state == "live" and v is not version:
                v.state, v.retired_unix = "retired", now
        version.state, version.retired_unix = "live", None
        self.live[agent] = version.name


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_version(agent: str, version: str | int) -> str:
    """``p3``, ``3``, ``writer@p3`` -> ``writer@p3``; anything else is a ``PublishError``."""
    m = re.fullmatch(rf"(?:{re.escape(agent)}@)?p?(\d+)", str(version).strip())
    if m is None:
        raise PublishError(f"{version!r} is not a prompt version of {agent!r} (p3, 3 or "
                           f"{agent}@p3)")
    return version_name(agent, int(m.group(1)))


class PromptRegistry:
    """Prompt versions in a registry directory, changed only under the registry's lock."""

    def __init__(self, directory: str | Path) -> None:
        self.registry = Registry(directory)
        self.directory = self.registry.directory
        self.table_path = self.directory / PROMPTS_FILE
        self.history_path = self.directory / PROMPT_HISTORY_FILE

    # -- reading (no lock: each file is replaced atomically) -------------------------------
    def read_history(self) -> dict[str, list[PromptVersion]]:
        return parse_history(
            read_json(self.history_path, {}, "the registry"), self.history_path, PromptVersion,
            lambda agent, e: bool(re.fullmatch(rf"{re.escape(agent)}@p\d+", e["name"]))
            and e.get("state") in PROMPT_STATES, "the prompt history")

    def read_live(self) -> dict[str, str]:
        """Agent -> live version name, from the table agents read."""
        raw = read_json(self.table_path, {TABLE_KEY: {}}, "the registry")
        try:
            entries = parse_prompts(raw)
        except PromptFileError as exc:
            raise PublishError(f"{self.table_path}: {exc}: the prompt table is damaged"
                               ) from None
        return {agent: e.version for agent, e in entries.items()}

    def text(self, agent: str, version: str | int) -> str | None:
        """A version's text; None for p0 when the agent's own prompt was never recorded."""
        name = parse_version(agent, version)
        v = next((v for v in self.read_history().get(agent, []) if v.name == name), None)
        if v is None:
            if name.endswith("@p0"):
                return None
            raise PublishError(f"{name} was never published in {self.directory}")
        return self._text_of(v)

    def diff(self, agent: str, old: str | int, new: str | int) -> str:
        """A unified diff between two versions' texts (p0 unrecorded: empty)."""
        a, b = parse_version(agent, old), parse_version(agent, new)
        return "".join(difflib.unified_diff(
            (self.text(agent, a) or "").splitlines(keepends=True),
            (self.text(agent, b) or "").splitlines(keepends=True), fromfile=a, tofile=b))

    # -- changing ---------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[PromptState]:
        """Lock the registry, read the prompt files, let the caller change them, write back
        what changed (the table first, then the history). Nothing is written if the body
        raises."""
        with self.registry.locked():
            state = PromptState(self.read_history(), self.read_live())
            before = (encode_history(state.history), dict(state.live))
            self._reconcile(state)
            yield state
            if state.live != before[1]:
                self._write_table(state)
            history = encode_history(state.history)
            if history != before[0]:
                replace_text(self.history_path, history)

    def publish(self, agent: str, text: str, *, note: str | None = None) -> PromptVersion:
        """A new version of ``agent``'s prompt, live at once (the one before is retired).

        Text the agent already has live is not published again: the live version is returned.
        """
        agent = self._agent(agent)
        if not isinstance(text, str) or not text.strip():
            raise PublishError(f"the prompt for {agent!r} is empty: nothing to publish")
        now = time.time()
        with self.transaction() as state:
            live = state.find(agent, state.live.get(agent, ""))
            if live is not None and live.sha256 == _sha(text) and live.number > 0:
                return live
            version = self._record(state, agent, self._next(state, agent), text, note, now)
            state.make_live(agent, version, now)
            return version

    def record_original(self, agent: str, text: str, *, note: str | None = None
                        ) -> PromptVersion:
        """Keep the agent's own prompt (as seen in its traces) as p0, if not kept yet; it stays
        what it is (``recorded``, or live after a rollback to p0)."""
        agent = self._agent(agent)
        with self.transaction() as state:
            p0 = state.find(agent, version_name(agent, 0))
            if p0 is not None and p0.file is not None:
                return p0
            if p0 is not None:
                state.history[agent].remove(p0)
            kept = self._record(state, agent, 0, text, note, time.time())
            if p0 is not None and p0.state == "live":
                kept.state = "live"
            else:
                kept.state = "recorded"
            state.history[agent].sort(key=lambda v: v.number)
            return kept

    def rollback(self, agent: str, version: str | int) -> PromptVersion:
        """Make an earlier version live in one step; ``p0`` is the agent's own prompt."""
        agent = self._agent(agent)
        name = parse_version(agent, version)
        now = time.time()
        with self.transaction() as state:
            target = state.find(agent, name)
            if target is None and name.endswith("@p0"):
                target = PromptVersion(name, None, None, now, "recorded",
                                       note="the agent's own prompt")
                state.history.setdefault(agent, []).insert(0, target)
            if target is None:
                known = ", ".join(v.name for v in state.history.get(agent, [])) or "none"
                raise PublishError(f"{name} was never published in {self.directory} "
                                   f"(versions of {agent}: {known})")
            state.make_live(agent, target, now)
            return target

    # -- inside ---------------------------------------------------------------------------
    @staticmethod
    def _agent(agent: str) -> str:
        try:
            return check_agent(agent)
        except PromptFileError as exc:
            raise PublishError(str(exc)) from None

    @staticmethod
    def _next(state: PromptState, agent: str) -> int:
        return max((v.number for v in state.history.get(agent, [])), default=0) + 1

    def _record(self, state: PromptState, agent: str, number: int, text: str,
                note: str | None, now: float) -> PromptVersion:
        rel = Path(PROMPTS_DIR) / agent / f"p{number}.txt"
        path = self.directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, text)
        version = PromptVersion(version_name(agent, number), str(rel), _sha(text), now,
                                "recorded", note=note)
        state.history.setdefault(agent, []).append(version)
        return version

    def _text_of(self, v: PromptVersion) -> str | None:
        if v.file is None:
            return None
        path = self.directory / v.file
        try:
            text = path.read_text()
        except OSError as exc:
            raise PublishError(f"{path}: the text of {v.name} cannot be read "
                               f"({exc.strerror or type(exc).__name__})") from None
        if v.sha256 is not None and _sha(text) != v.sha256:
            raise PublishError(f"{path}: the text of {v.name} changed since it was published "
                               f"(SHA-256 differs); versions are never edited in place")
        return text

    def _write_table(self, state: PromptState) -> None:
        entries: dict[str, dict[str, Any]] = {}
        for agent, name in sorted(state.live.items()):
            v = state.find(agent, name)
            text = self._text_of(v) if v is not None and v.number > 0 else None
            entries[agent] = {"version": name} if text is None else {"version": name,
                                                                     "text": text}
        data = {TABLE_KEY: entries, "updated_unix": time.time()}
        parse_prompts(data)  # a table agents would refuse is refused here first
        replace_text(self.table_path, json.dumps(data, indent=2))

    def _reconcile(self, state: PromptState) -> None:
        """The table (what agents use) is right; the history follows it. A version the table
        names that the history lacks (a publisher killed between the two writes) is taken
        into the history from its file, so its number is never given to another text."""
        now = time.time()
        for agent, name in state.live.items():
            rel = Path(PROMPTS_DIR) / agent / f"p{name.rsplit('@p', 1)[1]}.txt"
            if state.find(agent, name) is None and (self.directory / rel).is_file():
                text = (self.directory / rel).read_text()
                state.history.setdefault(agent, []).append(PromptVersion(
                    name, str(rel), _sha(text), now, "live",
                    note="taken from the table after an interrupted publish"))
                state.history[agent].sort(key=lambda v: v.number)
        for agent, vs in state.history.items():
            for v in vs:
                named = state.live.get(agent) == v.name
                if v.state == "live" and not named:
                    v.state, v.retired_unix = "retired", now
                elif named and v.state != "live":
                    v.state, v.retired_unix = "live", None
