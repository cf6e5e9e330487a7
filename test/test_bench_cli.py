"""`python -m phyai_ros.bench` on the CPU: small checkpoints through the adapter contract (the record's fields,
positive finite times), the full-size plans (--dry-run: which script gets which flags) and bad arguments (exit 2,
one line naming the fix)."""
import json
import math
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

from phyai_ros.bench.__main__ import main
from phyai_ros.bench.scripts import SCRIPTS, TOOLS
from phyai_ros.fixtures import fixtures_dir, tokenizer_path

REPO = Path(__file__).resolve().parents[1]
needs_tokenizer = pytest.mark.skipif(tokenizer_path() is None, reason="no fixture tokenizer (PHYAI_PARITY_FIXTURES)")
needs_groot = pytest.mark.skipif(not (fixtures_dir() / "groot_n17" / "checkpoint").is_dir(),
                                 reason="no GR00T N1.7 fixture set (PHYAI_PARITY_FIXTURES)")


def bench(tmp_path, *args):
    """The CLI in a fresh process, as a user runs it; its record."""
    out = tmp_path / "record.json"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("OUT", None)
    r = subprocess.run([sys.executable, "-m", "phyai_ros.bench", *args, "--device", "cpu", "--root",
                        str(tmp_path / "ckpt"), "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r.stdout


def positive_finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_record(rec: dict, model: str, argv_head: str) -> None:
    assert rec["bench"] == "phyai_ros.bench" and rec["schema"] == 1
    assert rec["model"] == model and rec["kind"] == "contract"
    assert rec["command"].startswith(f"python -m phyai_ros.bench {argv_head}")
    assert rec["device"].startswith("cpu") and rec["torch"] == torch.__version__
    datetime.strptime(rec["date"], "%Y-%m-%dT%H:%M:%S%z")
    assert set(rec["git"]) == {"commit", "dirty"} and isinstance(rec["env"], dict)
    assert rec["options"]["model"] == model and rec["options"]["small"] is True
    res = rec["result"]
    assert res["family"] == model and res["small_checkpoint"] and res["dtype"] == "float32"
    assert "operator profile" in res["operator_profile"] or "no operator profile" in res["operator_profile"]
    for run in res["runs"]:
        assert run["finite"] and run["chunk_shape"] == [res["chunk_size"], res["action_dim"]]
        for key in ("median_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "mean_ms"):
            assert positive_finite(run["batch1"][key]), (key, run["batch1"])
        assert run["batch1"]["min_ms"] <= run["batch1"]["median_ms"] <= run["batch1"]["p99_ms"] \
            <= run["batch1"]["max_ms"]
        s = run["startup"]
        assert all(math.isfinite(s[k]) and s[k] >= 0 for k in ("load_s", "capture_s", "first_chunk_s"))
        assert s["graphs"] is False   # the CPU runs eagerly


@needs_tokenizer
def test_small_pi05_views_and_batches(tmp_path):
    """pi0.5 masks absent cameras: one checkpoint, frames of 3 and of 2 cameras; batches through the serve rows."""
    rec, stdout = bench(tmp_path, "pi05", "--small", "--views", "3,2", "--batches", "1,2", "--iters", "3",
                        "--batch-iters", "2")
    check_record(rec, "pi05", "pi05 --small")
    runs = rec["result"]["runs"]
    assert [r["views"] for r in runs] == [3, 2] and [len(r["cameras_sent"]) for r in runs] == [3, 2]
    assert all(r["batch1"]["runs"] == 3 and r["image"] == "480x640" for r in runs)
    for run in runs:
        assert set(run["batching"]) == {"1", "2"}
        for b, row in run["batching"].items():
            assert row["runs"] == 2 and all(positive_finite(row[k]) for k in ("T_sync_ms", "Q_per_s", "T_amort_ms"))
            assert row["Q_per_s"] == pytest.approx(1e3 * int(b) / row["T_sync_ms"])
    assert "3 view(s) at 480x640: batch 1 median" in stdout and "batch   2: T_sync" in stdout


@needs_groot
def test_small_groot_one_checkpoint_per_view_count(tmp_path):
    """GR00T N1.7 takes every camera of its checkpoint: a small checkpoint per view count, two frame sizes each."""
    rec, _ = bench(tmp_path, "groot_n17", "--small", "--views", "2,1", "--images", "240x320,480x640", "--iters", "2")
    check_record(rec, "groot_n17", "groot_n17 --small")
    runs = rec["result"]["runs"]
    assert [(r["views"], r["image"]) for r in runs] == [(2, "240x320"), (2, "480x640"), (1, "240x320"),
                                                        (1, "480x640")]
    assert [len(r["cameras_sent"]) for r in runs] == [2, 2, 1, 1]
    assert all(r["batching"] == {} for r in runs)   # served one request at a time: batch 1 is predict


@needs_groot
def test_groot_full_size_bench_checkpoints_load_with_the_checked_loader(tmp_path, monkeypatch):
    """The full-size GR00T bench writes one weights file for its one- and two-view checkpoints; the two-view folder
    must hold it (not a symlink out of its folder, which the loader refuses as a hostile path), so profile_ops
    --groot DIR loads either."""
    import importlib.util
    from phyai_ros.models.groot_n17 import GrootAdapter
    monkeypatch.syspath_prepend(str(REPO / "scripts"))   # the script imports its sibling bench_runtime
    spec = importlib.util.spec_from_file_location("bench_groot_script", REPO / "scripts" / "bench_groot.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.DEVICE, script.DTYPE = "cpu", torch.float32
    script.write_checkpoint(tmp_path, full=False)
    two = tmp_path / "checkpoint_2views" / "model.safetensors"
    assert two.is_file() and not two.is_symlink()
    adapter = GrootAdapter.from_files(tmp_path / "checkpoint_2views", device="cpu", dtype=torch.float32)
    assert len(adapter.camera_names) == 2


def run_main(capsys, *argv):
    """The CLI in this process: (exit status, stdout, stderr)."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv, words", [
    (("pi7", "--small"), "MODEL 'pi7' is not a registered family"),
    (("pi05", "--small", "--batches", "1,x"), "not a comma-separated list of integers"),
    (("pi05", "--small", "--batches", "0"), "give positive integers"),
    (("pi05", "--small", "--images", "480by640"), "is not HxW"),
    (("pi05", "--small", "--quant", "w9a9"), "--quant w9a9: one of none, "),
    (("pi05", "--small", "--profile", "/nonexistent/profile.json"), "no such file"),
    (("pi05", "--small", "--checkpoint", "/tmp"), "not allowed with argument"),
    (("pi05", "--checkpoint", "/nonexistent/ckpt"), "no such folder"),
    (("pi05", "--small", "--startup"), "--startup is a fresh process's start-up"),
    (("pi05", "--small", "--iters", "0"), "is not a positive integer"),
    (("pi05", "--small", "--robots", "8"), "are --serve options"),
    (("pi05", "--small", "--", "--host-profile"), "go to a family script"),
    (("groot_n17", "--small", "--batches", "1,8"), "serves one request at a time"),
    (("pi05", "--device", "cpu"), "full size on the CPU"),
    (("pi05", "--device", "cpu", "--config", "tiny", "--dry-run"), "--config tiny: pi05's full-size bench takes"),
    (("pi05", "--device", "cpu", "--config", "mid", "--views", "3,2", "--dry-run"), "one camera count per run"),
    (("cosmos3", "--device", "cpu", "--config", "tiny", "--views", "2", "--dry-run"), "Cosmos3's bench has one"),
    (("minicpm_robot", "--device", "cpu", "--config", "tiny", "--quant", "w8a8", "--dry-run"), "no quantized path"),
    (("groot_n17", "--device", "cpu", "--config", "tiny", "--autotune", "/tmp/p.json", "--dry-run"),
     "--autotune times kernel candidates on the GPU"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, monkeypatch, argv, words):
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)   # restored after: --profile sets it
    monkeypatch.delenv("OUT", raising=False)
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2, (out, err)
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and words in lines[0], err


@needs_tokenizer
def test_views_beyond_the_checkpoints_cameras(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    rc, _, err = run_main(capsys, "pi05", "--small", "--device", "cpu", "--views", "4", "--root", str(tmp_path),
                          "--out", str(tmp_path / "r.json"))
    assert rc == 2 and "--views 4: the checkpoint has 3 camera(s)" in err
    assert not (tmp_path / "r.json").exists()


def test_full_size_plans(capsys, monkeypatch, tmp_path):
    """--dry-run: each family script with the flags the options map to, nothing run, no record."""
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.delenv("OUT", raising=False)
    root = ["--root", str(tmp_path), "--dry-run"]
    rc, out, _ = run_main(capsys, "groot_n17", "--device", "cpu", "--config", "tiny", "--views", "1",
                          "--batches", "1,32", "--iters", "50", *root)
    assert rc == 0
    bench_line = [line for line in out.splitlines() if line.startswith("=== bench:")][0]
    for part in ("bench_groot.py", "--reuse-checkpoint", "--views 1", "--batches 1,32", "--iters 50",
                 "--skip-startup", "--no-profile"):
        assert part in bench_line, bench_line
    rc, out, _ = run_main(capsys, "cosmos3", "--device", "cpu", "--config", "tiny", "--batches", "1,2",
                          "--images", "480x832", "--quant", "w8a8", "--reference", "on", *root)
    assert rc == 0 and "--batches 2 " in out and "--images 480x832" in out and "--quantized w8a8" in out
    assert "--diffusers on" in out and "--startup skip" in out
    if tokenizer_path() is not None:
        rc, out, _ = run_main(capsys, "pi0", "--device", "cpu", "--config", "mid", "--views", "2", "--quant",
                              "w8a16", "--startup", "--reference", "compile", *root)
        assert rc == 0
        assert "--checkpoint-only" in out and "-m phyai_ros.quant" in out and "--scheme w8a16" in out
        bench_line = [line for line in out.splitlines() if line.startswith("=== bench:")][0]
        assert "--cameras 2" in bench_line and "checkpoint-w8a16 --reuse-checkpoint" in bench_line
        assert "--skip-startup" not in bench_line
        assert "lerobot_reference.py --policy pi0" in out and "--no-compile" not in out
    assert not list(tmp_path.glob("*.json"))


def test_every_tool_is_a_script():
    for name, (path, what) in TOOLS.items():
        assert (SCRIPTS / path).is_file(), (name, path)
        assert what
