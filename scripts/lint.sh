#!/usr/bin/env bash
# make lint: ruff (style, import order, bugs) over the tree, the import contracts (no cycles, the
# dependency direction of docs/layout.md; pyproject's [tool.importlinter]), then mypy over the
# package.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/python scripts/check_imports.py
scripts/typecheck.sh
