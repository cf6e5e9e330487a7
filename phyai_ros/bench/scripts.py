"""The scripts the CLI runs as child processes: the family benches, the serve bench and the other tools.

Why children: a full-size family bench draws its weights and captures its graphs on the device, and each of them
must start from an empty device (the start-up figure is a fresh process's, and a model left in this process's
memory would be another's peak). Why still through the CLI: docs/benchmarks.md cites one entry point, and each
record says which commands made its figures. The scripts live in a source checkout's ``scripts/`` (they are
tools, not package code).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .record import REPO

SCRIPTS = REPO / "scripts"

# name -> (script, what it measures): the benchmarks of docs/benchmarks.md that are not one model's bench;
# ``python -m phyai_ros.bench NAME ARGS...`` runs the script with ARGS unchanged (its own --help says them).
TOOLS: Dict[str, Tuple[str, str]] = {
    "thor": ("thor_projection.py", "the stage model's Jetson Thor projection from measured stage times (no GPU)"),
    "profile_ops": ("profile_ops.py", "write or extend a device's operator profile"),
    "op_floors": ("op_floors.py", "each loop op's measured time (a profile's timings) against its floor (no GPU)"),
    "quant_accuracy": ("quant_accuracy.py", "quantized vs float actions: full size, or the parity fixtures (CPU)"),
    "lerobot": ("lerobot_reference.py", "LeRobot's own pi0 / pi0.5, eager and torch.compile (lerobot wheels)"),
    "kernels": ("bench_kernels.py", "each fused kernel vs torch; attention, RoPE and GEMM launch-shape sweeps"),
    "expert_layer": ("bench_expert_layer.py", "the action expert's layer stack: every form checked and timed"),
    "flashinfer": ("bench_flashinfer.py", "flashinfer's candidates vs the Triton kernels and SDPA"),
    "cosmos3_precision": ("cosmos3_precision.py", "Cosmos3's bf16 drift from fp32 by depth and guidance"),
    "node": ("bench_node.py", "the onboard node on the CPU: timer jitter, node overhead, DDS"),
    "cpu_latency": ("bench_cpu_latency.py", "the pi0.5 reference path's CPU latency by stage"),
    "rtc_seams": ("bench_rtc_seams.py", "RTC at chunk switches with the trained tiny policy (CPU)"),
}


def script(name: str) -> str:
    """The path of ``scripts/NAME``; FileNotFoundError where this is no source checkout."""
    path = SCRIPTS / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the family benches and tools are the scripts of a source "
                                "checkout (an installed package has only the contract bench: --small / --checkpoint)")
    return str(path)


def shared_tool(name: str) -> str:
    """A reference tool of the shared folder (../shared/tools, or beside $PHYAI_PARITY_FIXTURES' fixtures)."""
    from phyai_ros.fixtures import fixtures_dir
    path = fixtures_dir().parent.parent / "tools" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the shared tools: ../shared/tools, or set PHYAI_PARITY_FIXTURES)")
    return str(path)


@dataclass(frozen=True)
class Step:
    """One child process: ``argv`` after the interpreter (a script path or ``-m module``, then its arguments)."""
    name: str
    argv: Tuple[str, ...]
    out: Optional[Path] = None              # the JSON it writes (its figures go into the record)
    done: Optional[Path] = None             # where this exists the step's product does (skipped unless --fresh)
    env: Mapping[str, str] = field(default_factory=dict)   # added to the environment

    def command(self) -> List[str]:
        return [sys.executable, *map(str, self.argv)]


def run_steps(steps: Sequence[Step], fresh: bool = False, dry_run: bool = False) -> Tuple[List[dict], int]:
    """Run the steps in order, their output going straight to this process's; stop at the first that fails.
    Returns (one entry per step: command, exit status, seconds, or why it was skipped; the exit status)."""
    done: List[dict] = []
    for step in steps:
        cmd = step.command()
        entry = {"name": step.name, "command": " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items())
                 + (" " if step.env else "") + shlex.join(cmd)}
        done.append(entry)
        if step.done is not None and step.done.exists() and not fresh:
            entry["skipped"] = f"{step.done} exists (--fresh writes it again)"
            print(f"=== {step.name}: skipped, {entry['skipped']}", flush=True)
            continue
        print(f"=== {step.name}: {entry['command']}", flush=True)
        if dry_run:
            entry["skipped"] = "--dry-run"
            continue
        start = time.perf_counter()
        rc = subprocess.call(cmd, env={**os.environ, **step.env})
        entry.update(rc=rc, wall_s=round(time.perf_counter() - start, 3))
        print(f"=== {step.name}: rc={rc} ({entry['wall_s']:.1f} s)", flush=True)
        if rc != 0:
            return done, rc
    return done, 0


def run_tool(name: str, args: Sequence[str]) -> int:
    """``python -m phyai_ros.bench NAME ARGS...``: the tool's script with ARGS, its exit status."""
    return subprocess.call([sys.executable, script(TOOLS[name][0]), *args])


__all__ = ["SCRIPTS", "TOOLS", "Step", "script", "shared_tool", "run_steps", "run_tool"]
