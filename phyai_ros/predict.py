"""Offline pi0.5 (and pi0) prediction: one command from raw inputs to an action chunk, for checking any case
stored in the LeRobot parity-fixture format against its expected outputs. The policy type comes from the
checkpoint's config.json ("pi05" or "pi0"; "groot" runs
phyai_ros.models.groot_n17.predict with the same flags, no --tokenizer; both end in ``run_and_save``).

    python -m phyai_ros.predict --checkpoint DIR --tokenizer tokenizer.model --norm-stats norm_stats.json \
        --inputs inputs.safetensors [--tasks-json inputs.json | --task "..."] [--noise noise.safetensors|KEY] \
        [--case rtc_linear | --rtc linear|exp --inference-delay 3 --execution-horizon 10] \
        [--device cpu|cuda] [--dtype float32|bfloat16] --output actions.safetensors \
        [--expected expected.safetensors [--tolerance 1e-4]]

Inputs file keys: raw.observation.images.<camera> uint8 [B, H, W, 3], raw.observation.state float32 [B, D],
optional noise [B, 50, 32] (x at t=1) and rtc.prev_chunk_left_over [B, n, D] (normalized action space, as the
fixture; use --prev-left-over-space robot for robot units). Cameras of the checkpoint missing from the file
are masked slots. --case NAME takes the RTC parameters of that case from --tasks-json's "rtc" list and
compares against the expected keys prefixed "NAME." ("plain" = no RTC, no prefix).
Output: actions [B, H, D] (unnormalized) and actions.model [B, H, 32] (normalized, padded).
Exit status: 0 done; 2 a bad argument or input file (one line on stderr), or --tolerance given and a compared
max-abs exceeds it (NaN exceeds every tolerance); 3 the model produced non-finite actions (nothing written).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

IMG_PREFIX = "raw.observation.images."
MAX_GUIDANCE = (0.0, 100.0)  # the range the node accepts for rtc.max_guidance


class InputError(Exception):
    """A bad argument or input: reported on one line, exit status 2."""


class NonFiniteOutput(Exception):
    """The model produced NaN/Inf actions: exit status 3, and no output file."""


def _require_range(name: str, value, lo, hi=None) -> None:
    """A finite value in [lo, hi] (NaN and +-inf never pass)."""
    if value is None:
        return
    if not (math.isfinite(value) and lo <= value and (hi is None or value <= hi)):
        want = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InputError(f"{name} must be a finite number {want}, got {value}")


def _require_finite(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise InputError(f"{name} holds {int((~torch.isfinite(t)).sum())} NaN/Inf values of {t.numel()}")
    return t


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m phyai_ros.predict", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokenizer", default=None, help="SentencePiece model (pi0 / pi0.5; GR00T reads its backbone's)")
    p.add_argument("--norm-stats", default=None, help="norm_stats.json / normalizer .safetensors "
                                                       "(default: the normalizer file in --checkpoint)")
    p.add_argument("--inputs", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tasks-json", help="JSON with a 'tasks' list (one per batch item), e.g. fixture inputs.json")
    g.add_argument("--task", help="one task for every batch item")
    p.add_argument("--noise", default=None, help="safetensors file (key 'noise' or its only key) or a key of "
                                                 "--inputs; default: 'noise' in --inputs, else random (--seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--case", default=None, help="fixture case name (plain, rtc_linear, rtc_exp)")
    p.add_argument("--rtc", default=None, choices=["linear", "exp", "ones", "zeros"])
    p.add_argument("--inference-delay", type=int, default=None)
    p.add_argument("--execution-horizon", type=int, default=None)
    p.add_argument("--max-guidance", type=float, default=None)
    p.add_argument("--rtc-jacobian", default="identity", choices=["identity", "vjp"])
    p.add_argument("--prev-left-over", default="rtc.prev_chunk_left_over", help="key in --inputs")
    p.add_argument("--prev-left-over-space", default="normalized", choices=["normalized", "robot"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--output", required=True)
    p.add_argument("--expected", default=None, help="safetensors with expected outputs (fixture layout)")
    p.add_argument("--expected-key", default=None, help="compare actions against this key instead of "
                                                        "[CASE.]actions.unnormalized")
    p.add_argument("--tolerance", type=float, default=None)
    return p.parse_args(argv)


def _load_noise(arg, inputs):
    from phyai_ros.models.common.checkpoint_io import read_safetensors_file
    if arg is None:
        return inputs.get("noise")
    path = Path(arg)
    if path.is_file():
        d = read_safetensors_file(path)
        if "noise" in d:
            return d["noise"]
        if len(d) == 1:
            return next(iter(d.values()))
        raise InputError(f"--noise {path}: no 'noise' key and more than one tensor ({sorted(d)})")
    if arg in inputs:
        return inputs[arg]
    raise InputError(f"--noise {arg!r} is neither a file nor a key of --inputs ({sorted(inputs)})")


def _rtc_params(args, meta, inputs, policy):
    sched, delay, horizon, max_g = args.rtc, args.inference_delay, args.execution_horizon, args.max_guidance
    if args.case and args.case != "plain":
        cases = {c["name"]: c for c in (meta or {}).get("rtc", [])}
        if args.case not in cases:
            raise InputError(f"--case {args.case!r} not in --tasks-json's rtc list ({sorted(cases)})")
        c = cases[args.case]
        sched = sched or c["schedule"].lower()
        delay = c["inference_delay"] if delay is None else delay
        horizon = c["execution_horizon"] if horizon is None else horizon
        max_g = c.get("max_guidance_weight", 10.0) if max_g is None else max_g
    if sched is None:
        return None
    if delay is None or horizon is None:
        raise InputError("--rtc needs --inference-delay and --execution-horizon")
    h = policy.chunk_size
    _require_range("--inference-delay", delay, 0, h)
    _require_range("--execution-horizon", horizon, 1, h)
    _require_range("--max-guidance", max_g, *MAX_GUIDANCE)
    if args.prev_left_over not in inputs:
        raise InputError(f"RTC needs {args.prev_left_over!r} in --inputs")
    prev = _require_finite(f"--inputs key {args.prev_left_over}", inputs[args.prev_left_over].to(torch.float32))
    if args.prev_left_over_space == "robot":
        prev = policy.normalize_actions(prev.to(policy.device))
    return policy.rtc_tensors(prev, delay, horizon, sched, 10.0 if max_g is None else max_g, args.rtc_jacobian)


def _load_policy(args, dtype):
    """The adapter config.json's type names (pi0.5 when it names none), from the registry of model types."""
    from phyai_ros.models import MODEL_TYPES, adapter_class, checkpoint_type

    cfg_path = Path(args.checkpoint) / "config.json"
    kind = checkpoint_type(args.checkpoint)
    if kind not in MODEL_TYPES:
        raise InputError(f"{cfg_path}: unsupported policy type {kind!r} ({', '.join(MODEL_TYPES)} are)")
    policy_cls = adapter_class(kind)
    if args.tokenizer is None:
        raise InputError(f"--tokenizer is required for {kind} checkpoints")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {args.device}: no CUDA device is available")
    return policy_cls.from_files(args.checkpoint, args.tokenizer, args.norm_stats, device=args.device, dtype=dtype)


