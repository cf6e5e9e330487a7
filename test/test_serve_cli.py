"""``python -m phyai_ros.serve`` stops promptly on SIGINT (issue 38, item 8): it was still running 35 s after a
Ctrl-C. The real command, serving the small pi0.5 on the CPU on loopback in a Ray instance of its own."""
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("ray")
from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer  # noqa: E402
from ros_helpers import REPO, python_env  # noqa: E402


def test_the_serve_command_stops_within_seconds_of_sigint(tmp_path):
    ckpt = make_small_checkpoint(tmp_path / "pi05", horizon=10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "phyai_ros.serve", "--checkpoint", str(ckpt), "--tokenizer",
                             str(require_tokenizer()), "--device", "cpu", "--port", str(port), "--num-cpus", "0.5"],
                            cwd=REPO, env={**python_env(), "PHYAI_SERVE_TOKEN": "t"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not any("serving" in ln for ln in lines):
            time.sleep(0.2)
        assert any("serving" in ln for ln in lines), "".join(lines)[-3000:]
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    assert took < 25, f"{took:.1f} s after SIGINT\n" + "".join(lines)[-3000:]
    assert any("stopping" in ln for ln in lines), "".join(lines)[-3000:]
