#!/usr/bin/env python3
"""Accuracy of each quantization scheme and quantized part: action error against an unquantized reference.

    python scripts/quant_accuracy.py --fixtures            # CPU, fp32: pi0.5 and pi0 parity fixtures vs LeRobot
    python scripts/quant_accuracy.py --full --model pi05   # CUDA, bf16: full size, random weights vs bf16

Both modes use the same inputs and noise for reference and quantized runs. Errors are relative to the action
scale, the largest |action| of the reference (robot units with the fixtures; the normalized model space at full
size, where there are no statistics): max-abs and RMS. The RTC row repeats the guided case (d = 3 frozen
actions, linear schedule, 10 of horizon) and reports how far the sampled chunk's frozen prefix is from the
previous chunk it must follow, quantized vs reference (the node splices the prefix either way; guidance keeps
the seam smooth). Prints a markdown table and writes JSON to --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from phyai_ros.layers.quantized import QuantScheme, apply_calibration, calibrating  # noqa: E402
from phyai_ros.layers.selector import SELECTOR, OperatorSelector  # noqa: E402
from phyai_ros.models.pi.quantization import quantize_model  # noqa: E402

# (label, scheme, parts); static W8A8 is calibrated on the run's own observations (in-sample).
CASES = [
    ("w8a16 int8", QuantScheme.make("w8a16"), ("expert",)),
    ("w8a16 int8", QuantScheme.make("w8a16"), ("prefix",)),
    ("w8a16 int8", QuantScheme.make("w8a16"), ("vision",)),
    ("w8a16 fp8", QuantScheme.make("w8a16", "fp8"), ("expert",)),
    ("w8a8 dynamic", QuantScheme.make("w8a8"), ("vision",)),
    ("w8a8 dynamic", QuantScheme.make("w8a8"), ("prefix",)),
    ("w8a8 dynamic", QuantScheme.make("w8a8"), ("expert",)),
    ("w8a8 dynamic", QuantScheme.make("w8a8"), ("vision", "prefix", "expert")),
    ("w8a8 static", QuantScheme.make("w8a8", activations="static"), ("vision", "prefix", "expert")),
    ("w4a16 g128", QuantScheme.make("w4a16", group=128), ("expert",)),
    ("w4a16 g128", QuantScheme.make("w4a16", group=128), ("prefix",)),
]
FIXTURE_GROUP = 32   # the fixture models' expert is 64 wide: int4 groups of 32 columns


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    scale = ref.abs().max().item()
    d = (out.float() - ref.float())
    return {"max_abs_rel": d.abs().max().item() / scale, "rms_rel": d.pow(2).mean().sqrt().item() / scale,
            "scale": scale}


def prefix_gap(actions: torch.Tensor, prev: torch.Tensor, d: int) -> float:
    """max |a[:d] - prev[:d]| over the frozen prefix, relative to prev's largest |value|."""
    a = actions[..., :d, :prev.shape[-1]]
    return ((a - prev[..., :d, :]).abs().max() / prev.abs().max()).item()


# ----------------------------------------------------------------------------- fixtures (CPU fp32)
def fixture_rows(policy_type: str) -> list:
    from phyai_ros.fixtures import fixtures_dir, tokenizer_path
    from phyai_ros.models import family
    from phyai_ros.models.files import read_safetensors_file
    fx = fixtures_dir() / policy_type
    meta = json.loads((fx / "inputs.json").read_text())
    inp = read_safetensors_file(fx / "inputs.safetensors")
    exp = read_safetensors_file(fx / "expected.safetensors")
    images = {k.split("raw.observation.images.")[1]: v.numpy() for k, v in inp.items() if "images." in k}
    state = inp["raw.observation.state"].numpy()
    base = family(policy_type).from_files(fx / "checkpoint", tokenizer_path(), fx / "norm_stats.json")
    case = next(c for c in meta["rtc"] if c["name"] == "rtc_linear")
    prev = inp["rtc.prev_chunk_left_over"]

    def run(policy):
        x = policy.prepare(images, state, meta["tasks"])
        plain = policy.unnormalize_actions(policy.sample_actions(x, inp["noise"]))
        rtc = policy.rtc_tensors(prev, case["inference_delay"], case["execution_horizon"], "linear",
                                 case["max_guidance_weight"])
        return plain, policy.sample_actions(x, inp["noise"], rtc)

    ref_plain = exp["actions.unnormalized"]
    _, ref_rtc = run(base)
    rows = [{"model": policy_type, "scheme": "fp32 (ours)", "parts": "-", **errors(run(base)[0], ref_plain),
             "rtc_prefix_gap": prefix_gap(ref_rtc, prev, case["inference_delay"])}]
    for label, scheme, parts in CASES:
        if scheme.group:
            scheme = QuantScheme.make(scheme.name, group=FIXTURE_GROUP)
            label = f"{scheme.name} g{FIXTURE_GROUP}"
        policy = copy.deepcopy(base)
        done, skipped = quantize_model(policy.model, scheme, parts)
        if scheme.activations == "static":
            with OperatorSelector(candidates=SELECTOR.candidates, forced="torch").active(), calibrating() as seen:
                run(policy)
            apply_calibration(seen)
        plain, rtc = run(policy)
        rows.append({"model": policy_type, "scheme": label, "parts": "+".join(parts), "weights": len(done),
                     "skipped": len(skipped), **errors(plain, ref_plain),
                     "rtc_prefix_gap": prefix_gap(rtc, prev, case["inference_delay"]),
                     "rtc_vs_reference": errors(rtc, ref_rtc)["max_abs_rel"]})
    return rows


