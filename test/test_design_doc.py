"""docs/design.md's generated parts match the code: the op -> candidates -> chosen-where table (§10) is what
scripts/op_table.py makes from the selector's registry and the shipped profiles (that every candidate a shipped
profile names is registered: test_layer_families.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_op_table_in_design_md_is_current():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "op_table.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

