"""Publishing adapter versions into running vLLM servers, behind aliases agents ask for.

``Publisher.publish(adapter_dir, alias="coder")``:

1. **validate** before any server or agent sees it (``validation``: the files, the config's
   types, the safetensors header, the rank of every LoRA pair from its tensors, the fit to the
   base model);
2. **load** it into every configured server under its own name (``coder@v7``) from its own
   directory, never reloading a name in place (vLLM issues 33791 and 42125: an in-place reload
   re-reads the adapter on later requests and can serve stale prefix cache), and **probe** each;
3. **switch** the alias in the alias table (``agl_bridge.aliases``): the agents' next calls use
   the new version;
4. **unload** superseded versions once no request uses them: a server's own metrics
   (``vllm:lora_requests_info``, running and waiting adapters) say when.

``rollback(alias, version)`` makes an earlier version live again in one step (loading it again
if it was unloaded). A registry directory holds the alias table and the history.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.aliases import AliasTable
from agl_bridge.trainer.adapters import version_of
from agl_bridge.trainer.serving.errors import PublishError
from agl_bridge.trainer.serving.validation import validate_adapter

__all__ = ["PublishError", "Publisher", "publish_adapter", "served_name", "validate_adapter"]

ALIASES_FILE = "aliases.json"
HISTORY_FILE = "history.json"


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


def load_and_probe(servers: list[str], name: str, directory: Path, timeout_s: float = 60.0
                   ) -> None:
    """Load ``directory`` as ``name`` into every server, and check each answers a request to it."""
    for server in servers:
        status, text = _post(f"{_root(server)}/v1/load_lora_adapter",
                             {"lora_name": name, "lora_path": str(directory)}, timeout_s)
        if status != 200 and "already" not in text.lower():
            raise PublishError(f"{_root(server)} refused adapter {name} from {directory}: "
                               f"HTTP {status}: {text.strip()[:500]}")
        status, text = _post(f"{_root(server)}/v1/chat/completions", {
            "model": name, "max_tokens": 1,
            "messages": [{"role": "user", "content": "ping"}]}, timeout_s)
        if status != 200 or json.loads(text).get("model") != name:
            raise PublishError(f"adapter {name} loaded into {_root(server)} but the probe "
                               f"request failed: HTTP {status}: {text.strip()[:500]}")


# -- the publisher ---------------------------------------------------------------------------
@dataclass
class Version:
    name: str
    directory: str
    published_unix: float
    state: str = "live"  # live | retired (superseded, maybe still busy) | unloaded
    retired_unix: float | None = None


@dataclass
class Publisher:
    """Loads adapter versions into ``servers`` and keeps the alias table of ``registry``."""

    servers: list[str]
    registry: Path
    base_model: str | os.PathLike[str] | None = None
    max_lora_rank: int | None = None
    timeout_s: float = 60.0
    # A client may have resolved the old version just before the switch, its request not yet
    # at the server (where metrics would show it): retired versions wait this long first.
    drain_s: float = 5.0
    history: dict[str, list[Version]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.registry = Path(self.registry)
        self.registry.mkdir(parents=True, exist_ok=True)
        self.table = AliasTable(self.registry / ALIASES_FILE)
        path = self.registry / HISTORY_FILE
        if path.exists():
            raw = json.loads(path.read_text())
            self.history = {a: [Version(**v) for v in vs] for a, vs in raw.items()}

    def _save_history(self) -> None:
        tmp = self.registry / f".{HISTORY_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({a: [v.__dict__ for v in vs] for a, vs in
                                   self.history.items()}, indent=2))
        os.replace(tmp, self.registry / HISTORY_FILE)

    def live(self, alias: str) -> str | None:
        return self.table.read().get("aliases", {}).get(alias)

    def _load_everywhere(self, name: str, directory: Path) -> None:
        load_and_probe(self.servers, name, directory, self.timeout_s)

    def _switch(self, alias: str, name: str) -> None:
        aliases = dict(self.table.read().get("aliases", {}))
        aliases[alias] = name
        self.table.write(aliases)

    def publish(self, adapter_dir: str | os.PathLike[str], *, alias: str | None = None) -> str:
        """Validate, load and probe on every server, then make it the alias's live version.
        Returns the served name (``alias@vN``)."""
        directory = Path(adapter_dir).resolve()
        validate_adapter(directory, base_model=self.base_model, max_lora_rank=self.max_lora_rank)
        alias = alias or directory.parent.name
        name = served_name(directory, alias)
        self._load_everywhere(name, directory)
        versions = self.history.setdefault(alias, [])
        self._retire(versions)
        versions[:] = [v for v in versions if v.name != name]
        versions.append(Version(name, str(directory), time.time()))
        self._switch(alias, name)
        self._save_history()
        self.collect()
        return name

    def rollback(self, alias: str, version: str | int) -> str:
        """Make ``version`` (``coder@v5``, ``v5`` or ``5``) of ``alias`` live again."""
        number = str(version).split("@v")[-1].lstrip("v")
        name = f"{alias}@v{number}"
        versions = self.history.get(alias, [])
        chosen = next((v for v in versions if v.name == name), None)
        if chosen is None:
            known = ", ".join(v.name for v in versions) or "none"
            raise PublishError(f"{name} was never published (published: {known})")
        if chosen.state == "unloaded":
            self._load_everywhere(name, Path(chosen.directory))
        self._retire(versions)
        chosen.state, chosen.retired_unix = "live", None
        self._switch(alias, name)
        self._save_history()
        self.collect()
        return name

    @staticmethod
    def _retire(versions: list[Version]) -> None:
        for v in versions:
            if v.state == "live":
                v.state, v.retired_unix = "retired", time.time()

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

    def collect(self) -> list[str]:
        """Unload retired versions past their drain time that no request uses any more (the
        servers' metrics); returns those unloaded."""
        now = time.time()
        retired = [v for vs in self.history.values() for v in vs if v.state == "retired"
                   and now - (v.retired_unix or 0.0) >= self.drain_s]
        if not retired:
            return []
        busy = self.busy()
        done = []
        for v in retired:
            if v.name in busy:
                continue
            for server in self.servers:
                _post(f"{_root(server)}/v1/unload_lora_adapter", {"lora_name": v.name},
                      self.timeout_s)
            v.state = "unloaded"
            done.append(v.name)
        if done:
            self._save_history()
        return done


def publish_adapter(base_url: str, adapter_dir: str | os.PathLike[str], *,
                    name: str | None = None, timeout_s: float = 60.0) -> str:
    """Load one version into one server under ``name`` (default ``<adapter>@vN``) and probe it,
    without touching any alias (the thin loop and tests use it)."""
    directory = Path(adapter_dir).resolve()
    validate_adapter(directory)
    name = name or served_name(directory)
    load_and_probe([base_url], name, directory, timeout_s)
    return name