# ----------------------------------------------------------------------------- full size (CUDA bf16)
def full_rows(policy_type: str, batch: int = 1) -> list:
    from phyai_ros.models.pi import pi0, pi05
    from phyai_ros.models.pi.pi0 import checkpoint as pi0_ckpt
    from phyai_ros.models.pi.pi05 import checkpoint as pi05_ckpt
    from phyai_ros.models.pi.modeling import solver
    from phyai_ros.models.pi.runner import FlowRunner
    cfg_cls, ckpt = {"pi05": (pi05.Pi05Config, pi05_ckpt), "pi0": (pi0.Pi0Config, pi0_ckpt)}[policy_type]
    cfg = cfg_cls()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    model = (ckpt.Pi05Model if policy_type == "pi05" else ckpt.Pi0Model)(cfg, torch.bfloat16, dev)
    shapes = ckpt.lerobot_key_shapes(cfg)
    sd = {k: (torch.randn(s, generator=g, device=dev) * 0.02) for k, s in sorted(shapes.items())}
    ckpt.load_state_dict(model, sd)
    del sd
    n_cam = 3
    size = cfg.siglip.image_size
    images = torch.rand(batch, n_cam, 3, size, size, generator=g, device=dev) * 2 - 1
    image_masks = torch.ones(batch, n_cam, dtype=torch.bool, device=dev)
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.token_budget), generator=g, device=dev)
    token_masks = torch.zeros(batch, cfg.token_budget, dtype=torch.bool, device=dev)
    token_masks[:, :40] = True
    state = torch.randn(batch, cfg.max_state_dim, generator=g, device=dev) * 0.5
    noise = torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, generator=g, device=dev)
    d, horizon = 3, 10

    def run(m):
        runner = FlowRunner(m, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                            state_dim=cfg.max_state_dim)
        bucket = runner.set_observation(images, image_masks, tokens, token_masks, state)
        plain = runner.sample(bucket, noise).float().clone()
        prev = plain[:, 5:5 + 25].clone()        # "the previous chunk": the plain chunk shifted by 5 actions
        rtc = solver.build_rtc_tensors(prev, d, horizon, cfg.chunk_size, cfg.max_action_dim, cfg.num_steps,
                                       "linear", 10.0, "identity", "guided")
        guided = runner.sample(runner.set_observation(images, image_masks, tokens, token_masks, state), noise,
                               rtc).float().clone()
        return plain, guided, prev

    with torch.no_grad():
        ref_plain, ref_rtc, prev = run(model)
    rows = [{"model": policy_type, "scheme": "bf16", "parts": "-", "max_abs_rel": 0.0, "rms_rel": 0.0,
             "scale": ref_plain.abs().max().item(), "rtc_prefix_gap": prefix_gap(ref_rtc, prev, d)}]
    for label, scheme, parts in CASES:
        m = copy.deepcopy(model)
        done, skipped = quantize_model(m, scheme, parts)
        with torch.no_grad():
            if scheme.activations == "static":
                with OperatorSelector(candidates=SELECTOR.candidates, forced="torch").active(), \
                        calibrating() as seen:
                    run(m)
                apply_calibration(seen)
            plain, rtc, _ = run(m)
        rows.append({"model": policy_type, "scheme": label, "parts": "+".join(parts), "weights": len(done),
                     "skipped": len(skipped), **errors(plain, ref_plain), "rtc_prefix_gap": prefix_gap(rtc, prev, d),
                     "rtc_vs_reference": errors(rtc, ref_rtc)["max_abs_rel"]})
        print(rows[-1], flush=True)
        del m
        torch.cuda.empty_cache()
    return rows


def table(rows: list) -> str:
    head = ("| model | scheme | parts | max-abs / scale | RMS / scale | RTC prefix gap | RTC chunk vs ref |\n"
            "| --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['model']} | {r['scheme']} | {r['parts']} | {100 * r['max_abs_rel']:.2f}% | "
                     f"{100 * r['rms_rel']:.3f}% | {100 * r['rtc_prefix_gap']:.2f}% | "
                     f"{100 * r['rtc_vs_reference']:.2f}% |" if "rtc_vs_reference" in r else
                     f"| {r['model']} | {r['scheme']} | {r['parts']} | {100 * r['max_abs_rel']:.2f}% | "
                     f"{100 * r['rms_rel']:.3f}% | {100 * r['rtc_prefix_gap']:.2f}% | - |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fixtures", action="store_true")
    mode.add_argument("--full", action="store_true")
    ap.add_argument("--model", default="pi05,pi0")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "quant_accuracy.json")
    args = ap.parse_args()
    if args.full and not torch.cuda.is_available():
        print("quant_accuracy --full: no CUDA device; nothing to measure")
        return
    t = time.perf_counter()
    rows = []
    for m in args.model.split(","):
        rows += fixture_rows(m) if args.fixtures else full_rows(m)
    md = table(rows)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"mode": "fixtures" if args.fixtures else "full", "date": time.strftime("%Y-%m-%d"),
                                    "device": torch.cuda.get_device_name() if args.full else "cpu",
                                    "rows": rows, "seconds": time.perf_counter() - t}, indent=1))


if __name__ == "__main__":
    main()
