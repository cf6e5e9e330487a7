"""The JSON record every bench run writes: the figures with what it takes to trust and repeat them.

docs/benchmarks.md gives every figure its command, device and date; the record carries them next to the figures,
with the tree (commit, whether it had changes), the environment knobs that change what runs (``PHYAI_*``: the
operator profile, PDL, the op overrides; Triton's cache) and the options as parsed, so a figure can be re-run
from its file alone.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[2]
ENV_PREFIXES = ("PHYAI_", "TRITON_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
SCHEMA = 1


def command_line(argv: Sequence[str]) -> str:
    """The command as it can be typed again."""
    return "python -m phyai_ros.bench " + shlex.join(list(argv))


def device_name(device) -> str:
    """The GPU's name, or the CPU's model and core count."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu} ({os.cpu_count()} cores)"


def git_state() -> dict:
    """The tree's commit and whether it had uncommitted changes (None outside a git checkout)."""
    def git(*args) -> Optional[str]:
        try:
            r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def make_record(argv: Sequence[str], model: str, kind: str, device: str, options: dict, result: dict,
                steps: Optional[list] = None) -> dict:
    """The record of one run: ``kind`` "contract" (a checkpoint through the adapter contract), "full" (the
    family's full-size script) or "serve"; ``result`` its figures, ``steps`` the commands it ran."""
    return {"bench": "phyai_ros.bench", "schema": SCHEMA, "model": model, "kind": kind,
            "command": command_line(argv), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "host": platform.node(), "git": git_state(),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
            "options": options, "steps": steps or [], "result": result}


def write_record(path: Optional[Path], record: dict) -> None:
    """Write it where asked (atomically: a reader never sees half a file); print where."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp.replace(path)
    print(f"record -> {path}", file=sys.stderr)


__all__ = ["command_line", "device_name", "git_state", "make_record", "write_record", "REPO"]
