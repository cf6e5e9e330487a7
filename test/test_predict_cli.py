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


def run_cli(out: Path, *extra, inputs: Path = PI05 / "inputs.safetensors",
            expected: Path = PI05 / "expected.safetensors"):
    cmd = [sys.executable, "-m", "phyai_ros.predict", "--checkpoint", str(PI05 / "checkpoint"),
           "--tokenizer", str(FIXTURES / "tokenizer" / "tokenizer.model"), "--inputs", str(inputs),
           "--tasks-json", str(PI05 / "inputs.json"), "--output", str(out),
           "--expected", str(expected), "--tolerance", "1e-4", *extra]
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


def altered_copy(src: Path, dst: Path, **changes) -> Path:
    """``src`` (a safetensors file) with some tensors replaced."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(src))
    tensors.update(changes)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst))
    return dst


def assert_one_line_error(r, code: int, *words: str):
    """Exit status ``code``, one ``error:`` line on stderr naming ``words``, no traceback."""
    assert r.returncode == code, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(w in lines[0] for w in words), r.stderr


def test_cli_nan_output_never_passes_the_tolerance(tmp_path):
    """Expected values holding NaN: max() used to skip the NaN and report a pass."""
    import torch
    from safetensors.torch import load_file
    exp = load_file(str(PI05 / "expected.safetensors"))
    bad = exp["actions.unnormalized"].clone()
    bad[0, 0, 0] = float("nan")
    expected = altered_copy(PI05 / "expected.safetensors", tmp_path / "expected_nan.safetensors",
                            **{"actions.unnormalized": bad})
    r = run_cli(tmp_path / "out.safetensors", expected=expected)
    assert r.returncode == 2 and "FAIL" in r.stdout and "nan" in r.stdout, r.stdout + r.stderr
    # Huge (finite) noise drives the model to NaN/Inf: an error, and nothing written.
    noise = torch.full_like(load_file(str(PI05 / "inputs.safetensors"))["noise"], 3e38)
    inputs = altered_copy(PI05 / "inputs.safetensors", tmp_path / "huge_noise.safetensors", noise=noise)
    out = tmp_path / "huge.safetensors"
    r = run_cli(out, inputs=inputs)
    assert_one_line_error(r, 3, "non-finite actions", str(out))
    assert not out.exists()


@pytest.mark.parametrize("extra,words", [
    (("--case", "rtc_exp", "--max-guidance", "nan"), ("--max-guidance", "got nan")),
    (("--case", "rtc_exp", "--max-guidance=-1e6"), ("--max-guidance", "got -1000000.0")),
    (("--case", "rtc_exp", "--inference-delay=-2"), ("--inference-delay", "got -2")),
    (("--tolerance", "nan"), ("--tolerance", "got nan")),
], ids=["guidance_nan", "guidance_negative", "delay_negative", "tolerance_nan"])
def test_cli_argument_ranges(tmp_path, extra, words):
    assert_one_line_error(run_cli(tmp_path / "out.safetensors", *extra), 2, *words)


def test_cli_input_errors_are_one_line(tmp_path):
    import torch
    from safetensors.torch import load_file
    raw = load_file(str(PI05 / "inputs.safetensors"))
    nan_noise = altered_copy(PI05 / "inputs.safetensors", tmp_path / "nan_noise.safetensors",
                             noise=torch.full_like(raw["noise"], float("nan")))
    assert_one_line_error(run_cli(tmp_path / "o.safetensors", inputs=nan_noise), 2, str(nan_noise), "NaN/Inf")
    missing = tmp_path / "missing.safetensors"
    assert_one_line_error(run_cli(tmp_path / "o.safetensors", inputs=missing), 2, str(missing))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((PI05 / "inputs.safetensors").read_bytes()[:1000])
    assert_one_line_error(run_cli(tmp_path / "o.safetensors", inputs=truncated), 2, str(truncated), "truncated")
    # A state for 3 items with images for 2: the message says what was expected and what it got.
    state = raw["raw.observation.state"]
    three = altered_copy(PI05 / "inputs.safetensors", tmp_path / "three.safetensors",
                         **{"raw.observation.state": torch.cat([state, state[:1]])})
    assert_one_line_error(run_cli(tmp_path / "o.safetensors", inputs=three), 2,
                          "state must have shape [2, 8]", "got [3, 8]")


def test_cli_autotune_shows_its_progress_and_the_next_run_reads_the_cache(tmp_path, monkeypatch):
    """--op-autotune on (the CPU has candidates too): the tuning's result line reaches the console (stderr), the
    parity still holds on the tuned choices, and a second run finds the cached profile instead of tuning."""
    out = tmp_path / "plain.safetensors"
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    first = run_cli(out, "--norm-stats", str(PI05 / "norm_stats.json"), "--op-autotune", "on")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "operator profile for cpu" in first.stderr and "(autotune: " in first.stderr, first.stderr
    assert list((tmp_path / "cache").glob("*.json")), "the tuned profile was not cached"
    check_output(out, "")
    second = run_cli(out, "--norm-stats", str(PI05 / "norm_stats.json"), "--op-autotune", "on")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(autotune: " not in second.stderr, second.stderr
