#!/usr/bin/env python3
"""Write the per-device operator profile that the runner's selector reads.

Runs the model once to record every (op, shape) the layers dispatch, then times
each usable candidate for each of them inside a CUDA graph (what the runner
replays), checks each of its outputs against the torch candidate, and keeps the
fastest correct one. Ops are timed whole on the recorded inputs: the SigLIP
residual + LayerNorm op includes its GEMM, so the fused candidate's bias-free
GEMM is weighed against the eager GEMM with its bias epilogue. Run it on the
target (Jetson Thor, or the H200 for benchmarks):

    python scripts/profile_ops.py --checkpoint DIR --tokenizer FILE --out profiles/thor.json
    PHYAI_OP_PROFILE=profiles/thor.json  (or node parameter model.op_profile)

Without --checkpoint a random full-size pi0.5 is built in memory; give --checkpoint once per model
(pi0.5 and pi0 differ in prompt length and suffix rows, hence in shapes) to profile both into one file.
--groot DIR adds a GR00T N1.7 checkpoint folder (LeRobot layout, e.g. what scripts/bench_groot.py writes) and
--merge keeps the file's other tables, so one model's shapes can be added to a shipped profile:

    python scripts/profile_ops.py --groot /tmp/groot/checkpoint_1view --merge --out profiles/h200.json

--cosmos3 full (random full-size weights in memory) or --cosmos3 DIR (a saved pipeline) adds Cosmos3's shapes at a
480x832 image the same way.

--fast SECONDS runs the start-up autotune's bounded form on the same calls (what a node does on a device no
profile matches, phyai_ros.runtime.autotune): per call only the shortlist ranked by the shipped profiles of other
devices (layers.shortlist), 10 calls x 3 replays each, within SECONDS; the figure to hold against a full profile.

A quantized checkpoint (--checkpoint of ``python -m phyai_ros.quant``'s folder) is profiled with its weights'
bf16 copies, so each quantized op's "dense" candidate (the bf16 op on the dequantized weight) is timed against its
kernels at every recorded shape: the measured plan that ``scripts/bench_runtime.py`` and the node then apply.
--batch 1,8,32 records each batch's shapes (a plan may run bf16 at batch 1 and fp8 at batch 32).

--ops NAME[,NAME] times only those ops (e.g. expert_stack after a new form of it; with --merge the other entries
stay, and the timed op's sub-ops run as they choose).
The timing core is the package's (phyai_ros.layers.profiling), which the node's model.op_autotune also runs; a
file written to profiles/ ships with the package and is found by device name (phyai_ros.layers.profiles).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from phyai_ros.layers.profiles import write_profile  # noqa: E402
from phyai_ros.layers.profiling import (cold_arg_sets, graph_time_us, profile_calls,  # noqa: E402,F401
                                        record)
from phyai_ros.layers.selector import SELECTOR, device_signature  # noqa: E402
from call_timing import flow_runner_inputs  # noqa: E402  (scripts/, next to this file)


def record_model_calls(args) -> dict:
    """Every (op, shape) the models dispatch over one observation and one chunk: each --checkpoint (pi0.5
    or pi0, by its config.json) or, without one, a random full-size pi0.5 built in memory."""
    rec = {}
    for ckpt in args.groot or []:
        for b in args.batch:
            rec.update(record_groot_calls(ckpt, b))
        torch.cuda.empty_cache()
    for spec in args.cosmos3 or []:
        rec.update(record_cosmos3_calls(spec))
        torch.cuda.empty_cache()
    for ckpt in args.checkpoint or ([] if args.groot or args.cosmos3 else [None]):
        model, cfg = load_model(ckpt, args.tokenizer)
        for b in args.batch:
            rec.update(record_calls(model, cfg, b, args.cameras))
        del model
        torch.cuda.empty_cache()
    return rec


def with_dense_copies(weights) -> tuple:
    """A quantized model's weights get their bf16 copies (model.quant_plan "measured"), so that the quantized ops'
    "dense" candidate is recorded and timed against their kernels; the record's extra pass for it."""
    if not weights:
        return ()
    from phyai_ros.layers.quantized import plan_dense
    plan_dense(weights, None, torch.bfloat16)
    return ("dense",)


