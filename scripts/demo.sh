#!/usr/bin/env bash
# The main job on a fresh machine, no robot, no GPU: set up (if needed), generate a synthetic
# robot session bag, measure the small pi0.5 onboard node on the CPU with a warm-up replay and plan
# its control rate from that, replay the session into it in real time, and write the report (HTML +
# Markdown + PNG plots). Prints where the report is.
#
#   scripts/demo.sh [--workdir DIR] [--duration SECONDS] [--rate-hz HZ] [--stress]
#                   [--mode realtime|stepped] [--storage mcap|sqlite3]
#
#   --rate-hz HZ  control rate instead of the one planned from the warm-up
#   --stress      also an overload replay (the robot's time sped up): its verdict must be ERROR
#   --mode stepped  deterministic, /clock-driven, judged in simulated time
#
# Needs the fixture tokenizer ($PHYAI_PARITY_FIXTURES, default ../shared/fixtures/lerobot_parity).
# About a minute on 2 CPU cores after setup.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/scripts/setup_env.sh"
cd "$repo"
# This demo's DDS traffic stays on this machine and in its own domain.
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( ($$ % 90) + 10 ))}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$repo/.venv/bin/python" -m phyai_ros.replay.demo "$@"
