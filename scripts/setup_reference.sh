#!/usr/bin/env bash
# The pinned reference implementations the parity tests run beside ours (requirements-reference.txt), installed into
# build/reference/ with the venv's pip (--target, --no-deps), so the venv itself stays as requirements.lock has it.
# Idempotent: a stamp keyed by the file's hash. Called by scripts/test.sh after setup_env.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$repo/build/reference"
req="$repo/requirements-reference.txt"
hash="$(sha256sum "$req" | cut -c1-16)"
if [ "$(cat "$target/.phyai_reference" 2>/dev/null)" != "$hash" ]; then
  echo "setup_reference: installing $req into $target"
  rm -rf "$target"; mkdir -p "$target"
  "$repo/.venv/bin/python" -m pip install -q --no-deps --target "$target" -r "$req"
  PYTHONPATH="$target" "$repo/.venv/bin/python" -c "import transformers; assert transformers.__version__ == '5.7.0'"
  echo "$hash" > "$target/.phyai_reference"
fi
