"""What ``scripts/setup-venv.sh`` would install, without installing anything.

The script is run as it is, from a copy of the files it reads (it ``cd``s to its parent folder:
``pyproject.toml``, ``setup.py``, ``agl_bridge_auto.pth``) in which ``.venv/bin/python`` and
``.venv/bin/pip`` already exist and only write their arguments to a log. Which branch it takes
depends only on ``nvidia-smi -L`` working, so a test can put a fake ``nvidia-smi`` first on
``PATH`` (the CPU suite) or leave the machine's own (the GPU suite).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.paths import ROOT

RECORDER = """#!/bin/sh
if [ "$1" = "-c" ]; then echo "$AGL_DRY_SITE"; exit 0; fi
echo "{name} $*" >> "$AGL_DRY_LOG"
"""


def dry_run(work: Path, path: str) -> list[str]:
    """The python/pip commands the script runs with ``PATH=path``, one line each."""
    (work / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup-venv.sh", work / "scripts")
    for name in ("pyproject.toml", "setup.py", "agl_bridge_auto.pth"):
        shutil.copy2(ROOT / name, work)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "pip"):
        (bin_dir / name).write_text(RECORDER.format(name=name))
        (bin_dir / name).chmod(0o755)
    (work / "site").mkdir()
    log = work / "commands.log"
    done = subprocess.run(["bash", str(work / "scripts" / "setup-venv.sh")], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PATH": path, "AGL_DRY_LOG": str(log),
                               "AGL_DRY_SITE": str(work / "site")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (work / "site" / "agl_bridge_auto.pth").exists()  # the hook was put in place
    return log.read_text().splitlines()


def fake_nvidia_smi(folder: Path, works: bool) -> Path:
    """A folder holding an ``nvidia-smi`` that lists a GPU (``works``) or fails as one does on a
    machine with the tool but no driver."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\nexit 0\n"
                    if works else "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    tool.chmod(0o755)
    return folder


def extras(line: str) -> set[str]:
    """``pip install -q -e .[a,b]`` -> {a, b}."""
    spec = next(word for word in line.split() if word.startswith(".["))
    return set(spec[2:-1].split(","))
