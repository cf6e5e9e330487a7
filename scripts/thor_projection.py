#!/usr/bin/env python3
"""The Thor projection (stage model, phyai_ros/runtime/projection.py) as a Markdown table, for pi0.5 and pi0 in
bf16 and issue 15's weight schemes per part:

    python3 scripts/thor_projection.py                       # built-in H200 stage times (2026-12-01)
    python3 scripts/thor_projection.py --measured pi05=/tmp/bench.json --measured pi0=/tmp/bench0.json

--plan PROFILE --scheme W8A8-FP8 adds the row of a measured quantized plan (model.quant_plan: measured): per
part, the share of GEMM weights the device profile's quantized ops run quantized rather than on their bf16 copy
(runtime.projection.plan_formats), e.g. the start-up autotune's cache of the robot, or an H100 profile to see what
its choices would save on the Thor's bandwidth.

--measured takes a ``scripts/bench_runtime.py`` JSON (its "stages" ms and its prefix length), or the record of
``python -m phyai_ros.bench pi05`` / ``pi0`` holding one, instead of the built-in figures. No GPU needed: it is
arithmetic on the measured times and the logical FLOPs and bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phyai_ros.models.pi import pi0, pi05  # noqa: E402
from phyai_ros.layers.selector import ProfileError, read_profile  # noqa: E402
from phyai_ros.runtime.projection import (DEVICES, H200, MEASURED_H200, STAGES, StageTimes, formats_for,  # noqa: E402
                                          plan_formats, project, total)
from phyai_ros.runtime.roofline import BF16, SCHEMES, W4A16, W8A8_FP8, W8A16  # noqa: E402

MODELS = {"pi05": ("pi0.5", pi05.Pi05Config, False), "pi0": ("pi0", pi0.Pi0Config, True)}
# (label, parts, formats): bf16, each scheme on the expert alone (Thor's bandwidth-bound loop) and everywhere, and
# FP8 where Thor is compute-bound (vision, prefix) with 4-bit weights where it is bandwidth-bound (the expert).
ROWS = [("bf16", "all bf16", formats_for(BF16))] + [
    (s.name, ", ".join(parts), formats_for(s, parts)) for s in (W8A16, W8A8_FP8, W4A16)
    for parts in (("expert",), ("vision", "prefix", "expert"))] + [
    ("mixed", "W8A8-FP8 vision, prefix; W4A16 expert",
     {"vision": W8A8_FP8, "prefix": W8A8_FP8, "expert": W4A16})]


def measured_from(path: Path, cameras: int = 3) -> tuple[StageTimes, int]:
    """Stage times and prompt token count of a bench_runtime.py JSON (or of the record of ``python -m
    phyai_ros.bench pi05``, which holds it as its bench step's result)."""
    d = json.loads(path.read_text())
    if d.get("bench") == "phyai_ros.bench":
        d = d["result"]["bench"]
    st = d["stages"]
    budget = d["prefix_len_run"] - cameras * 256
    return StageTimes(st["vision"]["ms"] / 1e3, st["prefix"]["ms"] / 1e3, st["loop"]["ms"] / 1e3,
                      f"{path} ({d.get('device', '?')}, {d.get('date', '?')})"), budget


def ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", action="append", default=[], metavar="MODEL=JSON",
                    help="bench_runtime.py output for pi05 or pi0 (default: the built-in 2026-12-01 figures)")
    ap.add_argument("--target", default="thor", choices=tuple(DEVICES))
    ap.add_argument("--plan", type=Path, metavar="PROFILE", help="a device profile holding a measured quantized plan")
    ap.add_argument("--signature", help="its device (default: the first the file holds)")
    ap.add_argument("--scheme", default="W8A8-FP8", choices=[n for n in SCHEMES if n != "bf16"],
                    help="the plan's scheme")
    args = ap.parse_args()
    target = DEVICES[args.target]
    rows = list(ROWS)
    if args.plan:
        try:
            data = read_profile(args.plan)
        except ProfileError as exc:
            raise SystemExit(f"thor_projection: {exc}") from None
        signature = args.signature or next(iter(data["devices"]), None)
        if signature not in data["devices"]:
            raise SystemExit(f"thor_projection: {args.plan} has no table for {signature}")
        rows.append(("plan", f"{args.scheme} where {signature.rsplit(':', 1)[-1]}'s profile runs it quantized",
                     lambda cfg: plan_formats(data["devices"][signature], SCHEMES[args.scheme], cfg.siglip.width,
                                              leading={1, 3})))   # batch 1's calls (3 cameras: the tower's 3 rows)
    given = dict(m.split("=", 1) for m in args.measured)
    print(f"Stage model: {H200.name} (spec) -> {target.name}; bf16 {target.peak['bf16'] / 1e12:.0f} / fp8 "
          f"{target.peak['fp8'] / 1e12:.0f} TFLOP/s dense, {target.bandwidth / 1e9:.0f} GB/s. Batch 1, 3 cameras.\n")
    for key, (name, cls, state_token) in MODELS.items():
        cfg = cls()
        measured = MEASURED_H200[key]
        if key in given:
            measured, budget = measured_from(Path(given[key]))
            cfg = cfg.replace(token_budget=budget)
        base = project(cfg, measured, state_token=state_token, target=target)
        print(f"{name} (prefix {cfg.prefix_len(3)} tokens); H200 times: {measured.source}\n")
        print("| stage | H200 measured ms | H200 floor ms | efficiency | Thor floor ms (bf16) | Thor bound |")
        print("| --- | --- | --- | --- | --- | --- |")
        for s in STAGES:
            p = base[s]
            print(f"| {s} | {1e3 * p.measured_s:.2f} | {1e3 * p.source_floor_s:.2f} | {p.efficiency:.2f} | "
                  f"{1e3 * p.floor_s:.2f} | {p.bound} |")
        print(f"\n| {name} weights | parts | {target.name} floor ms (vision / prefix / loop = total) | projected ms "
              f"(floor / efficiency) | floor + H200 gap ms | H200 projected ms |")
        print("| --- | --- | --- | --- | --- | --- |")
        for label, parts, formats in rows:
            formats = formats(cfg) if callable(formats) else formats
            if label == "plan":
                parts += " (" + ", ".join(f"{p} {f.name.split('(')[-1].split()[0]}" for p, f in formats.items()) + ")"
            thor = project(cfg, measured, formats, state_token=state_token, target=target)
            h200 = project(cfg, measured, formats, state_token=state_token, target=H200)
            split = " / ".join(ms(thor[s].floor_s) for s in STAGES)
            proj = " / ".join(ms(thor[s].projected_s) for s in STAGES)
            print(f"| {label} | {parts} | {split} = **{ms(total(thor, 'floor_s'))}** | "
                  f"{proj} = **{ms(total(thor, 'projected_s'))}** | {ms(total(thor, 'floor_plus_gap_s'))} | "
                  f"{1e3 * total(h200, 'projected_s'):.2f} |")
        print()
    print("A camera absent (the runner skips an absent tail of camera slots, 256 prefix rows and one vision pass "
          "each), bf16, the same efficiencies:\n")
    print(f"| model | cameras computed | prefix tokens | H200 projected ms (vision / prefix / loop = total) | "
          f"{target.name} floor ms (vision / prefix / loop = total) | {target.name} floor + H200 gap ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, (name, cls, state_token) in MODELS.items():
        cfg, measured = cls(), MEASURED_H200[key]
        for run in (3, 2, 1):
            h200 = project(cfg, measured, state_token=state_token, target=H200, cameras_run=run)
            thor = project(cfg, measured, state_token=state_token, target=target, cameras_run=run)
            split = " / ".join(ms(h200[s].projected_s) for s in STAGES)
            floor = " / ".join(ms(thor[s].floor_s) for s in STAGES)
            print(f"| {name} | {run} | {cfg.prefix_len(run)} | {split} = **{1e3 * total(h200, 'projected_s'):.2f}** | "
                  f"{floor} = {ms(total(thor, 'floor_s'))} | {ms(total(thor, 'floor_plus_gap_s'))} |")
    print()


if __name__ == "__main__":
    main()
