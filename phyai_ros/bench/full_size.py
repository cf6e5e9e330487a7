"""Full size: each built-in family's bench script with the CLI's options, planned as steps (scripts.Step).

The figures of docs/benchmarks.md's model tables need what only a family knows: its full sizes (drawn on the
device: the CPU's generator takes minutes for billions of weights), its stages and their roofline floors, the
reference implementation timed in the same call (LeRobot, diffusers, transformers). Those stay in the family
scripts (scripts/bench_runtime.py for pi0.5 and pi0, bench_groot.py, bench_cosmos3.py, bench_minicpm.py); what is
here is the one mapping from the CLI's options to their flags, one function per family. An option a family's
script does not take is an error saying what does, never dropped. Defaults are uniform across families: only
the family's own measurements; start-up (``--startup``), eager kernel tables (``--kernel-profile``) and the
reference (``--reference``) when asked. A random checkpoint written under ``--root`` is reused by later runs
(``--fresh`` writes it again).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .scripts import Step, script, shared_tool

PI = ("pi05", "pi0")


@dataclass
class FullOptions:
    model: str
    root: Path                              # random checkpoints (reused)
    work: Path                              # the steps' JSON files
    device: str = "cuda"
    dtype: Optional[str] = None
    config: Optional[str] = None            # full (default) or the script's smaller one (mid / tiny)
    batches: Optional[List[int]] = None     # None: the script's own default
    iters: Optional[int] = None
    batch_iters: Optional[int] = None
    views: Optional[List[int]] = None
    images: Optional[List[str]] = None
    quant: Optional[str] = None
    reference: str = "off"                  # off / on / compile (LeRobot's torch.compile, pi only)
    startup: bool = False
    kernel_profile: bool = False
    host_profile: bool = False
    keep_absent: bool = False
    autotune: Optional[Path] = None
    autotune_ops: Optional[str] = None
    autotune_fast: Optional[float] = None   # the start-up autotune's bounded form (its budget, s) instead of the full
    tokenizer: Optional[Path] = None
    robots: Optional[int] = None            # --serve
    per_robot: Optional[int] = None
    extra: List[str] = field(default_factory=list)   # after "--": to the family script as they are


def _refuse(o: FullOptions, label: str, **why: str) -> None:
    """ValueError for the first option given (set, or a flag on) that ``label``'s script does not take."""
    for name, reason in why.items():
        value = getattr(o, name)
        if value not in (None, False, "off", []):
            raise ValueError(f"--{name.replace('_', '-')}: {label} {reason}")


def _config(o: FullOptions, choices: Tuple[str, ...]) -> str:
    cfg = o.config or "full"
    if cfg not in choices:
        raise ValueError(f"--config {cfg}: {o.model}'s full-size bench takes {' / '.join(choices)}")
    return cfg


def _dtype(o: FullOptions) -> str:
    """The scripts run bf16 on CUDA and fp32 on the CPU (their random weights are drawn in it)."""
    native = "bfloat16" if o.device == "cuda" else "float32"
    if o.dtype not in (None, native):
        raise ValueError(f"--dtype {o.dtype}: the full-size benches run {native} on {o.device} (bench another dtype "
                         "through the contract: --checkpoint DIR --dtype ...)")
    return native


def _opt(flag: str, value) -> list:
    return [] if value is None else [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]


def _tokenizer(o: FullOptions) -> Path:
    from phyai_ros.fixtures import tokenizer_path
    tok = o.tokenizer or tokenizer_path()
    if tok is None or not Path(tok).is_file():
        raise ValueError(f"{o.model} needs a tokenizer: none at {tok or 'the shared fixtures'} (--tokenizer FILE, "
                         "or PHYAI_PARITY_FIXTURES)")
    return Path(tok)


def _autotune(o: FullOptions, steps: List[Step], model_args: list) -> Dict[str, str]:
    """The model's shapes profiled into --autotune's file (merged: its other entries stay), the steps after it on
    that file: the profile round of docs/benchmarks.md (a copy of the shipped profile, one op re-profiled)."""
    if o.autotune is None:
        return {}
    if o.device != "cuda":
        raise ValueError("--autotune times kernel candidates on the GPU (--device cuda)")
    steps.append(Step("autotune", (script("profile_ops.py"), *model_args, *_opt("--ops", o.autotune_ops),
                                   *_opt("--fast", o.autotune_fast), *_opt("--batch", o.batches), "--merge",
                                   "--out", o.autotune)))
    return {"PHYAI_OP_PROFILE": str(o.autotune)}


# ---------------------------------------------------------------------------------------------- per family
def _pi_checkpoint(o: FullOptions) -> Tuple[List[Step], Path, Path]:
    cfg, tok = _config(o, ("full", "mid")), _tokenizer(o)
    ck = o.root / f"{o.model}-{cfg}" / "checkpoint"
    return [Step("checkpoint", (script("bench_runtime.py"), "--model", o.model, "--config", cfg, "--device", o.device,
                                "--tokenizer", tok, "--checkpoint", ck, "--checkpoint-only"),
                 done=ck / "model.safetensors")], ck, tok


