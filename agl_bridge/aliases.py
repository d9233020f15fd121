"""The alias table: what agents ask for (``coder``) -> the adapter version live now (``coder@v7``).

The publisher writes it (atomically: temp file + rename); every agent process reads it on each
call through alias routing on the OpenAI client
(``agl_bridge.integrations.openai.enable_routing``; the OpenAI instrumentor turns it on), so
a new version goes live for running agents with no code change. Reading is cheap: one
``os.stat`` per call, and the file is parsed again only when it changed (inode,
modification time or size). ``AGL_BRIDGE_ALIASES`` names the file; unset, nothing is resolved
and nothing is read.

Agents on several hosts read one table: a path on a filesystem they all mount, or an
``http(s)://`` URL that the publisher's host serves (``agl-bridge aliases serve``;
``trainer/serving/alias_server.py``). A URL is polled by a background thread every
``AGL_BRIDGE_ALIASES_POLL_S`` seconds (default 1) with a conditional GET (ETag), so a call never
waits on the network; a new table reaches an agent within the poll interval plus the request's
time (a connection that fails is tried once more at once; two failures in a row wait for the
next poll, with the last good table). The publisher retires a superseded version only after
its drain time (``drain_s``, 5 s), which must exceed that: a call that resolved the old version
still finds it loaded.

The file is ``{"aliases": {"<alias>": "<served model name>", ...}}``. It is read inside the
agent's own ``create()`` call, so a file that cannot be used (missing, unreadable, not JSON, not
that shape, or an alias mapped to anything but a non-empty string) must never fail that call:
it is reported once, as a warning naming the path and what is wrong, and the last good table is
kept (or, if there never was one, no alias is routed). A table is taken whole or not at all,
because the publisher writes it whole: half of a damaged table could send one team's agents to
adapters of different generations.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

ALIASES_ENV = "AGL_BRIDGE_ALIASES"
POLL_ENV = "AGL_BRIDGE_ALIASES_POLL_S"
ROUTE_BY_ENV = "AGL_BRIDGE_ROUTE_BY"  # "agent": by the calling agent's name (openai/routing.py)
DEFAULT_POLL_S = 1.0
RETRY_S = 0.05  # a poll whose connection failed is tried again after this, once

logger = logging.getLogger(__name__)
T = TypeVar("T")


class AliasFileError(ValueError):
    """The alias file's content is not a usable table; the message says what is wrong."""


def table_entries(data: Any, key: str, error: type[AliasFileError]) -> Mapping[Any, Any]:
    """The ``key`` object of a decoded table file (aliases, prompts), or ``error`` saying what
    is wrong."""
    if not isinstance(data, Mapping):
        raise error(f"the top level is {_kind(data)}, not an object")
    if key not in data:
        raise error(f'it has no "{key}" key')
    entries = data[key]
    if not isinstance(entries, Mapping):
        raise error(f'"{key}" is {_kind(entries)}, not an object')
    return entries


def parse_aliases(data: Any) -> dict[str, str]:
    """The ``aliases`` mapping of a decoded alias file, or ``AliasFileError`` saying what is wrong.

    Only a non-empty string routes: anything else sent as ``model`` would be a request the
    server cannot answer, made on the agent's behalf.
    """
    aliases = table_entries(data, "aliases", AliasFileError)
    bad = [f"{alias!r} -> {target!r}" for alias, target in aliases.items()
           if not (isinstance(alias, str) and alias and isinstance(target, str) and target)]
    if bad:
        raise AliasFileError("only non-empty strings can be aliases and targets; bad: "
                             + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))
    return dict(aliases)


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


