#!/usr/bin/env bash
# mypy over the whole package as it installs. The root folders otel/, integrations/ and trainer/
# install as agl_bridge.otel, .integrations and .trainer (pyproject's package-dir); mypy maps
# files to modules by folder, so it checks a tree of links laid out as the installed package and
# reports the real paths.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TREE=.cache/typecheck
rm -rf "$TREE"
mkdir -p "$TREE/agl_bridge"
for f in agl_bridge/*; do ln -s "$ROOT/$f" "$TREE/agl_bridge/"; done
for d in otel integrations trainer; do ln -s "$ROOT/$d" "$TREE/agl_bridge/$d"; done
cd "$TREE"

"$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" -p agl_bridge "$@" 2>&1 \
  | sed -E 's#^agl_bridge/(otel|integrations|trainer)/#\1/#'
exit "${PIPESTATUS[0]}"