def _read_tasks(path, batch: int):
    from phyai_ros.models.common.checkpoint_io import read_json
    meta = read_json(path)
    tasks = meta.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise InputError(f"--tasks-json {path}: needs a 'tasks' list of strings (one per batch item, {batch} here)")
    return meta, tasks


def _compare(out, args) -> int:
    """Print max-abs against --expected; 2 when --tolerance is given and any comparison fails it (NaN
    fails every tolerance, and so does a comparison that could not be made)."""
    from phyai_ros.models.common.checkpoint_io import read_safetensors_file
    expected = read_safetensors_file(args.expected)
    prefix = "" if args.case in (None, "plain") else args.case + "."
    pairs = [("actions", args.expected_key)] if args.expected_key else \
        [("actions", prefix + "actions.unnormalized"), ("actions.model", prefix + "actions.model")]
    failed = []
    for ours, key in pairs:
        if key not in expected:
            print(f"expected: no key {key} in {args.expected}")
            failed.append(f"no key {key}")
            continue
        if tuple(expected[key].shape) != tuple(out[ours].shape):
            print(f"expected: {key} has shape {list(expected[key].shape)}, {ours} {list(out[ours].shape)}")
            failed.append(f"shape of {key}")
            continue
        diff = (out[ours] - expected[key].float()).abs().max().item()
        print(f"max-abs {ours} vs {key}: {diff:.3e}")
        if args.tolerance is not None and not diff <= args.tolerance:
            failed.append(f"max-abs {ours} {diff:.3e} > tolerance {args.tolerance:.1e}")
    if args.tolerance is not None and failed:
        print("FAIL: " + "; ".join(failed))
        return 2
    return 0


