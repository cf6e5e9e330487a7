#!/usr/bin/env bash
# The test command: set the environment up from nothing if needed, then run the suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k parity, or -m gpu on a GPU machine).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/setup_env.sh"
"$repo/scripts/setup_reference.sh"   # pinned reference implementations beside the venv (requirements-reference.txt)
cd "$repo"
# Loopback-only discovery and a DDS domain of this run's own (test/conftest.py picks one per run).
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
# Lint first (rules: pyproject.toml [tool.ruff]), then the layering of docs/design.md (.importlinter); any finding
# fails the run before the tests start.
"$repo/.venv/bin/ruff" check "$repo"
mkdir -p "$repo/build"
(cd "$repo" && "$repo/.venv/bin/lint-imports" --no-cache > "$repo/build/lint-imports.log" 2>&1) \
  || { cat "$repo/build/lint-imports.log"; exit 1; }
exec "$repo/.venv/bin/python" -m pytest "$@"
