#!/usr/bin/env bash
# The training half of the GPU suite on this workplace's lent GPU machines (docs/gpu.md, "On
# this workplace's lent GPU machines"): their image has torch (CUDA), transformers, peft,
# pyarrow and pytest but no network and no vLLM, and at most 64 MiB travels with the tree.
#
#   tests/gpu/device.sh wheels   here, with PyPI: agl-bridge's own dependencies the image lacks,
#                                as Python 3.12 wheels in .whl/ (about 3 MB; git ignores it)
#   tests/gpu/device.sh run      there (the device tool's run, carry [".whl"]): a venv over the
#                                image's packages, this tree installed editable into it, then
#                                the bf16 step, train_from_traces and torchrun tests; the log in
#                                $OUT/gpu-tests.log
set -euo pipefail
cd "$(dirname "$0")/../.."
# the versions this repository's .venv runs (pyproject's dependencies, their own needs)
WANT=(opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp==1.45.2
      opentelemetry-instrumentation==0.66b2 protobuf==5.29.6
      # the build backend pyproject asks for (setuptools>=77), whatever the image's is
      setuptools==78.1.1 wheel)
# what the image holds already (KINDS.md's package list): not carried
HELD='^(certifi|charset_normalizer|idna|packaging|requests|typing_extensions|urllib3|wrapt|grpcio)-'

case "${1:-}" in
  wheels)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    rm -rf .whl && mkdir .whl
    "${PIP:-.venv/bin/pip}" download -q --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "${WANT[@]}"
    for w in .whl/*.whl; do
      if [[ $(basename "$w") =~ $HELD ]]; then rm "$w"; fi
    done
    ls .whl && du -sh .whl
    ;;
  run)
    out=${OUT:-/tmp}
    python3 -m venv --system-site-packages /tmp/agl-venv
    /tmp/agl-venv/bin/pip install -q --no-index --no-deps --no-compile .whl/*.whl
    /tmp/agl-venv/bin/pip install -q --no-index --no-deps --no-build-isolation -e .
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
    { nvidia-smi -L; /tmp/agl-venv/bin/python -c 'import torch, transformers, peft
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count(), "GPU(s);",
      "transformers", transformers.__version__, "peft", peft.__version__)'; } | tee "$out/machine.txt"
    set -o pipefail
    /tmp/agl-venv/bin/python -m pytest -q -p no:cacheprovider -m gpu --durations=10 \
      tests/gpu/test_bf16_step.py tests/gpu/test_training.py tests/gpu/test_torchrun.py \
      2>&1 | tee "$out/gpu-tests.log"
    ;;
  *)
    echo "usage: tests/gpu/device.sh {wheels|run}" >&2
    exit 2
    ;;
esac
