"""Publisher v0: load an adapter version into a running vLLM and check it is served.

Each version is loaded under its own name (``policy@v0003``) from its own directory. vLLM's
in-place reload of one name is avoided on purpose: it re-reads the adapter from disk on later
requests and can serve stale prefix-cache blocks (vLLM issues 33791 and 42125).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class PublishError(RuntimeError):
    """The server refused the adapter or did not serve it; the message says which and why."""


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def served_name(adapter_dir: str | os.PathLike[str]) -> str:
    """``<adapter name>@v<N>`` from a versioned adapter directory ``.../<name>/v000N``."""
    d = Path(adapter_dir).resolve()
    return f"{d.parent.name}@v{int(d.name.lstrip('v'))}"


def publish_adapter(base_url: str, adapter_dir: str | os.PathLike[str], *,
                    name: str | None = None, timeout_s: float = 60.0) -> str:
    """Load ``adapter_dir`` into the vLLM at ``base_url`` (``http://host:port``, with or without
    ``/v1``) and probe it with a one-token request. Returns the served name."""
    adapter_dir = Path(adapter_dir).resolve()
    if not (adapter_dir / "adapter_config.json").exists():
        raise PublishError(f"{adapter_dir}: not a PEFT adapter directory (no adapter_config.json)")
    name = name or served_name(adapter_dir)
    root = base_url.rstrip("/").removesuffix("/v1")
    status, text = _post(f"{root}/v1/load_lora_adapter",
                         {"lora_name": name, "lora_path": str(adapter_dir)}, timeout_s)
    if status != 200:
        raise PublishError(f"vLLM at {root} refused adapter {name} from {adapter_dir}: "
                           f"HTTP {status}: {text.strip()[:500]}")
    status, text = _post(f"{root}/v1/chat/completions", {
        "model": name, "max_tokens": 1,
        "messages": [{"role": "user", "content": "ping"}]}, timeout_s)
    if status != 200 or json.loads(text).get("model") != name:
        raise PublishError(f"adapter {name} loaded but the probe request failed: "
                           f"HTTP {status}: {text.strip()[:500]}")
    return name
