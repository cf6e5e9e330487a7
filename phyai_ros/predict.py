"""Offline pi0.5 (and pi0) prediction: one command from raw inputs to an action chunk, for checking any case
stored in the LeRobot parity-fixture format against its expected outputs. The policy type comes from the
checkpoint's config.json ("pi05" or "pi0").

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
Exit status 2 when --tolerance is given and a compared max-abs exceeds it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

IMG_PREFIX = "raw.observation.images."


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m phyai_ros.predict", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokenizer", required=True)
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
    from safetensors.torch import load_file
    if arg is None:
        return inputs.get("noise")
    path = Path(arg)
    if path.is_file():
        d = load_file(str(path))
        if "noise" in d:
            return d["noise"]
        if len(d) == 1:
            return next(iter(d.values()))
        raise SystemExit(f"--noise {path}: no 'noise' key and more than one tensor ({sorted(d)})")
    if arg in inputs:
        return inputs[arg]
    raise SystemExit(f"--noise {arg!r} is neither a file nor a key of --inputs ({sorted(inputs)})")


def _rtc_params(args, meta, inputs, policy):
    from phyai_ros.models.common.policy import RtcParams
    sched, delay, horizon, max_g = args.rtc, args.inference_delay, args.execution_horizon, args.max_guidance
    if args.case and args.case != "plain":
        cases = {c["name"]: c for c in (meta or {}).get("rtc", [])}
        if args.case not in cases:
            raise SystemExit(f"--case {args.case!r} not in --tasks-json's rtc list ({sorted(cases)})")
        c = cases[args.case]
        sched = sched or c["schedule"].lower()
        delay = c["inference_delay"] if delay is None else delay
        horizon = c["execution_horizon"] if horizon is None else horizon
        max_g = c.get("max_guidance_weight", 10.0) if max_g is None else max_g
    if sched is None:
        return None
    if delay is None or horizon is None:
        raise SystemExit("--rtc needs --inference-delay and --execution-horizon")
    if args.prev_left_over not in inputs:
        raise SystemExit(f"RTC needs {args.prev_left_over!r} in --inputs")
    prev = inputs[args.prev_left_over].to(torch.float32)
    if args.prev_left_over_space == "robot":
        prev = policy.normalize_actions(prev.to(policy.device))
    return RtcParams(prev, delay, horizon, sched, 10.0 if max_g is None else max_g, args.rtc_jacobian)


def main(argv=None) -> int:
    args = _parse(argv)
    from safetensors.torch import load_file, save_file

    from phyai_ros.models.pi0 import Pi0Policy
    from phyai_ros.models.pi05 import Pi05Policy

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if not Path(args.inputs).is_file():
        raise FileNotFoundError(f"file not found: {args.inputs}")
    inputs = load_file(args.inputs)
    meta = json.loads(Path(args.tasks_json).read_text()) if args.tasks_json else None
    images = {k[len(IMG_PREFIX):]: v.numpy() for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    if "raw.observation.state" not in inputs:
        raise SystemExit("--inputs lacks raw.observation.state")
    state = inputs["raw.observation.state"].numpy()
    batch = state.shape[0] if state.ndim == 2 else 1
    tasks = meta["tasks"] if meta is not None else [args.task] * batch

    cfg_path = Path(args.checkpoint) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"file not found: {cfg_path}")
    policy_cls = {"pi05": Pi05Policy, "pi0": Pi0Policy}.get(json.loads(cfg_path.read_text()).get("type", "pi05"))
    if policy_cls is None:
        raise SystemExit(f"{cfg_path}: unsupported policy type (pi05 and pi0 are)")
    policy = policy_cls.from_files(args.checkpoint, args.tokenizer, args.norm_stats, device=args.device,
                                   dtype=dtype)
    noise = _load_noise(args.noise, inputs)
    if noise is None:
        noise = policy.make_noise(batch, torch.Generator().manual_seed(args.seed))
    rtc = _rtc_params(args, meta, inputs, policy)

    t0 = time.perf_counter()
    prepared = policy.prepare(images, state, tasks)
    actions_model = policy.sample_actions(prepared, noise, rtc)
    actions = policy.unnormalize_actions(actions_model)
    if policy.device.type == "cuda":
        torch.cuda.synchronize()
    dt_ms = (time.perf_counter() - t0) * 1e3
    out = {"actions": actions.float().cpu().contiguous(), "actions.model": actions_model.float().cpu().contiguous()}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save_file(out, args.output, metadata={"prompts": json.dumps(prepared.prompts),
                                          "slots": json.dumps(prepared.slot_names)})
    print(f"actions {list(out['actions'].shape)} actions.model {list(out['actions.model'].shape)} "
          f"({dt_ms:.1f} ms incl. preprocessing, {args.device} {args.dtype}) -> {args.output}")

    worst = 0.0
    if args.expected:
        expected = load_file(args.expected)
        prefix = "" if args.case in (None, "plain") else args.case + "."
        pairs = [("actions", args.expected_key)] if args.expected_key else \
            [("actions", prefix + "actions.unnormalized"), ("actions.model", prefix + "actions.model")]
        for ours, key in pairs:
            if key not in expected:
                print(f"expected: no key {key}")
                continue
            diff = (out[ours] - expected[key].float()).abs().max().item()
            worst = max(worst, diff)
            print(f"max-abs {ours} vs {key}: {diff:.3e}")
    if args.tolerance is not None and worst > args.tolerance:
        print(f"FAIL: max-abs {worst:.3e} > tolerance {args.tolerance:.1e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
