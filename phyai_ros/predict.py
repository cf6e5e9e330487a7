"""Offline prediction for pi0.5, pi0, GR00T N1.7 and Cosmos3: one command from raw inputs to an action chunk.

It checks any case stored in the parity-fixture format (phyai_ros/models/cases.py) against its expected outputs.
The policy family comes from the checkpoint folder (the registry, phyai_ros.models: config.json's type pi05, pi0,
groot; a Cosmos3 pipeline's model_index.json; any registered family); the family's adapter reads its own case
facts (``case_runner``), so every family takes the same flags:

    python -m phyai_ros.predict --checkpoint DIR [--tokenizer tokenizer.model] [--norm-stats norm_stats.json] \
        --inputs inputs.safetensors [--tasks-json inputs.json | --task "..."] [--noise noise.safetensors|KEY] \
        [--case NAME | --rtc linear|exp --inference-delay 3 --execution-horizon 10] \
        [--device cpu|cuda] [--dtype float32|bfloat16] --output actions.safetensors \
        [--expected expected.safetensors [--tolerance 1e-4]]

--tokenizer / --norm-stats: for families that read such files (pi0, pi0.5; GR00T N1.7 and Cosmos3 read their own
folders); --options: a family's run settings (Cosmos3: num_steps=4;guidance=3.0; a case carries its own).
Optional inputs: noise (x at the flow's start) and rtc.prev_chunk_left_over [B, n, D] (normalized action space,
as the fixtures; --prev-left-over-space robot for robot units). --case NAME takes that case's facts from
--tasks-json and compares against the expected keys prefixed "NAME." ("plain" = no prefix).
Output: actions [B, H, D] (robot units) and actions.model (the model's own action tensor).
Exit status: 0 done; 2 a bad argument or input file (one line on stderr), or --tolerance given and a compared
max-abs exceeds it (NaN exceeds every tolerance); 3 the model produced non-finite actions (nothing written).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from phyai_ros.layers.profiles import selector_for
from phyai_ros.models import family_for_checkpoint
from phyai_ros.models.cases import InputError, load_noise, read_case, require_finite_tensor, require_range
from phyai_ros.models.contract import DTYPES, ModelFiles, parse_options
from phyai_ros.models.files import read_safetensors_file
from phyai_ros.runtime.autotune import prepare_profile, show_progress


class NonFiniteOutput(Exception):
    """The model produced NaN/Inf actions: exit status 3, and no output file."""


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m phyai_ros.predict", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokenizer", default=None, help="tokenizer file, for families that read one (pi0, pi0.5)")
    p.add_argument("--norm-stats", default=None, help="statistics file, for families that read one (default: the "
                                                       "checkpoint's own)")
    p.add_argument("--inputs", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tasks-json", help="JSON with a 'tasks' list (one per batch item), e.g. fixture inputs.json")
    g.add_argument("--task", help="one task for every batch item")
    p.add_argument("--noise", default=None, help="safetensors file (key 'noise' or its only key) or a key of "
                                                 "--inputs; default: 'noise' in --inputs, else random (--seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--case", default=None, help="fixture case name (e.g. plain, rtc_linear, rtc_exp)")
    p.add_argument("--rtc", default=None, choices=["linear", "exp", "ones", "zeros"])
    p.add_argument("--inference-delay", type=int, default=None)
    p.add_argument("--execution-horizon", type=int, default=None)
    p.add_argument("--max-guidance", type=float, default=None)
    p.add_argument("--rtc-jacobian", default="identity", choices=["identity", "vjp"])
    p.add_argument("--prev-left-over", default="rtc.prev_chunk_left_over", help="key in --inputs")
    p.add_argument("--prev-left-over-space", default="normalized", choices=["normalized", "robot"])
    p.add_argument("--options", default="", help="the family's run settings, 'key=value;...' (node parameter "
                                                  "model.options)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--op-autotune", default="auto", choices=["auto", "on", "off"],
                   help="the node's model.op_autotune: where no operator profile matches this device, tune a "
                        "shortlist first and cache it (auto: on CUDA devices)")
    p.add_argument("--quant-plan", default="measured", choices=["measured", "all"],
                   help="the node's model.quant_plan (quantized checkpoints)")
    p.add_argument("--output", required=True)
    p.add_argument("--expected", default=None, help="safetensors with expected outputs (fixture layout)")
    p.add_argument("--expected-key", default=None, help="compare actions against this key instead of "
                                                        "[CASE.]actions.unnormalized")
    p.add_argument("--tolerance", type=float, default=None)
    return p.parse_args(argv)


def _compare(out, args, expected_keys, prefixed: bool = False) -> int:
    """Print max-abs against --expected (the family's ``expected_keys``, "<case>." prefixed); 2 when --tolerance is
    given and any comparison fails it (NaN fails every tolerance, and so does a comparison that could not be
    made). A batch-1 output is compared with an expected tensor stored without its batch dimension."""
    expected = read_safetensors_file(args.expected)
    prefix = "" if args.case in (None, "plain") else args.case + "."
    pairs = [("actions", args.expected_key)] if args.expected_key else \
        [(ours, prefix + theirs) for ours, theirs in expected_keys.items() if not prefixed or ours in out]
    failed = []
    for ours, key in pairs:
        if key not in expected:
            print(f"expected: no key {key} in {args.expected}")
            failed.append(f"no key {key}")
            continue
        mine = out[ours][0] if out[ours].shape[0] == 1 and out[ours].shape[1:] == expected[key].shape else out[ours]
        if tuple(expected[key].shape) != tuple(mine.shape):
            print(f"expected: {key} has shape {list(expected[key].shape)}, {ours} {list(out[ours].shape)}")
            failed.append(f"shape of {key}")
            continue
        diff = (mine.float() - expected[key].float()).abs().max().item()
        print(f"max-abs {ours} vs {key}: {diff:.3e}")
        if args.tolerance is not None and not diff <= args.tolerance:
            failed.append(f"max-abs {ours} {diff:.3e} > tolerance {args.tolerance:.1e}")
    if args.tolerance is not None and failed:
        print("FAIL: " + "; ".join(failed))
        return 2
    return 0


def _run(args) -> int:
    """With the device's operator profile (PHYAI_OP_PROFILE, else the cached or shipped one for this device, as
    the node finds it, else tuned at start as the node does: --op-autotune) in a selector of this call's own."""
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise InputError(f"--device {args.device}: {exc}") from None
    selector, choice = selector_for(device)
    with selector.active():
        return _predict(args, selector, choice)