def _pi(o: FullOptions) -> List[Step]:
    _refuse(o, "the pi family's bench", images="sends 480x640 frames", kernel_profile="has no eager kernel table")
    if o.views and len(o.views) > 1:
        raise ValueError("--views: the pi family's bench takes one camera count per run (bench_runtime --cameras)")
    steps, ck, tok = _pi_checkpoint(o)
    cfg, dtype = _config(o, ("full", "mid")), _dtype(o)
    if o.quant:
        q = ck.with_name(f"checkpoint-{o.quant}")
        steps.append(Step("quantize", ("-m", "phyai_ros.quant", "--checkpoint", ck, "--output", q, "--scheme", o.quant,
                                       "--device", o.device, "--dtype", dtype), done=q / "quantization.json"))
        ck = q
    env = _autotune(o, steps, ["--checkpoint", ck, "--tokenizer", tok])
    out = o.work / "bench.json"
    steps.append(Step("bench", (
        script("bench_runtime.py"), "--model", o.model, "--config", cfg, "--device", o.device, "--tokenizer", tok,
        "--checkpoint", ck, "--reuse-checkpoint", *_opt("--iters", o.iters), *_opt("--batches", o.batches),
        *_opt("--batch-iters", o.batch_iters), *([] if o.startup else ["--skip-startup"]),
        *_opt("--cameras", o.views[0] if o.views else None), *(["--keep-absent"] if o.keep_absent else []),
        *(["--host-profile"] if o.host_profile else []), "--out", out, *o.extra), out=out, env=env))
    if o.reference != "off":
        out = o.work / "reference.json"
        steps.append(Step("reference", (
            script("lerobot_reference.py"), "--policy", o.model,
            *_opt("--batches", None if o.batches is None else [b for b in o.batches if b != 1]),
            *_opt("--iters", o.iters), *([] if o.reference == "compile" else ["--no-compile"]), "--out", out),
            out=out))
    return steps


GROOT_VIEWS = (1, 2)   # bench_groot.py writes a one-view and a two-view checkpoint


def _groot_checkpoint(o: FullOptions) -> Tuple[List[Step], Path]:
    cfg = _config(o, ("full", "tiny"))
    root = o.root / f"groot_n17-{cfg}"
    return [Step("checkpoint", (script("bench_groot.py"), "--config", cfg, "--device", o.device, "--root", root,
                                "--views", "", "--skip-startup", "--no-profile", "--out", o.work / "checkpoint.json"),
                 done=root / "checkpoint_1view" / "model.safetensors")], root


def _groot(o: FullOptions) -> List[Step]:
    _refuse(o, "GR00T N1.7's bench", images="sends 480x640 frames (resized to 256x256)",
            quant="loads its own two checkpoints (bench a quantized folder with --checkpoint DIR)",
            keep_absent="takes every camera (no slot is masked)")
    if o.views and not set(o.views) <= set(GROOT_VIEWS):
        raise ValueError(f"--views: GR00T N1.7's bench has checkpoints of {' and '.join(map(str, GROOT_VIEWS))} views")
    if o.reference == "compile":
        raise ValueError("--reference compile: LeRobot has no compile option for GR00T N1.7 (--reference on)")
    cfg, _ = _config(o, ("full", "tiny")), _dtype(o)
    steps, root = _groot_checkpoint(o)
    views = o.views or list(GROOT_VIEWS)
    env = _autotune(o, steps, [a for v in views for a in ("--groot", root / f"checkpoint_{v}view{'s' * (v > 1)}")])
    out = o.work / "bench.json"
    steps.append(Step("bench", (
        script("bench_groot.py"), "--config", cfg, "--device", o.device, "--root", root, "--reuse-checkpoint",
        *_opt("--views", o.views), *_opt("--batches", o.batches), *_opt("--iters", o.iters),
        *_opt("--batch-iters", o.batch_iters), *([] if o.startup else ["--skip-startup"]),
        *([] if o.kernel_profile else ["--no-profile"]), *(["--host-profile"] if o.host_profile else []),
        "--out", out, *o.extra), out=out, env=env))
    if o.reference == "on":   # LeRobot 0.6.1's own GR00T, from the shared tools (lerobot wheels on PYTHONPATH)
        out = o.work / "reference.json"
        steps.append(Step("reference", (
            shared_tool("lerobot_groot_gpu.py"),
            *_opt("--batches", None if o.batches is None else [b for b in o.batches if b != 1]),
            *_opt("--iters", o.iters), *(["--cpu-smoke"] if o.device == "cpu" else []), "--out", out), out=out))
    return steps


