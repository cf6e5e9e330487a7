"""python -m phyai_ros.bench: the one entry point for the benchmarks of docs/benchmarks.md.

    python -m phyai_ros.bench MODEL [--small | --checkpoint DIR] [--serve] [options] [-- SCRIPT ARGS...]
    python -m phyai_ros.bench TOOL [ARGS...]

MODEL is a registered policy family (pi05, pi0, groot_n17, cosmos3, minicpm_robot, or a plugin's). What is
benched:

  --small            the family's small random checkpoint (the registry's make_small_checkpoint), through the
                     adapter contract (load, use_runner, capture_buckets, predict, the serve engine's rows):
                     runs anywhere, the CPU included
  --checkpoint DIR   that checkpoint folder, through the same contract (a real, quantized or robot checkpoint)
  (neither)          full size: random full-size weights drawn on the device, the family's bench script (stages
                     against their roofline floors, batches, start-up, the reference in the same call); with
                     --device cpu --config mid|tiny the same script's smoke run
  --serve            the same model behind Ray Serve (scripts/bench_serve.py): Q(B) served vs in-process, the
                     serving path's added latency, N robots at once

TOOL runs one of the other benchmarks of docs/benchmarks.md with ARGS as its script takes them (listed below).
One JSON record per run (--out; default $OUT/bench_MODEL_KIND.json, else under --root): the figures, the device,
torch, the date, the commit, the PHYAI_* environment and the command. Exit status 0, 1 when a step failed or a
chunk was not finite, 2 for a bad argument (one line).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from .scripts import TOOLS, run_steps, run_tool

PROG = "python -m phyai_ros.bench"


class BadArgument(ValueError):
    """A bad argument or input: one line, exit status 2."""


def _ints(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,8,32")
    return values


def _sizes(text: str) -> List[str]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        h, sep, w = item.partition("x")
        if not (sep and h.isdigit() and w.isdigit() and int(h) > 0 and int(w) > 0):
            raise argparse.ArgumentTypeError(f"{item!r} is not HxW (e.g. 480x640)")
        out.append(f"{int(h)}x{int(w)}")
    if not out:
        raise argparse.ArgumentTypeError("give at least one HxW size")
    return out


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def parser() -> argparse.ArgumentParser:
    tools = "\n".join(f"  {name:18} {what} (scripts/{path})" for name, (path, what) in TOOLS.items())
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog="tools (TOOL ARGS...):\n" + tools,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="a registered policy family (or a TOOL, see below)")
    what = p.add_argument_group("what is benched").add_mutually_exclusive_group()
    what.add_argument("--small", action="store_true", help="the family's small random checkpoint (contract)")
    what.add_argument("--checkpoint", type=Path, metavar="DIR", help="this checkpoint folder (contract)")
    p.add_argument("--serve", action="store_true", help="behind Ray Serve (with --small / --checkpoint, or full size)")
    m = p.add_argument_group("measurement")
    m.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto: cuda when there is one")
    m.add_argument("--dtype", choices=("bfloat16", "float32"),
                   help="default bfloat16 on CUDA, float32 on the CPU (the full-size scripts run only those)")
    m.add_argument("--batches", type=_ints, metavar="1,8,32", help="batch sizes (contract default: 1; full size: "
                   "the script's own)")
    m.add_argument("--iters", type=_positive, metavar="N", help="timed batch-1 calls (contract default 10 on the "
                   "CPU, 200 on CUDA; full size: the script's own)")
    m.add_argument("--batch-iters", type=_positive, metavar="N", help="timed calls per batch size")
    m.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed calls first (contract)")
    m.add_argument("--views", type=_ints, metavar="1,2", help="cameras sending frames (the others absent); "
                   "default: every camera of the checkpoint")
    m.add_argument("--images", type=_sizes, metavar="HxW[,HxW]", help="camera frame sizes (contract default 480x640; "
                   "full size: Cosmos3's canvas content)")
    m.add_argument("--profile", default="shipped", metavar="shipped|none|PATH",
                   help="operator profile: the device's own (cached, else shipped) as a node finds it, none (the "
                        "selector's defaults: an A/B baseline), or this file (sets PHYAI_OP_PROFILE)")
    m.add_argument("--quant", default="none", metavar="none|w8a8|w8a16|w4a16",
                   help="quantize the checkpoint first (python -m phyai_ros.quant; Cosmos3 full size: its "
                        "generation pathway), bench the quantized one")
    m.add_argument("--options", default="", metavar="K=V;...", help="model options, as the node's model.options "
                   "(contract)")
    m.add_argument("--tokenizer", type=Path, metavar="FILE", help="the families that read one (pi): default the "
                   "shared fixtures' (PHYAI_PARITY_FIXTURES)")
    f = p.add_argument_group("full size (the family scripts)")
    f.add_argument("--config", choices=("full", "mid", "tiny"), help="the script's smaller model (pi: mid, the "
                   "others: tiny): a smoke run, e.g. on the CPU")
    f.add_argument("--startup", action="store_true", help="start-up to the first chunk in a fresh process")
    f.add_argument("--kernel-profile", action="store_true", help="eager per-stage kernel tables (GR00T, MiniCPM)")
    f.add_argument("--host-profile", action="store_true", help="cProfile of the host path (pi, GR00T)")
    f.add_argument("--keep-absent", action="store_true", help="pi: absent cameras computed masked, not skipped")
    f.add_argument("--reference", default="off", choices=("off", "on", "compile"),
                   help="the reference in the same call: LeRobot (pi: eager, compile adds torch.compile; GR00T: "
                        "../shared/tools), diffusers (Cosmos3), transformers (MiniCPM)")
    f.add_argument("--autotune", type=Path, metavar="FILE", help="profile the model's ops into FILE (merged; seeded "
                   "from --profile PATH when FILE is new), then bench on it")
    f.add_argument("--autotune-ops", metavar="OP[,OP]", help="only these ops (profile_ops.py --ops)")
    f.add_argument("--autotune-fast", type=float, metavar="SECONDS", help="with --autotune: the start-up autotune's "
                   "bounded form (shortlists from the shipped profiles, within SECONDS) instead of every candidate")
    f.add_argument("--fresh", action="store_true", help="write the random full-size checkpoint again")
    s = p.add_argument_group("serving (--serve)")
    s.add_argument("--robots", type=int, metavar="N", help="robots at once, each its own client")
    s.add_argument("--per-robot", type=_positive, metavar="N", help="requests each robot sends")
    o = p.add_argument_group("output")
    o.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "phyai_bench",
                   help="where random checkpoints are written (full size: reused)")
    o.add_argument("--out", type=Path, metavar="FILE.json", help="the record")
    o.add_argument("--dry-run", action="store_true", help="print the steps a full-size / serve run would run")
    return p


# Options only one kind of run reads: giving one to the other kind is an error, not a silent no-op.
FULL_ONLY = {"config": "a full-size script's smaller model", "startup": "a fresh process's start-up (the contract "
             "bench records load, capture and first chunk in-process)", "kernel_profile": "a family script's",
             "host_profile": "a family script's", "keep_absent": "the pi script's", "reference": "a family script's",
             "autotune": "a family script's", "autotune_ops": "a family script's",
             "autotune_fast": "a family script's", "fresh": "a full-size checkpoint's"}
CONTRACT_ONLY = {"options": "the contract bench's"}


def _check_kind(a, kind: str) -> None:
    table = FULL_ONLY if kind == "contract" else CONTRACT_ONLY
    for name, what in table.items():
        if getattr(a, name) not in (None, False, "", "off"):
            flag = "--" + name.replace("_", "-")
            raise BadArgument(f"{flag} is {what}: not for a {kind} run"
                              + (" (drop --small / --checkpoint)" if kind == "contract" else ""))
    if kind != "serve" and (a.robots is not None or a.per_robot is not None):
        raise BadArgument("--robots / --per-robot are --serve options")


def _set_profile(value: str) -> None:
    """PHYAI_OP_PROFILE as --profile says, before anything imports the layers (the module selector reads it at
    import) and for every child process."""
    if value == "shipped":
        os.environ.pop("PHYAI_OP_PROFILE", None)
    elif value == "none":
        os.environ["PHYAI_OP_PROFILE"] = "none"
    else:
        path = Path(value)
        if not path.is_file():
            raise BadArgument(f"--profile {value}: no such file (shipped, none or a profile file)")
        os.environ["PHYAI_OP_PROFILE"] = str(path.resolve())


def _device(value: str) -> str:
    import torch
    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cuda" and not torch.cuda.is_available():
        raise BadArgument("--device cuda: no CUDA device here (--device cpu with --small, or --config mid/tiny)")
    return value


def _out_path(a, kind: str) -> Path:
    if a.out is not None:
        return a.out
    base = Path(os.environ["OUT"]) if os.environ.get("OUT") else a.root
    return base / f"bench_{a.model}_{kind}.json"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        return run_tool(argv[0], argv[1:])
    extra: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = parser()
    a = p.parse_args(argv)
    try:
        return _run(a, argv, extra)
    except BadArgument as exc:
        p.error(str(exc))
    except (ValueError, FileNotFoundError) as exc:   # a checkpoint, a script, a tool that refused: one line
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 2


def _run(a, argv: List[str], extra: List[str]) -> int:
    _set_profile(a.profile)
    from phyai_ros.layers.quantized import SCHEMES     # the layers after PHYAI_OP_PROFILE is set
    from phyai_ros.models import family, family_names
    if a.model not in family_names():
        raise BadArgument(f"MODEL {a.model!r} is not a registered family ({', '.join(family_names())}) nor a tool "
                          f"({', '.join(TOOLS)})")
    if a.quant not in ("none", *SCHEMES):
        raise BadArgument(f"--quant {a.quant}: one of none, {', '.join(SCHEMES)}")
    quant = None if a.quant == "none" else a.quant
    kind = "serve" if a.serve else "contract" if (a.small or a.checkpoint) else "full"
    _check_kind(a, kind)
    if extra and kind == "contract":
        raise BadArgument(f"arguments after '--' ({' '.join(extra)}) go to a family script: not for a contract run")
    if a.checkpoint is not None and not a.checkpoint.is_dir():
        raise BadArgument(f"--checkpoint {a.checkpoint}: no such folder")
    device = "cuda" if a.dry_run and a.device in ("auto", "cuda") and kind == "full" else _device(a.device)
    if kind == "full" and device == "cpu" and a.config in (None, "full"):
        raise BadArgument("full size on the CPU: use --small (the contract bench) or --config mid/tiny (the "
                          "family script's smoke run)")
    from phyai_ros.models.contract import parse_options
    try:
        options = parse_options(a.options)
    except ValueError as exc:
        raise BadArgument(f"--options: {exc}") from None
    out = _out_path(a, kind)
    record_options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    if kind == "contract":
        return _contract(a, argv, device, quant, options, out, record_options)
    return _scripted(a, argv, extra, kind, device, quant, out, record_options, family(a.model))


def _contract(a, argv, device: str, quant, options, out: Path, record_options: dict) -> int:
    from . import adapter_bench
    from .record import device_name, make_record, write_record
    cuda = device == "cuda"
    o = adapter_bench.ContractOptions(
        model=a.model, checkpoint=a.checkpoint, root=a.root, device=device,
        dtype=a.dtype or ("bfloat16" if cuda else "float32"), views=a.views,
        images=[tuple(int(v) for v in s.split("x")) for s in a.images or ["480x640"]], batches=a.batches or [1],
        iters=a.iters or (200 if cuda else 10), batch_iters=a.batch_iters or (50 if cuda else 3),
        warmup=max(0, a.warmup), quant=quant, options=options, tokenizer=a.tokenizer)
    try:
        adapter_bench.check(o)
    except ValueError as exc:
        raise BadArgument(str(exc)) from None
    if a.dry_run:
        print(f"{PROG}: the contract bench of {a.model} (nothing to plan; --dry-run runs nothing)")
        return 0
    result = adapter_bench.run(o)
    write_record(out, make_record(argv, a.model, "contract", device_name(device), record_options, result))
    return 0 if all(r["finite"] for r in result["runs"]) else 1


def _scripted(a, argv, extra, kind: str, device: str, quant, out: Path, record_options: dict, cls) -> int:
    from . import full_size
    from .record import device_name, make_record, write_record
    work = Path(tempfile.mkdtemp(prefix="phyai_bench_steps_"))
    o = full_size.FullOptions(
        model=a.model, root=a.root, work=work, device=device, dtype=a.dtype, config=a.config, batches=a.batches,
        iters=a.iters, batch_iters=a.batch_iters, views=a.views, images=a.images, quant=quant,
        reference=a.reference, startup=a.startup, kernel_profile=a.kernel_profile, host_profile=a.host_profile,
        keep_absent=a.keep_absent, autotune=a.autotune.resolve() if a.autotune else None,
        autotune_ops=a.autotune_ops, autotune_fast=a.autotune_fast, tokenizer=a.tokenizer, robots=a.robots,
        per_robot=a.per_robot, extra=extra)
    try:
        if kind == "serve":
            checkpoint = a.checkpoint
            if a.small and not a.dry_run:
                from . import checkpoints
                checkpoint = checkpoints.small(a.model, a.root)
            elif a.small:
                checkpoint = a.root / f"{a.model}-small"
            steps = full_size.serve_plan(o, checkpoint, "tokenizer" in cls.needs_files)
        else:
            steps = full_size.plan(o)
    except ValueError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise BadArgument(str(exc)) from None
    if o.autotune and not o.autotune.exists() and os.environ.get("PHYAI_OP_PROFILE", "none") != "none" \
            and not a.dry_run:
        shutil.copyfile(os.environ["PHYAI_OP_PROFILE"], o.autotune)   # the profile round's copy of its base
    done, rc = run_steps(steps, fresh=a.fresh, dry_run=a.dry_run)
    if a.dry_run:
        shutil.rmtree(work, ignore_errors=True)
        return 0
    result = {s.name: json.loads(s.out.read_text()) for s in steps if s.out is not None and s.out.is_file()}
    shutil.rmtree(work, ignore_errors=True)
    write_record(out, make_record(argv, a.model, kind, device_name(device), record_options, result, done))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