def _predict(args, selector, choice) -> int:
    require_range("--tolerance", args.tolerance, 0.0)
    require_range("--seed", args.seed, 0, 2**63 - 1)
    case = read_case(args.inputs, args.tasks_json, args.task, case=args.case, rtc=args.rtc,
                     inference_delay=args.inference_delay, execution_horizon=args.execution_horizon,
                     max_guidance=args.max_guidance, rtc_jacobian=args.rtc_jacobian,
                     prev_left_over=args.prev_left_over, prev_left_over_space=args.prev_left_over_space)
    cls = family_for_checkpoint(args.checkpoint)
    files = ModelFiles.of(args.tokenizer, args.norm_stats)   # each family's load refuses a file it does not read
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {args.device}: no CUDA device is available")
    if args.dtype == "float32":   # IEEE fp32: no TF32 in cuBLAS's GEMMs nor in cuDNN's convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    adapter = cls.load(args.checkpoint, files, device=args.device, dtype=DTYPES[args.dtype],
                       options=parse_options(args.options))
    show_progress()
    prepare_profile(selector, choice, adapter, args.device, DTYPES[args.dtype], autotune=args.op_autotune,
                    quant_plan=args.quant_plan)
    noise = load_noise(args.noise, case.inputs)
    if noise is None:   # the family draws its own (its shape may follow the observation)
        noise = torch.Generator().manual_seed(args.seed)
    else:
        require_finite_tensor(f"--noise {args.noise}" if args.noise else f"--inputs {args.inputs} noise", noise)
    return _run_and_save(args, adapter.case_runner(case, noise), f", {cls.family}", cls.expected_keys,
                         cls.prefixed_outputs)


def _run_and_save(args, infer, label: str, expected_keys, prefixed: bool = False) -> int:
    """The tail every policy type shares: time ``infer()`` (-> ({"actions", "actions.model", ...}, metadata), from
    the raw inputs on), refuse non-finite outputs (exit 3, nothing written), save (float tensors as float32,
    integer ones as they are; under "<case>." where the family's outputs are ``prefixed``), print, compare with
    --expected."""
    t0 = time.perf_counter()
    tensors, metadata = infer()
    if str(args.device).startswith("cuda"):
        torch.cuda.synchronize()
    dt_ms = (time.perf_counter() - t0) * 1e3
    out = {key: (t.detach().to("cpu", torch.float32) if t.is_floating_point() else t.detach().to("cpu")).clone()
           for key, t in tensors.items()}   # own storage each
    for key, t in out.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise NonFiniteOutput(f"the model produced non-finite {key}: {bad} NaN/Inf of {t.numel()} values "
                                  f"(checkpoint {args.checkpoint}); nothing written to {args.output}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{args.case}." if prefixed and args.case not in (None, "plain") else ""
    save_file({prefix + k: v for k, v in out.items()}, args.output,
              metadata={k: json.dumps(v) for k, v in metadata.items()})
    print(f"actions {list(out['actions'].shape)} actions.model {list(out['actions.model'].shape)} "
          f"({dt_ms:.1f} ms incl. preprocessing, {args.device} {args.dtype}{label}) -> {args.output}")
    return _compare(out, args, expected_keys, prefixed) if args.expected else 0


def main(argv=None) -> int:
    """Exit status as the module docstring says; errors are one line on stderr, never a traceback."""
    args = _parse(argv)
    try:
        return _run(args)
    except NonFiniteOutput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (InputError, OSError, ValueError, KeyError) as exc:  # the loaders' messages name the file / input
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
