"""The main-job demo: a recorded session goes in, the node runs pi0.5, a report comes out.

    python -m phyai_ros.replay.demo [--workdir DIR] [--duration 40] [--mode realtime|stepped]

(``scripts/demo.sh`` sets up the environment first.)  Steps, all on the CPU, no download:

1. a small random-weight pi0.5 checkpoint (fixture sizes, 50-action chunks) and the fixture
   tokenizer (``$PHYAI_PARITY_FIXTURES``);
2. a synthetic robot session bag (3 cameras at 15-30 Hz, joint states at 50 Hz, an instruction);
3. the onboard policy node (``config/pi05_cpu_test.yaml``, 50 Hz control, ``use_sim_time``);
4. a real-time replay of the bag into it, recording chunks, margins, commands and diagnostics;
5. the report (HTML + Markdown + PNG plots), whose path is printed last.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=os.environ.get("PHYAI_DEMO_DIR") or
                    str(Path(tempfile.gettempdir()) / "phyai_ros_demo"),
                    help="where the checkpoint, bags, node log and report go (default $PHYAI_DEMO_DIR or "
                         "<tmp>/phyai_ros_demo)")
    ap.add_argument("--duration", type=float, default=40.0, help="session length in seconds (default 40)")
    ap.add_argument("--mode", choices=("realtime", "stepped"), default="realtime")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    a = ap.parse_args(argv)

    from phyai_ros.testing import make_small_checkpoint, tokenizer_path, fixtures_dir
    t_start = time.monotonic()

    def say(msg: str) -> None:
        print(f"[demo {time.monotonic() - t_start:5.1f}s] {msg}", flush=True)

    tok = tokenizer_path()
    if tok is None:
        print(f"demo: the tokenizer is missing ({fixtures_dir() / 'tokenizer' / 'tokenizer.model'}).\n"
              "demo: the small pi0.5 needs it to run; set PHYAI_PARITY_FIXTURES to the lerobot_parity fixture "
              "folder (it holds tokenizer/tokenizer.model) and run again.", file=sys.stderr)
        return 1
    stepped = a.mode == "stepped"
    # Stepped replay needs one /diagnostics report per tick and the node accepts periods >= 0.05 s,
    # so the stepped demo runs the CPU config's 20 Hz with 20-action chunks; real time runs 50 Hz x 50.
    dt, horizon, state_rate = (0.05, 20, 20.0) if stepped else (0.02, 50, 50.0)
    run = Path(a.workdir) / time.strftime("%Y%m%d_%H%M%S")
    run.mkdir(parents=True, exist_ok=True)
    say(f"working in {run}")

    ckpt = make_small_checkpoint(run / "checkpoint", horizon=horizon)
    say(f"small pi0.5 checkpoint (random weights, {horizon}-action chunks): {ckpt}")

    from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
    bag = make_demo_bag(run / "session", DemoBagConfig(duration=a.duration, storage=a.storage,
                                                       state_rate_hz=state_rate))
    say(f"demo session bag ({bag.storage}, {bag.duration:.0f} s, {bag.total} messages: "
        + ", ".join(f"{k.rsplit('/', 2)[-2] if k.count('/') > 1 else k.strip('/')} {v}"
                    for k, v in sorted(bag.counts.items())) + f"): {bag.path}")

    from phyai_ros.replay.cli import format_summary, run_replay
    from phyai_ros.replay.player import ReplayOptions
    from phyai_ros.testing import PolicyNode
    overrides = {"control.dt": dt, "control.horizon": horizon}
    say(f"starting the policy node (pi05-small-cpu, {1 / dt:.0f} Hz control, use_sim_time)")
    node = PolicyNode(checkpoint=ckpt, tokenizer=tok, overrides=overrides, stepped=stepped,
                      log_path=run / "node.log")
    try:
        say(f"replaying {a.mode} (about {a.duration + 2:.0f} s)" if not stepped else "replaying stepped")
        result = run_replay(bag.path, out=run / "replay_out", options=ReplayOptions(mode=a.mode), node_info=node.info,
                            node_process=node, log=lambda m: None)
    except Exception as exc:  # noqa: BLE001 - explain and point at the node log
        print(f"demo: replay failed: {type(exc).__name__}: {exc}\n--- node log (last lines) ---\n"
              f"{node.output(last=20)}", file=sys.stderr)
        return 1
    finally:
        node.stop()
    print(format_summary(result), flush=True)

    from phyai_ros.replay.report import make_report
    rep = make_report(result.out_path)
    say("report written")
    print(f"\nverdict: {rep.verdict_line}")
    print(f"report:  {rep.index}")
    print(f"         {rep.markdown} (+ {len(rep.figures)} PNG plots in {rep.out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
