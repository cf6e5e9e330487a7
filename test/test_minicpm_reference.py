"""MiniCPM-Robot against transformers 5.7.0 itself on sets the shared fixture does not cover, written by
test/minicpm_reference.py in a subprocess that imports the pinned reference (scripts/setup_reference.sh:
build/reference/): batch 2 with three views of three sizes per item and a bank per item, GDN with more value than
key heads, the window merger after another layer, another position table; the 4x mode without a window merger;
a batch of unequal prompts (left padding). Run through ``python -m phyai_ros.predict`` like the held-back sets.
Same bound as set A: 1e-4 max-abs, fp32 CPU; token ids exactly.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fixture_sets import minicpm_fixture_dir
from phyai_ros import predict

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("PHYAI_REFERENCE_PATH", REPO / "build" / "reference"))
TOL = 1e-4
CASES = [("b2_gqa", "b0_batch2"), ("x4_pad", "c0_single"), ("x4_pad", "c1_padded")]
pytestmark = [pytest.mark.skipif(not (REFERENCE / "transformers").is_dir(),
                                 reason=f"no pinned reference at {REFERENCE} (scripts/setup_reference.sh)"),
              pytest.mark.skipif(not (minicpm_fixture_dir() / "processor").is_dir(),
                                 reason="MiniCPM-Robot parity set A not found (its processor files are reused)")]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("minicpm_sets")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REFERENCE), str(REPO)])}
    out = {}
    for variant in sorted({v for v, _ in CASES}):
        run = subprocess.run([sys.executable, str(REPO / "test" / "minicpm_reference.py"), str(root / variant),
                              variant], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        out[variant] = root / variant
    return out


@pytest.mark.parametrize("variant,case", CASES)
def test_predict_matches_transformers(sets, variant, case, tmp_path, capsys):
    folder = sets[variant]
    output = tmp_path / "out.safetensors"
    has_actions = f"{case}.actions" in load_file(str(folder / "expected.safetensors"))
    rc = predict.main(["--checkpoint", str(folder), "--inputs", str(folder / "inputs.safetensors"), "--tasks-json",
                       str(folder / "config.json"), "--expected", str(folder / "expected.safetensors"), "--case", case,
                       "--output", str(output)] + (["--tolerance", str(TOL)] if has_actions else []))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    got, want = load_file(str(output)), load_file(str(folder / "expected.safetensors"))
    assert torch.equal(got[f"{case}.proc.input_ids"], want[f"{case}.proc.input_ids"])
    assert torch.equal(got[f"{case}.proc.attention_mask"], want[f"{case}.proc.attention_mask"])
    mask = want[f"{case}.proc.attention_mask"].bool()
    diff = (got[f"{case}.vl_embs"] - want[f"{case}.vl_embs"]).abs()[mask]   # valid rows (padded ones: no meaning)
    assert diff.max().item() <= TOL
    if f"{case}.actions" in want:
        assert (got[f"{case}.actions"] - want[f"{case}.actions"]).abs().max().item() <= TOL
    else:
        assert bool(mask.logical_not().any())   # only the padded batch leaves actions unchecked
