"""Quantize a pi0.5 / pi0 / GR00T N1.7 checkpoint offline: checkpoint in, quantized checkpoint out.

    python -m phyai_ros.quant --checkpoint DIR --output OUT --scheme w8a16|w8a8|w4a16 \
        [--weight-format int8|fp8] [--group 128] [--activations dynamic|static] [--parts expert,prefix,vision] \
        [--dtype bfloat16|float32] [--device cpu|cuda] \
        [--calibration-inputs inputs.safetensors --tokenizer tokenizer.model [--norm-stats F] \
         [--task "..." | --tasks-json inputs.json]]

Round-to-nearest, symmetric: 8-bit weights per output channel, int4 in groups of --group columns. W8A8 with
--activations static calibrates one activation scale per layer from the observations in --calibration-inputs
(the ``predict`` inputs format: raw.observation.images.<camera> uint8 [B, H, W, 3], raw.observation.state); dynamic
scales per token need none. The output folder is loaded by the node and ``predict`` like any checkpoint
(phyai_ros/quant/checkpoint.py describes it; GR00T's: phyai_ros/quant/groot.py, static scales not yet). Exit status:
0 written, 2 a bad argument or input (one line).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from phyai_ros.layers.quantized import SCHEMES, QuantScheme, apply_calibration, calibrating

from .checkpoint import write_quantized_checkpoint
from .model import DEFAULT_PARTS, check_parts, quantize_model

_LOADERS = {"pi05": "phyai_ros.models.pi05.checkpoint:load_pi05_checkpoint",
            "pi0": "phyai_ros.models.pi0.checkpoint:load_pi0_checkpoint"}


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m phyai_ros.quant", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--scheme", required=True, choices=SCHEMES)
    p.add_argument("--weight-format", choices=("int8", "fp8", "int4"))
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--activations", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--parts", help="comma-separated subset of vision,prefix,expert (default: per scheme)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="storage dtype of what stays in float (the node's model.dtype should match)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--calibration-inputs")
    p.add_argument("--tokenizer")
    p.add_argument("--norm-stats")
    p.add_argument("--task", default="")
    p.add_argument("--tasks-json")
    return p.parse_args(argv)


def _calibrate(args, policy) -> dict:
    """Run the policy on every observation of --calibration-inputs with static scales being observed."""
    from phyai_ros.layers.selector import SELECTOR, OperatorSelector
    from phyai_ros.models.common.checkpoint_io import read_safetensors_file
    from phyai_ros.predict import IMG_PREFIX, _read_tasks
    inputs = read_safetensors_file(args.calibration_inputs)
    images = {k[len(IMG_PREFIX):]: v.numpy() for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    if "raw.observation.state" not in inputs:
        raise ValueError(f"--calibration-inputs {args.calibration_inputs} lacks raw.observation.state")
    state = inputs["raw.observation.state"].numpy()
    batch = state.shape[0] if state.ndim == 2 else 1
    tasks = _read_tasks(args.tasks_json, batch)[1] if args.tasks_json else [args.task] * batch
    reference = OperatorSelector(candidates=SELECTOR.candidates, forced="torch")  # the observing op runs
    with reference.active(), calibrating() as seen:
        policy.predict_batch(images, state, tasks)
    n = apply_calibration(seen)
    return {"inputs": args.calibration_inputs, "observations": batch, "layers_calibrated": n,
            "rule": "act_scale = max |x| over the calibration observations / 448"}


def _quantize_groot(args, scheme, parts, dtype) -> int:
    """GR00T N1.7 (phyai_ros/quant/groot.py): its weight dict quantized in place, its folder written."""
    from phyai_ros.models.groot_n17.checkpoint import load_groot_checkpoint

    from .groot import quantize_weights, write_quantized_groot
    t0 = time.perf_counter()
    ckpt = load_groot_checkpoint(args.checkpoint, device=args.device, dtype=dtype)
    layers, skipped = quantize_weights(ckpt.weights, ckpt.config, scheme, parts)
    out = write_quantized_groot(ckpt, args.output, scheme, parts, layers, skipped)
    print(f"{scheme.tag}: {len(layers)} weights of {', '.join(parts)} quantized, {len(skipped)} left in {args.dtype} "
          f"(K not a multiple of the group) ({time.perf_counter() - t0:.1f} s) -> {out}")
    return 0


def main(argv=None) -> int:
    args = _parse(argv)
    from phyai_ros.models import adapter_class, checkpoint_type
    try:
        kind = checkpoint_type(args.checkpoint)
        if kind not in _LOADERS and kind != "groot_n17":
            raise ValueError(f"{args.checkpoint}: quantization supports {', '.join(_LOADERS)} and groot_n17 "
                             f"checkpoints, not {kind}")
        scheme = QuantScheme.make(args.scheme, args.weight_format, args.group, args.activations)
        parts = check_parts(args.parts.split(",")) if args.parts else DEFAULT_PARTS[scheme.name]
        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
        static = scheme.activations == "static"
        if kind == "groot_n17":
            return _quantize_groot(args, scheme, parts, dtype)
        if static and not (args.calibration_inputs and args.tokenizer):
            raise ValueError("static activation scales need --calibration-inputs and --tokenizer")
        t0 = time.perf_counter()
        if static:
            policy = adapter_class(kind).from_files(args.checkpoint, args.tokenizer, args.norm_stats,
                                                    device=args.device, dtype=dtype)
            model = policy.model
        else:
            import importlib
            module, fn = _LOADERS[kind].split(":")
            model = getattr(importlib.import_module(module), fn)(args.checkpoint, device=args.device,
                                                                 dtype=dtype).model
        layers, skipped = quantize_model(model, scheme, parts)
        calibration = _calibrate(args, policy) if static else None
        out = write_quantized_checkpoint(args.checkpoint, args.output, model, kind, scheme, parts, layers, skipped,
                                         calibration)
    except (ValueError, OSError) as exc:  # CheckpointError is a ValueError; FileNotFoundError an OSError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{scheme.tag}: {len(layers)} weights of {', '.join(parts)} quantized, {len(skipped)} left in "
          f"{args.dtype} (K not a multiple of the group){'; static scales calibrated' if static else ''} "
          f"({time.perf_counter() - t0:.1f} s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