def _cosmos3(o: FullOptions) -> List[Step]:
    _refuse(o, "Cosmos3's bench", views="has one camera (its image fills the canvas: --images)",
            keep_absent="has one camera", host_profile="has no host profile", kernel_profile="has no kernel table")
    if o.reference == "compile":
        raise ValueError("--reference compile: Cosmos3's reference is diffusers' pipeline, eager (--reference on)")
    cfg, _ = _config(o, ("full", "tiny")), _dtype(o)
    if o.autotune and cfg != "full":
        raise ValueError("--autotune: Cosmos3's shapes are profiled at full size")
    steps: List[Step] = []
    env = _autotune(o, steps, ["--cosmos3", "full"])
    out = o.work / "bench.json"
    steps.append(Step("bench", (
        script("bench_cosmos3.py"), "--config", cfg, "--device", o.device, "--root", o.root / "cosmos3",
        *_opt("--images", o.images), *_opt("--iters", o.iters),
        # batch 1 is always measured (per image size); --batches of the script are the others
        *_opt("--batches", None if o.batches is None else [b for b in o.batches if b != 1]),
        *_opt("--batch-iters", o.batch_iters), "--startup", "memory" if o.startup else "skip",
        "--diffusers", o.reference, *_opt("--quantized", o.quant), "--out", out, *o.extra), out=out, env=env))
    return steps


def _minicpm(o: FullOptions) -> List[Step]:
    _refuse(o, "MiniCPM-Robot's bench", views="sends three 480x640 views", images="sends three 480x640 views",
            quant="has no quantized path", keep_absent="takes every camera", host_profile="has no host profile",
            autotune="is not in profile_ops.py", batch_iters="times every batch --iters times")
    if o.reference == "compile":
        raise ValueError("--reference compile: MiniCPM-Robot's reference is transformers' model, eager (--reference on)")
    cfg, _ = _config(o, ("full", "tiny")), _dtype(o)
    out = o.work / "bench.json"
    return [Step("bench", (
        script("bench_minicpm.py"), "--config", cfg, "--device", o.device, "--root", o.root / f"minicpm_robot-{cfg}",
        *_opt("--iters", o.iters), *_opt("--batches", o.batches), "--reference", o.reference,
        "--startup", "on" if o.startup else "off", "--profile", "on" if o.kernel_profile else "off", "--out", out,
        *o.extra), out=out)]


PLANS: Dict[str, Callable[[FullOptions], List[Step]]] = {
    "pi05": _pi, "pi0": _pi, "groot_n17": _groot, "cosmos3": _cosmos3, "minicpm_robot": _minicpm}


def plan(o: FullOptions) -> List[Step]:
    """The steps of ``o.model``'s full-size bench; ValueError for a family without one or an option it lacks."""
    if o.model not in PLANS:
        raise ValueError(f"{o.model} has no full-size bench script: bench a checkpoint of it through the contract "
                         "(--checkpoint DIR, or --small)")
    _refuse(o, o.model, robots="is a --serve option", per_robot="is a --serve option")
    return PLANS[o.model](o)


# ---------------------------------------------------------------------------------------------- serving
def serve_plan(o: FullOptions, checkpoint: Optional[Path], needs_tokenizer: bool) -> List[Step]:
    """Ray Serve against the in-process runner (scripts/bench_serve.py) on ``checkpoint``, or on the family's
    full-size random checkpoint (pi0.5, pi0, GR00T N1.7), written first."""
    _refuse(o, "--serve", views="sends every camera", images="sends frames of the model's input size",
            quant="serves the checkpoint it is given (quantize it with python -m phyai_ros.quant)",
            reference="has no reference", startup="has no start-up figure", kernel_profile="has no kernel table",
            host_profile="has no host profile", keep_absent="sends every camera", autotune="runs no profile",
            batch_iters="runs every batch --iters times")
    steps: List[Step] = []
    tok = _tokenizer(o) if needs_tokenizer else None
    if checkpoint is None:
        if o.model in PI:
            steps, checkpoint, tok = _pi_checkpoint(o)
        elif o.model == "groot_n17":
            steps, root = _groot_checkpoint(o)
            checkpoint = root / "checkpoint_1view"
        else:
            raise ValueError(f"--serve: {o.model} has no full-size random checkpoint writer here (--checkpoint DIR)")
    out = o.work / "serve.json"
    steps.append(Step("serve", (
        script("bench_serve.py"), "--checkpoint", checkpoint, *_opt("--tokenizer", tok), "--device", o.device,
        "--dtype", o.dtype or ("bfloat16" if o.device == "cuda" else "float32"), *_opt("--batches", o.batches),
        *_opt("--runs", o.iters), *_opt("--robots", o.robots), *_opt("--per-robot", o.per_robot), "--out", out,
        *o.extra), out=out))
    return steps


__all__ = ["FullOptions", "PLANS", "plan", "serve_plan"]
