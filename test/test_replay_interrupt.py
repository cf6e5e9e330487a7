"""A replay stopped by SIGINT / SIGTERM keeps what it recorded (issue 38, item 3): the node child is stopped, the
output bag is closed (metadata.yaml written, the mcap finished) so rosbags and the report read it, and a signal
while the node is still starting ends the replay at once instead of after its start-up wait.

The real ``replay`` command in a process of its own, the small pi0.5 node it starts, a generated mcap bag; the
signal goes to the replay process alone (as ``kill`` or a supervisor sends it; a terminal's Ctrl-C reaches the
node as well)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
from phyai_ros.replay.runbag import load_run
from phyai_ros.testing import make_small_checkpoint, require_tokenizer
from ros_helpers import REPO, python_env

pytestmark = pytest.mark.ros
HORIZON = 20


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = require_tokenizer()
    d = tmp_path_factory.mktemp("interrupt")
    ckpt = make_small_checkpoint(d / "ckpt", horizon=HORIZON)
    bag = make_demo_bag(d / "bag", DemoBagConfig(duration=30.0, state_rate_hz=20.0, storage="mcap"))
    return ckpt, tokenizer, bag


class _Replay:
    """``python -m phyai_ros.replay.cli`` with its output read line by line in a thread."""

    def __init__(self, ckpt, tokenizer, bag, out):
        args = [sys.executable, "-m", "phyai_ros.replay.cli", str(bag.path), "--out", str(out), "--start-node",
                "--report", "-p", f"model.checkpoint:={ckpt}", "-p", f"model.tokenizer:={tokenizer}",
                "-p", f"control.horizon:={HORIZON}"]
        self.proc = subprocess.Popen(args, cwd=REPO, env=python_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return any(text in line for line in self.lines)

    def output(self) -> str:
        self._reader.join(5)
        return "".join(self.lines)


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_replay_killed_while_playing_keeps_its_recording_and_reports_it(setup, tmp_path, sig):
    ckpt, tokenizer, bag = setup
    out = tmp_path / "out"
    replay = _Replay(ckpt, tokenizer, bag, out)
    try:
        assert replay.wait_for("playing", timeout=180), replay.output()
        time.sleep(4.0)   # a few chunks recorded, most of the 30 s bag still to play
        t = time.monotonic()
        replay.proc.send_signal(sig)
        rc = replay.proc.wait(30)
        assert time.monotonic() - t < 25, replay.output()
    finally:
        if replay.proc.poll() is None:
            replay.proc.kill()
    printed = replay.output()
    assert rc == 128 + sig, printed
    assert "interrupted" in printed and "INCOMPLETE" in printed, printed
    assert (out / "metadata.yaml").is_file(), printed
    run = load_run(out)   # rosbags reads it: the mcap was finished
    assert run.chunks and run.diagnostics and run.summary, printed
    assert not run.summary["complete"] and 0 < run.summary["played"] < run.summary["messages"]
    assert any(e["kind"] == "interrupted" for e in run.summary["events"]), run.summary["events"]
    assert "report:" in printed and (out / "report" / "report.html").is_file(), printed
    pid = (run.summary.get("node_identity") or {}).get("pid")
    assert pid and _gone(pid), f"the node child {pid} outlived the replay"


def _children(pid: int) -> list:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_replay_interrupted_while_its_node_starts_stops_at_once_with_its_node(setup, tmp_path, sig):
    ckpt, tokenizer, bag = setup
    replay = _Replay(ckpt, tokenizer, bag, tmp_path / "out")
    try:
        assert replay.wait_for("starting the policy node", timeout=60), replay.output()
        deadline = time.monotonic() + 10
        while not _children(replay.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        node = _children(replay.proc.pid)
        assert node, "no node child"
        t = time.monotonic()
        replay.proc.send_signal(sig)
        rc = replay.proc.wait(30)
        assert time.monotonic() - t < 20, replay.output()
    finally:
        if replay.proc.poll() is None:
            replay.proc.kill()
    printed = replay.output()
    assert rc == 128 + sig and "interrupted" in printed, printed
    assert all(_gone(pid) for pid in node), f"the node child {node} outlived the replay"
