"""Publishing adapter versions into running vLLM servers, behind aliases agents ask for.

``Publisher.publish(adapter_dir, alias="coder")``:

1. **validate** before any server or agent sees it (``validation``: the files, the config's
   types, the safetensors header, the rank of every LoRA pair from its tensors, the fit to the
   base model);
2. **record** it in the registry as ``loading`` (so a collector leaves it alone, and a
   publisher killed from here on leaves a trace the collector cleans up);
3. **load** it into every configured server under its own name (``coder@v7``) from its own
   directory, never reloading a name in place (vLLM issues 33791 and 42125: an in-place reload
   re-reads the adapter on later requests and can serve stale prefix cache), and **probe** each;
4. **switch** the alias in the alias table (``agl_bridge.aliases``), under the registry's lock
   with history and aliases re-read from disk (``registry``): the agents' next calls use the
   new version. Versions of one alias go live in version order: a publish of a version older
   than the live one is recorded (loaded, probed, in the history, ready for ``rollback``) but
   does not move the alias back. So concurrent publishers end where a sequential run would,
   whichever finishes first, and nothing they publish is lost;
5. **unload** superseded versions once no request uses them: a server's own metrics
   (``vllm:lora_requests_info``, running and waiting adapters) say when.

``rollback(alias, version)`` is the one way an alias goes back: it makes an earlier version
live again (loading it again if it was unloaded, and probing it either way).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.trainer.adapters import version_of
from agl_bridge.trainer.serving.errors import NameTaken, PublishError
from agl_bridge.trainer.serving.registry import (
    ALIASES_FILE,
    HISTORY_FILE,
    Registry,
    State,
    Version,
    version_number,
)
from agl_bridge.trainer.serving.validation import validate_adapter

__all__ = ["ALIASES_FILE", "HISTORY_FILE", "PublishError", "Publisher", "Version",
           "free_name", "load_and_probe", "publish_adapter", "served_name",
           "validate_adapter"]

def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")


def served_name(adapter_dir: str | os.PathLike[str], alias: str | None = None) -> str:
    """``<alias or adapter name>@v<N>`` from a versioned adapter directory ``.../<name>/v000N``."""
    d = Path(adapter_dir).resolve()
    number = version_of(d)
    if number is None:
        raise PublishError(f"{d}: not a versioned adapter directory (expected .../<name>/vN)")
    return f"{alias or d.parent.name}@v{number}"


def adapter_digest(directory: Path) -> str:
    """The first 16 hex digits of a SHA-256 over the adapter's config and weights."""
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        h.update(name.encode() + b"\0")
        try:
            with open(directory / name, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except FileNotFoundError:
            h.update(b"-")
    return h.hexdigest()[:16]


CONTENT_LINKS = ".loaded"  # beside a registry's versions: links named for their content
_DIGEST = re.compile(r"-([0-9a-f]{16})$")


def content_path(directory: Path) -> tuple[Path, str]:
    """(the path to load ``directory`` from, its digest). The path is a link
    ``<parent>/.loaded/<vN>-<digest>`` to it: a server records the path it loaded (``root`` in
    ``/v1/models``), so the link's name says later which weights it holds, even after the
    directory was written again in place (``loop --fresh``) or another copy was published. A
    parent that cannot take the link: the directory itself."""
    digest = adapter_digest(directory)
    link = directory.parent / CONTENT_LINKS / f"{directory.name}-{digest}"
    try:
        if os.readlink(link) == str(directory):
            return link, digest
    except OSError:
        pass
    try:
        link.parent.mkdir(exist_ok=True)
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(directory)
        os.replace(tmp, link)
        return link, digest
    except OSError:
        return directory, digest


def _same_adapter(held: str, directory: Path, digest: str) -> bool:
    """Whether a server's copy, loaded from ``held``, has ``directory``'s weights: by the
    digest in a content link's name; else (loaded by another tool) by the content there now."""
    found = _DIGEST.search(Path(held).name)
    if found:
        return found.group(1) == digest
    try:
        return Path(held).resolve() == directory or adapter_digest(Path(held)) == digest
    except OSError:
        return False


def _earlier_copy(held: str, directory: Path) -> bool:
    """Whether ``held`` is a content link of ``directory`` itself (its weights before it was
    written again): the server's copy under the name is this directory's to replace."""
    return Path(held).parent.parent == directory.parent and \
        Path(held).name.startswith(f"{directory.name}-")


def free_name(servers: list[str], name: str, directory: Path, timeout_s: float = 10.0) -> str:
    """``name``, or, where a server already serves another adapter under it (another registry
    or run on the same server), the name with this adapter's digest, ``coder@v3-1a2b3c4d``: two
    registries never share a served name, and the plain one stays where it is free."""
    directory = directory.resolve()
    digest = adapter_digest(directory)
    for server in servers:
        held = (served_models(server, timeout_s) or {}).get(name)
        if held and not _same_adapter(held, directory, digest) and \
                not _earlier_copy(held, directory):
            return f"{name}-{digest[:8]}"
    return name


def load_and_probe(servers: list[str], name: str, directory: Path, timeout_s: float = 60.0
                   ) -> None:
    """Load ``directory`` as ``name`` into every server, and check each answers a request to it.
    A server that is down or answers garbage is a PublishError naming it, like a refusal.
    "Already loaded" is success only when the server's copy is this adapter (its content
    digest); an older copy of this same directory (written again since) is unloaded and this
    one loaded; another directory's is ``NameTaken``."""
    directory = directory.resolve()
    path, digest = content_path(directory)
    for server in servers:
        root = _root(server)
        try:
            status, text = _post(f"{root}/v1/load_lora_adapter",
                                 {"lora_name": name, "lora_path": str(path)}, timeout_s)
            if status != 200 and "already" not in text.lower():
                raise PublishError(f"{root} refused adapter {name} from {directory}: "
                                   f"HTTP {status}: {text.strip()[:500]}")
            if status != 200:  # "already loaded": success only if it is this adapter
                held = (served_models(server, timeout_s) or {}).get(name)
                if held and not _same_adapter(held, directory, digest):
                    if not _earlier_copy(held, directory):
                        raise NameTaken(
                            f"{root} already serves {name} from {held}, not {directory}: a "
                            f"server keeps the weights it loaded first under a name. Unload it "
                            f"there (POST {root}/v1/unload_lora_adapter) or publish with "
                            f"another registry or run")
                    # this directory's earlier weights (written again since): replace them
                    _post(f"{root}/v1/unload_lora_adapter", {"lora_name": name}, timeout_s)
                    status, text = _post(f"{root}/v1/load_lora_adapter",
                                         {"lora_name": name, "lora_path": str(path)},
                                         timeout_s)
                    if status != 200:
                        raise PublishError(f"{root} refused adapter {name} from {directory}: "
                                           f"HTTP {status}: {text.strip()[:500]}")
            status, text = _post(f"{root}/v1/chat/completions", {
                "model": name, "max_tokens": 1,
                "messages": [{"role": "user", "content": "ping"}]}, timeout_s)
            answered = json.loads(text).get("model") if status == 200 else None
        except (OSError, ValueError, AttributeError) as exc:
            raise PublishError(f"{root} did not take adapter {name}: {exc}") from None
        if answered != name:
            raise PublishError(f"adapter {name} loaded into {root} but the probe request "
                               f"failed: HTTP {status}: {text.strip()[:500]}")


def served_models(server: str, timeout_s: float = 10.0) -> dict[str, str] | None:
    """What a server serves now (``GET /v1/models``): name -> the path it was loaded from
    (vLLM's ``root``); None when the server cannot be asked."""
    try:
        with urllib.request.urlopen(f"{_root(server)}/v1/models", timeout=timeout_s) as r:
            data = json.loads(r.read())
        return {m["id"]: str(m.get("root") or "") for m in data["data"]
                if isinstance(m, dict) and isinstance(m.get("id"), str)}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _unload(servers: list[str], name: str, timeout_s: float) -> bool:
    """Unload ``name`` from every server; True when none still has it (one that never had it,
    or no longer has it, counts as done)."""
    done = True
    for server in servers:
        try:
            status, _ = _post(f"{_root(server)}/v1/unload_lora_adapter", {"lora_name": name},
                              timeout_s)
        except OSError:
            done = False  # down or slow: try again at the next collection
            continue
        done = done and status in (200, 404)
    return done


# -- the publisher ---------------------------------------------------------------------------
@dataclass
class Publisher:
    """Loads adapter versions into ``servers`` and keeps the alias table of ``registry``.

    Holds no state of its own between calls: every decision is taken from the registry's files
    under its lock, so any number of publishers (threads or processes) can share a registry."""

    servers: list[str]
    registry: Path
    base_model: str | os.PathLike[str] | None = None
    max_lora_rank: int | None = None
    timeout_s: float = 60.0
    # A client may have resolved the old version just before the switch, its request not yet
    # at the server (where metrics would show it): retired versions wait this long first.
    drain_s: float = 5.0
    # A version left ``loading`` this long is from a publisher that died mid-load: the
    # collector unloads it. None: an hour, or twice the longest a load and probe may take.
    stale_loading_s: float | None = None

    def __post_init__(self) -> None:
        self.registry = Path(self.registry)
        self.store = Registry(self.registry)
        self.table = self.store.table
        if self.stale_loading_s is None:
            self.stale_loading_s = max(3600.0, 4 * self.timeout_s * max(1, len(self.servers)))

    @property
    def history(self) -> dict[str, list[Version]]:
        """The history as on disk now (a snapshot; changes go through the registry)."""
        return self.store.read_history()

    def live(self, alias: str) -> str | None:
        return self.store.read_aliases().get(alias)

    def _pin(self, alias: str, name: str, directory: Path | None) -> Path:
        """Record ``name`` as ``loading`` before loading it anywhere: the collector leaves it
        alone, and if this process dies the record lets the collector unload it later.
        ``directory`` None: a version published before (a rollback). Returns its directory."""
        with self.store.transaction() as st:
            v = st.find(alias, name)
            if v is None:
                if directory is None:
                    known = ", ".join(x.name for x in st.history.get(alias, [])) or "none"
                    raise PublishError(f"{name} was never published (published: {known})")
                v = Version(name, str(directory), time.time(), state="loading")
                st.history.setdefault(alias, []).append(v)
            elif directory is not None and v.directory != str(directory):
                # a server answers "already loaded" for the name and keeps the old weights
                raise PublishError(f"{name} was published from {v.directory}; publishing "
                                   f"{directory} under the same name would serve the old one")
            if v.state != "live":
                v.state, v.pinned_unix = "loading", time.time()
            return Path(v.directory)

    def _unpin(self, alias: str, name: str) -> None:
        """A load that failed: the version is retired (the collector unloads whatever part of
        it reached a server)."""
        with self.store.transaction() as st:
            v = st.find(alias, name)
            if v is not None and v.state == "loading":
                v.state, v.retired_unix, v.pinned_unix = "retired", time.time(), None

    def _load(self, alias: str, name: str, directory: Path) -> None:
        try:
            load_and_probe(self.servers, name, directory, self.timeout_s)
        except NameTaken:  # not ours to record, nor to unload later
            with self.store.transaction() as st:
                v = st.find(alias, name)
                if v is not None and v.state == "loading":
                    st.history[alias].remove(v)
            raise
        except BaseException:
            self._unpin(alias, name)
            raise

    def publish(self, adapter_dir: str | os.PathLike[str], *, alias: str | None = None) -> str:
        """Validate, load and probe on every server, then make it the alias's live version
        unless a newer version of the alias is live already (then it is recorded, retired,
        and ``rollback`` can make it live). Returns the served name (``alias@vN``)."""
        directory = Path(adapter_dir).resolve()
        validate_adapter(directory, base_model=self.base_model, max_lora_rank=self.max_lora_rank)
        alias = alias or directory.parent.name
        name = free_name(self.servers, served_name(directory, alias), directory,
                         self.timeout_s)
        self._load(alias, name, self._pin(alias, name, directory))
        with self.store.transaction() as st:
            v = st.find(alias, name)
            if v is None:  # the registry was reset meanwhile: record it again
                v = Version(name, str(directory), time.time())
                st.history.setdefault(alias, []).append(v)
            live = st.aliases.get(alias)
            live_number = version_number(live) if live else None
            now = time.time()
            if live_number is None or (version_number(name) or 0) >= live_number:
                st.make_live(alias, v, now)
            elif v.state != "live":
                v.state, v.retired_unix, v.pinned_unix = "retired", now, None
        self.collect()
        return name

    def rollback(self, alias: str, version: str | int) -> str:
        """Make ``version`` (``coder@v5``, ``v5`` or ``5``) of ``alias`` live again, whatever
        is live now. It is loaded again if it was unloaded and probed either way (a collector
        killed mid-unload may have removed it from a server)."""
        number = str(version).split("@v")[-1].lstrip("v")
        name = f"{alias}@v{number}"
        names = [v.name for v in self.store.read_history().get(alias, [])]
        if name not in names and number.isdigit():  # published under its digested name
            name = next((n for n in names if version_number(n) == int(number)), name)
        self._load(alias, name, self._pin(alias, name, None))
        with self.store.transaction() as st:
            v = st.find(alias, name)
            if v is None:
                raise PublishError(f"{name} vanished from the history during the rollback")
            st.make_live(alias, v, time.time())
        self.collect()
        return name

    def reconcile(self) -> list[str]:
        """Load again, into each server that lacks it, every version the registry calls live:
        a restarted vLLM has lost them all, and every call to them answered 404 until the next
        publish. Returns what was loaded (``name on server``); a server that cannot be asked is
        left for the next time."""
        live = [v for vs in self.store.read_history().values() for v in vs if v.state == "live"]
        done = []
        for server in self.servers if live else []:
            served = served_models(server, self.timeout_s)
            if served is None:
                continue
            for v in live:
                if v.name not in served:
                    load_and_probe([server], v.name, Path(v.directory), self.timeout_s)
                    done.append(f"{v.name} on {_root(server)}")
        return done

    def busy(self) -> set[str]:
        """Adapters with running or waiting requests on any server (vLLM's own metrics)."""
        names: set[str] = set()
        for server in self.servers:
            try:
                with urllib.request.urlopen(f"{_root(server)}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return {v.name for vs in self.history.values() for v in vs}  # unsure: all busy
            lines = [line for line in text.splitlines()
                     if line.startswith("vllm:lora_requests_info{")]
            if lines:
                latest = max(lines, key=lambda line: float(line.rsplit(" ", 1)[1]))
                for label in ("running_lora_adapters", "waiting_lora_adapters"):
                    m = re.search(label + r'="([^"]*)"', latest)
                    if m and m.group(1):
                        names.update(m.group(1).split(","))
        return names

    def _collectable(self, st: State, now: float, busy: set[str]) -> list[Version]:
        assert self.stale_loading_s is not None
        drained = [v for v in st.versions() if v.state == "retired"
                   and now - (v.retired_unix or 0.0) >= self.drain_s]
        stale = [v for v in st.versions() if v.state == "loading"
                 and now - (v.pinned_unix or 0.0) >= self.stale_loading_s]
        return [v for v in drained + stale if v.name not in busy]

    def collect(self) -> list[str]:
        """Unload retired versions past their drain time that no request uses any more (the
        servers' metrics), and versions a dead publisher left loading; returns those unloaded.

        The choice and the unload happen under the registry's lock, so a rollback cannot make
        a version live between the two (it records its version as ``loading`` under the same
        lock first). Unloading is one short request per server; loading is never done here."""
        now = time.time()
        if not self._collectable(State(self.store.read_history()), now, set()):
            return []
        busy = self.busy()  # HTTP to every server: before taking the lock
        done = []
        with self.store.transaction() as st:
            for v in self._collectable(st, time.time(), busy):
                if _unload(self.servers, v.name, min(self.timeout_s, 10.0)):
                    v.state, v.pinned_unix = "unloaded", None
                    done.append(v.name)
        return done


def publish_adapter(base_url: str, adapter_dir: str | os.PathLike[str], *,
                    name: str | None = None, timeout_s: float = 60.0) -> str:
    """Load one version into one server under ``name`` (default ``<adapter>@vN``) and probe it,
    without touching any alias (tests use it)."""
    directory = Path(adapter_dir).resolve()
    validate_adapter(directory)
    name = name or served_name(directory)
    load_and_probe([base_url], name, directory, timeout_s)
    return name
