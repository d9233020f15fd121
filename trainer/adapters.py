"""Adapter versions on disk: directories, metadata and base-model fingerprints (no torch).

Training writes each adapter version to its own directory ``<root>/<name>/v0001``, ``v0002``,
... in standard PEFT format with ``agl_bridge_adapter.json`` beside it; publishing validates
and serves those directories and reports list them. All three use this module, so the layout
and the fingerprint are defined once, and publishing or reporting never imports the trainer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

METADATA_FILE = "agl_bridge_adapter.json"
_VERSION_DIR = re.compile(r"v(\d+)")


def base_model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """sha256 over config.json and the names and sizes of the weight files: cheap, and enough to
    refuse an adapter trained on another base."""
    d = Path(model_dir)
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()


def version_of(directory: str | os.PathLike[str]) -> int | None:
    """N of a version directory named ``vN`` (``v0007`` -> 7); None for any other name."""
    m = _VERSION_DIR.fullmatch(Path(directory).name)
    return int(m.group(1)) if m else None


def version_dir(adapters_root: str | os.PathLike[str], name: str, version: int) -> Path:
    return Path(adapters_root) / name / f"v{version:04d}"


def versions(adapters_root: str | os.PathLike[str], name: str, *, complete: bool = False
             ) -> list[Path]:
    """The version directories of adapter ``name``, oldest first (``complete``: only those
    whose metadata was written, the last step of saving one)."""
    root = Path(adapters_root) / name
    found = [(v, p) for p in root.glob("v[0-9]*") if (v := version_of(p)) is not None
             and (not complete or (p / METADATA_FILE).exists())]
    return [p for _, p in sorted(found)]


def next_version_dir(adapters_root: str | os.PathLike[str], name: str) -> tuple[int, Path]:
    """The number and directory the next version of ``name`` gets."""
    existing = versions(adapters_root, name)
    version = (version_of(existing[-1]) or 0) + 1 if existing else 1
    return version, version_dir(adapters_root, name, version)


def latest_adapter(adapters_root: str | os.PathLike[str], name: str) -> Path | None:
    found = versions(adapters_root, name, complete=True)
    return found[-1] if found else None


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A version's metadata; None when it has none. Malformed metadata raises ValueError."""
    path = Path(directory) / METADATA_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    meta = json.loads(text)
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a JSON object")
    return meta
