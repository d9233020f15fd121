# The two commands of the README. Each creates the environment it needs (.venv) first.
.PHONY: demo test venv

# no model hub is reachable, or wanted, at run time
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

venv:
	@scripts/setup-venv.sh

demo: venv
	.venv/bin/python examples/closed_loop.py --workdir runs/demo

test: venv
	.venv/bin/python -m pytest -q