class _Table:
    """What a table agents read has, from a file or over HTTP: how warnings name it (``kind``,
    ``env``), its ``parse`` (raising ``AliasFileError`` with what is wrong), what an agent does
    while it is unusable (``kept``: ``noun`` and ``idle`` say it) and ``resolve``. The prompt
    table (``agl_bridge.prompts``) is these with other words and another ``parse``."""

    kind = "alias file"
    env = ALIASES_ENV
    noun = "aliases"
    idle = "no alias is routed until it is fixed (model names are sent as they are)"
    _aliases: dict[str, Any] | None = None  # the last good table; None: never one

    if TYPE_CHECKING:
        def lookup(self, name: str) -> Any: ...

    def parse(self, data: Any) -> dict[str, Any]:
        return parse_aliases(data)

    def kept(self) -> str:
        """What an agent does while its table is unusable."""
        table = self._aliases
        return (f"keeping the table read before ({len(table)} {self.noun})" if table is not None
                else self.idle)

    def resolve(self, name: str) -> str | None:
        """The live version for alias ``name``, or None if it is not an alias."""
        live = self.lookup(name)
        return live if isinstance(live, str) else None


class WatchedTable(_Table):
    """A JSON table in a file, re-read when the file changes; ``lookup`` never raises: one
    ``stat`` per call, parsed again only when the file changed, a file that cannot be used
    reported once per version and the last good table kept."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[Any, ...] | None = None  # the file version read last, good or bad
        self._unusable = False  # the version read last was rejected
        self._lock = threading.Lock()

    def lookup(self, name: str) -> Any:
        """The table's entry for ``name``, or None."""
        if not isinstance(name, str):
            return None
        stamp = self._stat()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._load(stamp)
        aliases = self._aliases
        return aliases.get(name) if aliases else None

    def _stat(self) -> tuple[Any, ...]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return ("unreadable", exc.errno)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self, stamp: tuple[Any, ...]) -> None:
        """Read the file version ``stamp`` once; keep the last good table if it is unusable."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # the version actually read
                raw = f.read()
            aliases = self.parse(json.loads(raw))
        except FileNotFoundError:
            self._reject(stamp, "the file does not exist")
        except OSError as exc:
            self._reject(stamp, f"it cannot be read ({exc.strerror or type(exc).__name__})")
        except AliasFileError as exc:
            self._reject(stamp, str(exc))
        except (ValueError, RecursionError) as exc:  # not UTF-8/JSON, or nested beyond reason
            self._reject(stamp, f"it is not valid JSON ({type(exc).__name__})")
        else:
            if self._unusable:
                logger.info("agl_bridge: %s %s is usable again", self.kind, self.path)
            self._aliases, self._stamp, self._unusable = aliases, stamp, False

    def _reject(self, stamp: tuple[Any, ...], what: str) -> None:
        self._stamp, self._unusable = stamp, True  # reported once per file version
        logger.warning("agl_bridge: %s %s (%s) is not usable: %s; %s",
                       self.kind, self.path, self.env, what, self.kept())


class AliasTable(WatchedTable):
    """One alias file, re-read when it changes; ``resolve`` never raises."""

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"aliases": {}}

    def write(self, aliases: dict[str, str]) -> None:
        """Replace the table atomically: readers see the old or the new one, never a mix.

        A table agents would refuse is refused here first (``AliasFileError``).
        """
        parse_aliases({"aliases": aliases})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps({"aliases": aliases, "updated_unix": time.time()}, indent=2))
        os.replace(tmp, self.path)


class HttpAliasTable(_Table):
    """An alias table served over HTTP, polled in a daemon thread; ``resolve`` reads the last
    good table and never raises or waits. A poll that fails or returns an unusable table is
    reported once per kind of failure and changes nothing (the last good table stays).
    The prompt table over HTTP is this poller with another ``parse`` (``agl_bridge.prompts``).
    """

    kind = "alias table"

    def __init__(self, url: str, poll_s: float = DEFAULT_POLL_S, timeout_s: float = 5.0
                 ) -> None:
        if not poll_s > 0:
            raise ValueError(f"the poll interval must be positive, got {poll_s}")
        self.url, self.poll_s, self.timeout_s = url, poll_s, timeout_s
        self._etag: str | None = None
        self._problem: str | None = None  # the failure reported last (once per kind)
        self._fetched = threading.Event()  # the first poll is done, good or bad
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agl-bridge-aliases",
                                        daemon=True)
        self._thread.start()

    def lookup(self, name: str) -> Any:
        """The last good table's entry for ``name`` (None when it has none)."""
        if not isinstance(name, str):
            return None
        if not self._fetched.is_set():  # the process's first calls: wait for the first poll
            self._fetched.wait(self.timeout_s)
        aliases = self._aliases
        return aliases.get(name) if aliases else None

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._fetched.set()
            self._stop.wait(self.poll_s)

    def poll(self) -> None:
        """One conditional GET; the table changes only on a usable 200.

        A connection that fails (reset, refused, timed out) is tried once more at once: a
        loaded server or network drops the odd connection, and waiting a whole poll interval
        for the next try would delay a switch by that much (and warn of a blip that passed).
        """
        for attempt in (0, 1):
            try:
                self._fetch()
            except OSError as exc:  # refused, reset, unreachable, timed out (not an answer)
                if attempt == 0:
                    if self._stop.wait(RETRY_S):
                        return  # closed meanwhile
                    continue
                self._report(f"it cannot be reached ({type(exc).__name__})")
            return

    def _fetch(self) -> None:
        """One GET; raises ``OSError`` only when no answer came."""
        import urllib.error
        import urllib.request

        headers = {"If-None-Match": self._etag} if self._etag else {}
        try:
            req = urllib.request.Request(self.url, headers=headers)
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw, etag = r.read(), r.headers.get("ETag")
            aliases = self.parse(json.loads(raw))
        except urllib.error.HTTPError as exc:
            if exc.code != 304:  # 304: not modified
                self._report(f"it answered HTTP {exc.code}")
            return
        except AliasFileError as exc:
            self._report(str(exc))
            return
        except (ValueError, RecursionError) as exc:
            self._report(f"it is not valid JSON ({type(exc).__name__})")
            return
        if self._problem is not None:
            logger.info("agl_bridge: %s %s is usable again", self.kind, self.url)
        self._aliases, self._etag, self._problem = aliases, etag, None

    def _report(self, what: str) -> None:
        if what == self._problem:
            return
        self._problem = what
        logger.warning("agl_bridge: %s %s (%s) is not usable: %s; %s",
                       self.kind, self.url, self.env, what, self.kept())


