"""Helpers for tests that run real rclpy nodes: spawning peers and waiting for messages."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def python_env() -> dict:
    """This test run's environment (DDS settings included) with the repo and test/ importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "test"), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def spawn_python(args: list[str], **kwargs) -> subprocess.Popen:
    """Start `python <args>` from the repo root with this test run's DDS settings."""
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=python_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """Interrupt a peer (as Ctrl-C would), wait, and return what it printed."""
    if proc.poll() is None:
        proc.send_signal(2)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


def spin_until(executor, predicate, timeout: float) -> bool:
    """Spin an rclpy executor until predicate() holds or timeout (s) passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        executor.spin_once(timeout_sec=0.05)
    return predicate()