def load_model(ckpt, tokenizer):
    from phyai_ros.models.pi import pi0, pi05
    from phyai_ros.models.pi.pi05.checkpoint import make_random_model
    if ckpt is None:
        cfg = pi05.Pi05Config()
        return make_random_model(cfg, seed=0, std=0.02, dtype=torch.bfloat16, device="cuda"), cfg
    policy_cls = pi0.Pi0Adapter if json.loads((ckpt / "config.json").read_text()).get("type") == "pi0" \
        else pi05.Pi05Adapter
    stats = ckpt / "norm_stats.json"
    policy = policy_cls.from_files(ckpt, tokenizer, stats if stats.is_file() else None, device="cuda",
                                   dtype=torch.bfloat16)
    return policy.model, policy.config


def record_calls(model, cfg, b: int, s: int) -> dict:
    from phyai_ros.models.pi.runner import FlowRunner
    runner = FlowRunner(model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                        state_dim=cfg.max_state_dim)
    images, masks, tokens, tmask, state, noise = flow_runner_inputs(cfg, b, s)
    from phyai_ros.layers.quantized import quantized_in
    extra = with_dense_copies(quantized_in(model))
    # As chosen by default, then with every op on its reference (the sub-ops of fused ops): see record().
    rec = record(SELECTOR, lambda: runner.sample(runner.set_observation(images, masks, tokens, tmask, state), noise),
                 extra)
    torch.cuda.synchronize()
    return rec


def record_groot_calls(ckpt: Path, batch: int, device: str = "cuda", dtype=torch.bfloat16) -> dict:
    """GR00T's (op, shape) calls over one observation and one chunk (backbone, context, the 4-step loop), run
    eagerly through its runner on 480x640 frames of every camera the checkpoint uses, through its own processor
    (the prompt's length sets the backbone's shapes: a 14-word task, about the 40 text tokens timed elsewhere)."""
    import numpy as np
    from phyai_ros.models.groot_n17 import GrootAdapter
    policy = GrootAdapter.from_files(ckpt, device=device, dtype=dtype)
    runner = policy.use_runner(use_graphs=False)
    rng = np.random.default_rng(0)
    images = {c: rng.integers(0, 256, (batch, 480, 640, 3), dtype=np.uint8) for c in policy.camera_names}
    state = rng.standard_normal((batch, policy.state_dim)).astype(np.float32)
    task = "pick up the red block and place it in the blue bowl on the left side"
    obs = runner.model.observation(policy.prepare(images, state, [task] * batch))
    noise = policy.make_noise(batch)
    return record(SELECTOR, lambda: runner.run(obs, noise), with_dense_copies(policy.quantized_weights()))


