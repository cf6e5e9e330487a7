"""Quantize a checkpoint of any registered family offline: checkpoint in, quantized checkpoint out.

    python -m phyai_ros.quant --checkpoint DIR --output OUT --scheme w8a16|w8a8|w4a16 \
        [--weight-format int8|fp8] [--group 128] [--activations dynamic|static] [--parts expert,prefix,vision] \
        [--dtype bfloat16|float32] [--device cpu|cuda] \
        [--calibration-inputs inputs.safetensors [--tokenizer FILE] [--norm-stats FILE] \
         [--task "..." | --tasks-json inputs.json]]

Round-to-nearest, symmetric: 8-bit weights per output channel, int4 in groups of --group columns. W8A8 with
--activations static calibrates one activation scale per layer from the observations in --calibration-inputs
(the ``predict`` inputs format, phyai_ros/models/cases.py); dynamic scales per token need none. The family comes
from the checkpoint's config.json (phyai_ros.models); its adapter's ``quantize`` hook writes a folder the node and
``predict`` load like any checkpoint (phyai_ros/models/quantized_checkpoint.py). Exit status: 0 written, 2 a bad
argument or input (one line).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from phyai_ros.layers.quantized import SCHEMES, QuantScheme
from phyai_ros.models import family_for_checkpoint
from phyai_ros.models.cases import InputError, read_case
from phyai_ros.models.contract import DTYPES, ModelFiles, QuantizeRequest
from phyai_ros.models.quantized_checkpoint import DEFAULT_PARTS, check_parts, read_manifest


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m phyai_ros.quant", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--scheme", required=True, choices=SCHEMES)
    p.add_argument("--weight-format", choices=("int8", "fp8", "int4"))
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--activations", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--parts", help="comma-separated subset of vision,prefix,expert (default: per scheme)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16",
                   help="storage dtype of what stays in float (the node's model.dtype should match)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--calibration-inputs")
    p.add_argument("--tokenizer")
    p.add_argument("--norm-stats")
    p.add_argument("--task", default="")
    p.add_argument("--tasks-json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    try:
        cls = family_for_checkpoint(args.checkpoint)
        if read_manifest(args.checkpoint) is not None:   # every family: its weights are no longer float
            raise ValueError(f"{args.checkpoint} is already quantized (quantize its float source instead)")
        scheme = QuantScheme.make(args.scheme, args.weight_format, args.group, args.activations)
        parts = check_parts(args.parts.split(",")) if args.parts else DEFAULT_PARTS[scheme.name]
        calibration = read_case(args.calibration_inputs, args.tasks_json, args.task) \
            if args.calibration_inputs else None
        t0 = time.perf_counter()
        result = cls.quantize(QuantizeRequest(Path(args.checkpoint), Path(args.output), scheme, parts,
                                              DTYPES[args.dtype], args.device,
                                              ModelFiles.of(args.tokenizer, args.norm_stats), calibration))
    except (ValueError, OSError, InputError) as exc:  # CheckpointError is a ValueError; FileNotFoundError an OSError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{scheme.tag}: {len(result.layers)} weights of {', '.join(parts)} quantized, {len(result.skipped)} left in "
          f"{args.dtype} (K not a multiple of the group){'; static scales calibrated' if result.calibrated else ''} "
          f"({time.perf_counter() - t0:.1f} s) -> {result.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
