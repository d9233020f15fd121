#!/usr/bin/env bash
# make lint: ruff (style, import order, bugs) over the tree, then mypy over the package.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
scripts/typecheck.sh