def record_cosmos3_calls(spec: str, device: str = "cuda", dtype=torch.bfloat16) -> dict:
    """Cosmos3's (op, shape) calls over one chunk at its default setting (4 steps, guidance 3, the 480 tier, prompts
    in buckets of 64 tokens as the benchmark runs them) from one 480x832 camera image, eagerly: ``spec`` "full"
    builds random full-size weights in memory, else it names a saved pipeline folder."""
    import numpy as np
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    from phyai_ros.models.cosmos3.checkpoint import load_cosmos3_checkpoint, random_checkpoint
    from phyai_ros.models.cosmos3.config import FULL_TRANSFORMER, FULL_VAE
    ckpt = random_checkpoint(Path("/tmp/phyai_cosmos3_profile"), FULL_TRANSFORMER, FULL_VAE, seed=0, device=device,
                             dtype=dtype) if spec == "full" else load_cosmos3_checkpoint(Path(spec))
    policy = Cosmos3Adapter(ckpt, device=device, dtype=dtype, token_bucket=64)
    del ckpt
    policy.use_runner(use_graphs=False, token_bucket=64)
    image = {policy.camera_names[0]: np.random.default_rng(0).integers(0, 256, (1, 480, 832, 3), dtype=np.uint8)}
    x = policy.prepare(image, "pick up the red block and place it in the blue bowl on the left side")
    noise = policy.make_noise(x, torch.Generator().manual_seed(0))
    return record(SELECTOR, lambda: policy.sample_actions(x, noise))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, action="append",
                    help="a pi0.5 or pi0 checkpoint folder; repeat to profile both models into one file")
    ap.add_argument("--groot", type=Path, action="append",
                    help="a GR00T N1.7 checkpoint folder (LeRobot layout); repeatable; alone, no pi0.5 is built")
    ap.add_argument("--cosmos3", action="append",
                    help="'full' (random full-size weights in memory) or a Cosmos3 pipeline folder; repeatable")
    ap.add_argument("--merge", action="store_true",
                    help="keep the file's tables for other shapes and devices (default: replace the file)")
    ap.add_argument("--ops", default=None,
                    help="comma-separated op names to time (default: every recorded op); with --merge the file keeps "
                         "the other ops' entries, which the timed ones' sub-ops run with")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--batch", type=lambda t: [int(v) for v in t.split(",")], default=[1], metavar="1[,8,32]",
                    help="batch sizes whose shapes are recorded (pi, GR00T)")
    ap.add_argument("--cameras", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=2e-2, help="largest relative error vs torch (bf16)")
    ap.add_argument("--reps", type=int, default=20, help="calls per timed CUDA graph (at least one per cold copy)")
    ap.add_argument("--replays", type=int, default=7, help="graph replays per candidate (the median is kept)")
    ap.add_argument("--fast", type=float, default=None, metavar="SECONDS",
                    help="the start-up autotune's shortlist, repeats and budget instead of every candidate")
    ap.add_argument("--out", type=Path, required=True, help="profile file (replaced atomically)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_ops: needs a CUDA device")
    device = torch.device("cuda")
    signature = device_signature(device)
    t0 = time.perf_counter()
    calls = record_model_calls(args)
    if args.ops:
        wanted = set(args.ops.split(","))
        calls = {key: call for key, call in calls.items() if key[0] in wanted}
        if not calls:
            raise SystemExit(f"profile_ops: the models dispatched none of {sorted(wanted)}")
    t1 = time.perf_counter()

    def show(op, key, entry, chosen):
        print(f"{op:22} {key:45} " + "  ".join(
            f"{n}={v['us']:.1f}us" if isinstance(v, dict) else f"{n}=x" for n, v in entry.items())
            + f"  -> {chosen or '-'}", flush=True)

    fast = {}
    if args.fast is not None:
        from phyai_ros.runtime.autotune import AUTOTUNE_REPLAYS, AUTOTUNE_REPS, bounded_search, shipped_priors
        priors = shipped_priors(signature)
        print(f"fast: shortlists ranked by {[sig for sig, _, _ in priors.tables]}, budget {args.fast:g} s", flush=True)
        fast = dict(bounded_search(SELECTOR, priors), deadline=t1 + args.fast, time_single=False)
        args.reps, args.replays = AUTOTUNE_REPS, AUTOTUNE_REPLAYS
    table, timings = profile_calls(SELECTOR, calls, device, args.tolerance, reps=args.reps, replays=args.replays,
                                   report=show, **fast)
    write_profile(args.out, signature, table, timings, merge=args.merge)
    reached = sum(len(keys) for keys in timings.values())
    print(f"profile for {signature} written to {args.out} ({len(calls)} (op, shape) calls: recorded in "
          f"{t1 - t0:.1f} s, {reached} profiled in {time.perf_counter() - t1:.1f} s)")


if __name__ == "__main__":
    main()
