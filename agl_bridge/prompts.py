"""The prompt table: which version of each agent's system prompt is live (``writer@p3``).

Prompts are published as adapters are (``agl_bridge.trainer.serving.prompts``: versions,
history, rollback, under the registry's lock); the table is what running agents read. With
``AGL_BRIDGE_PROMPTS`` naming it, the openai integration replaces an agent's system message by
the live version's text on the agent's next call (``integrations/openai/prompt_swap.py``);
unset, nothing is read and no message is touched.

The file is ``{"prompts": {"<agent>": {"version": "<agent>@p<N>", "text": "..."}, ...}}``.
Version 0 is the agent's own prompt, as the program wrote it: an entry ``<agent>@p0`` has no
text and swaps nothing (a rollback to p0 is how a team returns to its own prompt). The text is
in the table, not beside it, so an agent reads one file and never a version's name with
another version's text.

The alias table's rules hold (``agl_bridge.aliases.WatchedTable`` reads both): one ``stat``
per call, the file parsed again only when it changed; a table that cannot be used (missing,
unreadable, not JSON, not that shape, a version that is not ``<agent>@p<N>``, a text that is
not a non-empty string) never fails the agent's call: it is reported once per version of the
file, with the path and what is wrong, and the last good table stays in force (or, if there
never was one, no prompt is swapped). A table is taken whole or not at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agl_bridge.aliases import (
    AliasFileError,
    EnvTable,
    HttpAliasTable,
    WatchedTable,
    _kind,
    table_entries,
)

PROMPTS_ENV = "AGL_BRIDGE_PROMPTS"
TABLE_KEY = "prompts"
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class PromptFileError(AliasFileError):
    """The prompt file's content is not a usable table; the message says what is wrong."""


@dataclass(frozen=True)
class LivePrompt:
    """One agent's live prompt: its version (``writer@p3``) and text (None for p0: the
    agent's own prompt, left as it is)."""

    version: str
    text: str | None

    @property
    def number(self) -> int:
        return int(self.version.rsplit("@p", 1)[1])


def version_name(agent: str, number: int) -> str:
    """``writer@p3``: how a prompt version is named in tables, spans and the registry."""
    return f"{agent}@p{number}"


def check_agent(agent: Any) -> str:
    """An agent name usable in the table and as a folder name, or ``PromptFileError``."""
    if not isinstance(agent, str) or not AGENT_NAME.fullmatch(agent):
        raise PromptFileError(f"agent name {agent!r} is not usable: letters, digits, '.', '_' "
                              f"and '-', starting with a letter or digit, at most 128")
    return agent


def parse_prompts(data: Any) -> dict[str, LivePrompt]:
    """The entries of a decoded prompt file, or ``PromptFileError`` saying what is wrong."""
    entries = table_entries(data, TABLE_KEY, PromptFileError)
    out: dict[str, LivePrompt] = {}
    for agent, entry in entries.items():
        check_agent(agent)
        where = f"agent {agent!r}"
        if not isinstance(entry, Mapping):
            raise PromptFileError(f"{where}: the entry is {_kind(entry)}, not an object")
        version, text = entry.get("version"), entry.get("text")
        m = re.fullmatch(rf"{re.escape(agent)}@p(\d+)", version) \
            if isinstance(version, str) else None
        if m is None:
            raise PromptFileError(f"{where}: version {version!r} is not {agent}@p<N>")
        if int(m.group(1)) == 0:
            if text is not None:
                raise PromptFileError(f"{where}: p0 is the agent's own prompt; it has no text")
        elif not (isinstance(text, str) and text.strip()):
            raise PromptFileError(f"{where}: text {repr(text)[:40]} is not a non-empty string")
        out[agent] = LivePrompt(m.group(0), text)
    return out


class _Prompts:
    """What a prompt table adds to an alias table, read from a file or over HTTP: entries
    parsed as prompts, its own words when it is kept, and ``live``."""

    env = PROMPTS_ENV
    noun = "agents"
    idle = "no prompt is swapped until it is fixed (agents keep their own)"

    if TYPE_CHECKING:
        def lookup(self, name: str) -> Any: ...  # the alias table's (after this in the MRO)

    def parse(self, data: Any) -> dict[str, Any]:
        return dict(parse_prompts(data))

    def live(self, agent: str) -> LivePrompt | None:
        """The live prompt of ``agent``, or None when the table has no entry for it."""
        entry = self.lookup(agent)
        return entry if isinstance(entry, LivePrompt) else None


class PromptTable(_Prompts, WatchedTable):
    """One prompt file, re-read when it changes; ``live`` never raises."""

    kind = "prompt file"


class HttpPromptTable(_Prompts, HttpAliasTable):
    """The prompt table served over HTTP (``agl-bridge aliases-serve``: ``GET /prompts``),
    polled as the alias table is: ``live`` reads the last good table and never raises; the
    process's first call waits for the first poll (at most the timeout)."""

    kind = "prompt table"


# the table named by AGL_BRIDGE_PROMPTS, or None (then no prompt is swapped)
default_prompt_table = EnvTable[PromptTable | HttpPromptTable](PROMPTS_ENV, PromptTable,
                                                               HttpPromptTable).get