def _run(args) -> int:
    """With the device's operator profile (PHYAI_OP_PROFILE, else the cached or shipped one for this device, as
    the node finds it) in a selector of this call's own."""
    from phyai_ros.layers.profiles import selector_for
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise InputError(f"--device {args.device}: {exc}") from None
    selector, _ = selector_for(device)
    with selector.active():
        return _predict(args)


def _predict(args) -> int:
    from phyai_ros.models.common.checkpoint_io import read_safetensors_file

    _require_range("--tolerance", args.tolerance, 0.0)
    _require_range("--seed", args.seed, 0, 2**63 - 1)
    from phyai_ros.models import checkpoint_type
    if checkpoint_type(args.checkpoint) == "groot_n17":   # GR00T N1.7: its own entry point, same flags
        from phyai_ros.models.groot_n17.predict import run
        return run(args)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    inputs = read_safetensors_file(args.inputs)
    images = {k[len(IMG_PREFIX):]: v.numpy() for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    if "raw.observation.state" not in inputs:
        raise InputError(f"--inputs {args.inputs} lacks raw.observation.state")
    state = inputs["raw.observation.state"].numpy()
    batch = state.shape[0] if state.ndim == 2 else 1
    meta, tasks = _read_tasks(args.tasks_json, batch) if args.tasks_json else (None, [args.task] * batch)

    policy = _load_policy(args, dtype)
    noise = _load_noise(args.noise, inputs)
    if noise is None:
        noise = policy.make_noise(batch, torch.Generator().manual_seed(args.seed))
    _require_finite(f"--noise {args.noise}" if args.noise else f"--inputs {args.inputs} noise", noise)
    rtc = _rtc_params(args, meta, inputs, policy)

    def infer():
        prepared = policy.prepare(images, state, tasks)
        actions_model = policy.sample_actions(prepared, noise, rtc)
        return ({"actions": policy.unnormalize_actions(actions_model), "actions.model": actions_model},
                {"prompts": prepared.prompts, "slots": prepared.slot_names})
    return run_and_save(args, infer)


def run_and_save(args, infer, label: str = "") -> int:
    """The tail every policy type shares: time ``infer()`` (-> ({"actions", "actions.model"}, metadata), from
    the raw inputs on), refuse non-finite outputs (exit 3, nothing written), save, print, compare with
    --expected."""
    from safetensors.torch import save_file
    t0 = time.perf_counter()
    tensors, metadata = infer()
    if str(args.device).startswith("cuda"):
        torch.cuda.synchronize()
    dt_ms = (time.perf_counter() - t0) * 1e3
    out = {key: t.float().cpu().contiguous() for key, t in tensors.items()}
    for key, t in out.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise NonFiniteOutput(f"the model produced non-finite {key}: {bad} NaN/Inf of {t.numel()} values "
                                  f"(checkpoint {args.checkpoint}); nothing written to {args.output}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save_file(out, args.output, metadata={k: json.dumps(v) for k, v in metadata.items()})
    print(f"actions {list(out['actions'].shape)} actions.model {list(out['actions.model'].shape)} "
          f"({dt_ms:.1f} ms incl. preprocessing, {args.device} {args.dtype}{label}) -> {args.output}")
    return _compare(out, args) if args.expected else 0


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