def _poll_s() -> float:
    raw = os.environ.get(POLL_ENV)
    try:
        value = float(raw) if raw else DEFAULT_POLL_S
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        logger.warning("agl_bridge: %s=%r is not a positive number of seconds; using %s",
                       POLL_ENV, raw, DEFAULT_POLL_S)
        return DEFAULT_POLL_S
    return value


class EnvTable(Generic[T]):
    """The table an environment variable names (a path, or an ``http(s)://`` URL polled every
    ``AGL_BRIDGE_ALIASES_POLL_S``), made again when the variable changes: a poller it replaces
    is stopped. ``get`` gives None while the variable is unset."""

    def __init__(self, env: str, from_file: Callable[[str], T],
                 from_url: Callable[[str, float], T]) -> None:
        self.env, self.from_file, self.from_url = env, from_file, from_url
        self._path: str | None = None
        self._table: T | None = None
        self._lock = threading.Lock()  # one poller per process, however many threads ask first

    def get(self) -> T | None:
        path = os.environ.get(self.env) or None
        if path != self._path:
            with self._lock:
                if path != self._path:
                    old = self._table
                    self._table = None if path is None else (
                        self.from_url(path, _poll_s())
                        if path.startswith(("http://", "https://")) else self.from_file(path))
                    self._path = path
                    if isinstance(old, HttpAliasTable):
                        old.close()
        return self._table


# the table named by AGL_BRIDGE_ALIASES, or None (then agents' model names are used as they
# are); read on every call, so a bound method rather than a function around it
default_table = EnvTable[AliasTable | HttpAliasTable](ALIASES_ENV, AliasTable,
                                                        HttpAliasTable).get
