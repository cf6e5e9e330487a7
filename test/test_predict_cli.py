"""`python -m phyai_ros.predict` on the LeRobot parity fixture (plain and RTC cases), as a subprocess."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or
                Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity")
PI05 = FIXTURES / "pi05"
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (PI05 / "expected.safetensors").is_file(),
                                reason=f"LeRobot parity fixtures not found at {FIXTURES}")


def run_cli(out: Path, *extra):
    cmd = [sys.executable, "-m", "phyai_ros.predict", "--checkpoint", str(PI05 / "checkpoint"),
           "--tokenizer", str(FIXTURES / "tokenizer" / "tokenizer.model"), "--inputs", str(PI05 / "inputs.safetensors"),
           "--tasks-json", str(PI05 / "inputs.json"), "--output", str(out),
           "--expected", str(PI05 / "expected.safetensors"), "--tolerance", "1e-4", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def check_output(out: Path, prefix: str):
    from safetensors.torch import load_file
    got, exp = load_file(str(out)), load_file(str(PI05 / "expected.safetensors"))
    assert got["actions"].shape == (2, 50, 7) and got["actions.model"].shape == (2, 50, 32)
    assert (got["actions"] - exp[prefix + "actions.unnormalized"]).abs().max().item() <= 1e-4
    assert (got["actions.model"] - exp[prefix + "actions.model"]).abs().max().item() <= 1e-4


def test_cli_plain(tmp_path):
    out = tmp_path / "plain.safetensors"
    r = run_cli(out, "--norm-stats", str(PI05 / "norm_stats.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "max-abs actions vs actions.unnormalized" in r.stdout
    check_output(out, "")


def test_cli_rtc_explicit_flags(tmp_path):
    """RTC from explicit flags (stats from the checkpoint's LeRobot normalizer file)."""
    out = tmp_path / "rtc.safetensors"
    r = run_cli(out, "--rtc", "exp", "--inference-delay", "3", "--execution-horizon", "10", "--case", "rtc_exp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rtc_exp.actions.model" in r.stdout
    check_output(out, "rtc_exp.")
    # A wrong schedule for that case's expected values is reported as a failure (exit status 2).
    r = run_cli(tmp_path / "bad.safetensors", "--rtc", "linear", "--inference-delay", "3",
                "--execution-horizon", "10", "--case", "rtc_exp")
    assert r.returncode == 2 and "FAIL" in r.stdout


@pytest.mark.skipif(not (FIXTURES / "pi0" / "expected.safetensors").is_file(), reason="pi0 fixture not found")
def test_cli_pi0_rtc_case(tmp_path):
    """The policy type comes from config.json; stats from the checkpoint's normalizer file (mean/std)."""
    pi0 = FIXTURES / "pi0"
    out = tmp_path / "pi0.safetensors"
    cmd = [sys.executable, "-m", "phyai_ros.predict", "--checkpoint", str(pi0 / "checkpoint"),
           "--tokenizer", str(FIXTURES / "tokenizer" / "tokenizer.model"), "--inputs", str(pi0 / "inputs.safetensors"),
           "--tasks-json", str(pi0 / "inputs.json"), "--case", "rtc_linear", "--output", str(out),
           "--expected", str(pi0 / "expected.safetensors"), "--tolerance", "1e-4"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "max-abs actions vs rtc_linear.actions.unnormalized" in r.stdout
