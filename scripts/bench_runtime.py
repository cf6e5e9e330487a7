#!/usr/bin/env python3
"""pi0.5 / pi0 runtime benchmark on a CUDA device: latency, stages, batching, memory, start-up, roofline.

Builds a random-weight checkpoint in the LeRobot layout (full size by default, bf16),
loads it through the real loader, and times the runner (CUDA graphs) from
preprocessed inputs to the action chunk, as LeRobot's ``sample_actions`` is timed.
Prints a table and writes everything as JSON to --out.

    python scripts/bench_runtime.py --out /tmp/bench            # full pi0.5, 3 cameras, 10 steps
    python scripts/bench_runtime.py --model pi0 --out /tmp/b0   # full pi0 (48-token budget)
    python scripts/bench_runtime.py --config mid --iters 50     # smaller model, quick check
    python scripts/bench_runtime.py --cameras 2                 # the third camera absent (skipped; --keep-absent
                                                                # computes it masked, as before)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

T_PROCESS = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from phyai_ros.models.pi import pi0, pi05  # noqa: E402
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig  # noqa: E402
from phyai_ros.models.pi.pi0 import checkpoint as pi0_checkpoint  # noqa: E402
from phyai_ros.models.pi.pi05 import checkpoint as pi05_checkpoint  # noqa: E402
from phyai_ros.runtime.roofline import flow_stage_costs  # noqa: E402
from phyai_ros.models.pi.runner import FlowRunner  # noqa: E402
from phyai_ros.runtime.transfer import pinned_array  # noqa: E402
from call_timing import call_ms, startup_in_child  # noqa: E402  (scripts/, next to this file)

TOKEN_BUCKET = 0
PRESENT = 3          # --cameras: the first PRESENT of CAMERAS send frames, the rest are absent
SKIP_ABSENT = True   # --keep-absent: compute absent cameras masked instead of skipping them
# --model: (config class, policy class, checkpoint module, display name, pi0's state token in the suffix)
MODELS = {"pi05": (pi05.Pi05Config, pi05.Pi05Adapter, pi05_checkpoint, "pi0.5", False),
          "pi0": (pi0.Pi0Config, pi0.Pi0Adapter, pi0_checkpoint, "pi0", True)}
MODEL = "pi05"
DEVICE, DTYPE = "cuda", torch.bfloat16  # --device cpu: a float32 smoke run of the same code
CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TASK = "pick up the red block and place it in the blue bowl on the left side of the table"


def config(name: str):
    cls = MODELS[MODEL][0]
    if name == "full":
        return cls()
    if name == "mid":
        return cls(vlm=GemmaConfig(width=1024, depth=6, mlp_dim=4096),
                          expert=GemmaConfig(width=512, depth=6, mlp_dim=2048),
                          siglip=SiglipConfig(width=384, depth=6, num_heads=6, mlp_dim=1536), vocab_size=32000)
    raise SystemExit(f"unknown config {name}")


def write_checkpoint(path: Path, cfg, std: float = 0.02) -> float:
    """Random bf16 weights drawn on the GPU, saved in the LeRobot layout; returns seconds."""
    from safetensors.torch import save_file

    cls, _, ckpt_module, _, _ = MODELS[MODEL]
    t = time.perf_counter()
    # Small files (config, dims, stats) from the package's own writer with a tiny model, then
    # the full-size weights drawn on the GPU (the CPU generator would take minutes).
    ckpt_module.make_random_checkpoint(path, cls(vlm=GemmaConfig(width=16, depth=1, mlp_dim=16, num_heads=1,
                                                             head_dim=16),
                                            expert=GemmaConfig(width=16, depth=1, mlp_dim=16, num_heads=1,
                                                               head_dim=16),
                                            siglip=SiglipConfig(width=16, depth=1, num_heads=1, mlp_dim=16),
                                            vocab_size=cfg.vocab_size, token_budget=cfg.token_budget),
                           dtype=torch.bfloat16, include_unused=False)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    weights = {k: (torch.randn(s, generator=gen, device=DEVICE, dtype=torch.float32) * std).to(DTYPE).cpu()
               for k, s in sorted(ckpt_module.lerobot_key_shapes(cfg).items())}
    save_file(weights, str(path / "model.safetensors"))
    (path / "model_dims.json").write_text(json.dumps(cfg.to_model_dims(), indent=2))
    return time.perf_counter() - t


def load_policy(ckpt: Path, tokenizer: Path):
    return MODELS[MODEL][1].from_files(ckpt, tokenizer, ckpt / "norm_stats.json", camera_names=list(CAMERAS),
                                 device=DEVICE, dtype=DTYPE)


def quant_plan(model, mode: str) -> dict:
    """A quantized checkpoint's plan, as the node applies it (model.quant_plan): "measured" keeps a bf16 copy of
    each weight whose shapes the loaded profile runs "dense"; "all" none."""
    from phyai_ros.layers.quantized import dense_shapes, plan_dense, quantized_in
    from phyai_ros.layers.selector import SELECTOR, device_signature
    weights = quantized_in(model)
    if not weights:
        return {"weights": 0}
    shapes = dense_shapes(SELECTOR.profile.get(device_signature(torch.device(DEVICE)), {})) if mode == "measured" \
        else set()
    held = plan_dense(weights, shapes, DTYPE)
    print(f"quantized plan ({mode}): {held} of {len(weights)} quantized weights also run bf16", flush=True)
    return {"mode": mode, "weights": len(weights), "dense": held}


def observation(rng, batch: int, size=(480, 640)):
    images = {c: rng.integers(0, 256, (batch, *size, 3), dtype=np.uint8) for c in CAMERAS[:PRESENT]}
    return images, rng.standard_normal((batch, 8)).astype(np.float32)


def observe(runner: FlowRunner, policy, x, state=None):
    """New observation into the runner (the padded state is pi0's state token; pi0.5 ignores it)."""
    state = policy.state_padded(x) if state is None else state
    return runner.set_observation(x.images, x.image_masks, x.tokens, x.token_masks, state, new_bucket=True,
                                  host_masks=x.host_masks)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cuda_ms(fn, iters: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call: CUDA events on the GPU, the host clock on the CPU."""
    return call_ms(fn, iters, warmup, DEVICE)


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float:
    return torch.cuda.max_memory_allocated() / 1e9 if DEVICE == "cuda" else float("nan")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def ceilings() -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    gemm = statistics.median(cuda_ms(lambda: a @ b, 10))
    src = torch.randn(2 ** 30, device="cuda", dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    copy = statistics.median(cuda_ms(lambda: dst.copy_(src), 10))
    a = b = src = dst = None  # free 8.6 GB before the model loads
    torch.cuda.empty_cache()
    return {"gemm_tflops": 2 * n ** 3 / gemm / 1e9, "copy_tbps": 2 * 4 * 2 ** 30 / copy / 1e9}


def first_chunk(ckpt: Path, tokenizer: Path) -> dict:
    """What a fresh process does before the robot can act: load, warm up (capture), first chunk."""
    t0 = time.perf_counter()
    policy = load_policy(ckpt, tokenizer)
    sync()
    t_load = time.perf_counter()
    cfg = policy.config
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim,
                        use_graphs=DEVICE == "cuda", token_bucket=TOKEN_BUCKET, skip_absent_cameras=SKIP_ABSENT)
    images, state = observation(np.random.default_rng(0), 1)
    inputs = policy.prepare(images, state, TASK)
    noise = policy.make_noise(1)
    runner.capture_all_buckets(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, noise)
    sync()
    t_capture = time.perf_counter()
    images, state = observation(np.random.default_rng(1), 1)
    inputs = policy.prepare(images, state, TASK)
    x = runner.sample(observe(runner, policy, inputs), noise)
    policy.unnormalize_actions(x).cpu()
    t_first = time.perf_counter()
    return {"import_s": t0 - T_PROCESS, "load_s": t_load - t0, "warmup_capture_s": t_capture - t_load,
            "first_chunk_s": t_first - t_capture, "in_process_total_s": t_first - T_PROCESS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="pi05", choices=tuple(MODELS))
    ap.add_argument("--config", default="full", choices=("full", "mid"))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--quant-plan", default="measured", choices=("measured", "all"),
                    help="a quantized checkpoint: its linears on bf16 copies where the profile measured that faster "
                         "(the node's default), or quantized everywhere")
    ap.add_argument("--batch-iters", type=int, default=20)
    ap.add_argument("--tokenizer", type=Path,
                    default=REPO.parent / "shared" / "fixtures" / "lerobot_parity" / "tokenizer" / "tokenizer.model")
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/phyai_bench_ckpt"))
    ap.add_argument("--token-bucket", type=int, default=0,
                    help="cut right-padding of the prompt to a multiple of this many tokens (0: full budget)")
    ap.add_argument("--cameras", type=int, default=3, choices=(1, 2, 3),
                    help="cameras that send frames (the others are absent)")
    ap.add_argument("--keep-absent", action="store_true",
                    help="compute absent cameras masked (the runner's behaviour before it skipped them)")
    ap.add_argument("--reuse-checkpoint", action="store_true", help="keep an existing --checkpoint")
    ap.add_argument("--skip-startup", action="store_true", help="skip the fresh-process start-up measurement")
    ap.add_argument("--checkpoint-only", action="store_true", help="write the random checkpoint and stop")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "bench_runtime.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: float32 smoke run of the same code path (no graphs, host timing)")
    ap.add_argument("--host-profile", action="store_true", help="print where the policy path's host time goes (cProfile)")
    ap.add_argument("--first-chunk", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEVICE, DTYPE, TOKEN_BUCKET, MODEL, PRESENT, SKIP_ABSENT
    TOKEN_BUCKET, MODEL, PRESENT, SKIP_ABSENT = args.token_bucket, args.model, args.cameras, not args.keep_absent
    DEVICE, DTYPE = args.device, (torch.bfloat16 if args.device == "cuda" else torch.float32)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_runtime: no CUDA device; nothing to measure (try --device cpu --config mid)")
        return
    from phyai_ros.layers.profiles import load_device_profile
    from phyai_ros.layers.selector import SELECTOR
    # PHYAI_OP_PROFILE, else this device's cached or shipped profile (found by device name), as the node does.
    profile = load_device_profile(DEVICE)
    if args.first_chunk:
        print(json.dumps(first_chunk(args.checkpoint, args.tokenizer)))
        return

    cfg = config(args.config)
    print(profile.describe(), flush=True)
    res: dict = {"ops": SELECTOR.forced or (str(profile.path) if profile.path else "default"), "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "model": MODEL, "config": args.config,
                 "cameras": len(CAMERAS), "cameras_present": PRESENT, "skip_absent": SKIP_ABSENT,
                 "prefix_len": cfg.prefix_len(len(CAMERAS)), "steps": cfg.num_steps,
                 "date": time.strftime("%Y-%m-%d")}
    res["ceilings"] = ceilings() if DEVICE == "cuda" else {"gemm_tflops": 1.0, "copy_tbps": 0.05}
    if args.reuse_checkpoint and (args.checkpoint / "model.safetensors").is_file():
        res["checkpoint_write_s"] = None
    else:
        res["checkpoint_write_s"] = write_checkpoint(args.checkpoint, cfg)
    res["checkpoint_gb"] = (args.checkpoint / "model.safetensors").stat().st_size / 1e9
    if args.checkpoint_only:
        print(f"{MODELS[MODEL][3]} checkpoint at {args.checkpoint}: {res['checkpoint_gb']:.2f} GB")
        return

    res["startup"] = {"skipped": True} if args.skip_startup else startup_in_child(
        [__file__, "--first-chunk", "--device", DEVICE, "--model", MODEL, "--token-bucket", str(TOKEN_BUCKET),
         "--cameras", str(PRESENT), *([] if SKIP_ABSENT else ["--keep-absent"]), "--checkpoint", str(args.checkpoint),
         "--tokenizer", str(args.tokenizer)])
    print(f"start-up to first chunk: {res['startup']}", flush=True)

    policy = load_policy(args.checkpoint, args.tokenizer)
    res["quant_plan"] = quant_plan(policy.model, args.quant_plan)
    runner = FlowRunner(policy.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim,
                        use_graphs=DEVICE == "cuda", token_bucket=TOKEN_BUCKET, skip_absent_cameras=SKIP_ABSENT)
    policy.runner = runner   # predict_batch (the policy path) goes through the same graphs as the figures below
    rng = np.random.default_rng(0)

    def prepared(batch):
        images, state = observation(rng, batch)
        return policy.prepare(images, state, TASK), policy.make_noise(batch)

    # Batch 1: whole chunk (copy inputs in, three replays), >= 200 runs.
    reset_peak()
    inputs, noise = prepared(1)

    state = policy.state_padded(inputs)

    def chunk():
        return runner.sample(observe(runner, policy, inputs, state), noise)

    res["token_bucket"] = TOKEN_BUCKET
    slots = runner.slots_kept(inputs.image_masks)   # camera slots computed
    res["slots_run"] = slots
    res["prefix_len_run"] = slots * cfg.siglip.num_patches + (
        runner.bucket_length(inputs.token_masks) if TOKEN_BUCKET else cfg.token_budget)
    lat = cuda_ms(chunk, args.iters, warmup=5)
    res["batch1"] = {"median_ms": statistics.median(lat), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
                     "min_ms": min(lat), "runs": len(lat), "peak_mem_gb": peak_gb()}
    # Host CPU time per chunk (launch side only: copies + replays, no waiting).
    sync()
    cpu = []
    for _ in range(50):
        c0 = time.process_time()
        chunk()
        cpu.append(time.process_time() - c0)
        sync()
    res["batch1"]["host_cpu_ms"] = 1e3 * statistics.median(cpu)

    # Stage breakdown from the three graphs of the bucket.
    bucket = observe(runner, policy, inputs, state)
    runner.sample(bucket, noise)
    if runner.use_graphs:
        stages = {"vision": bucket.frames.vision.replay, "prefix": bucket.prefix.replay, "loop": bucket.loop.replay}
    else:  # the same stage functions, eagerly
        f = bucket.frames
        prefix_args = (runner.vision_stage(f.images), f.image_masks, bucket.tokens, bucket.token_masks, bucket.state)
        loop_args = (runner.prefix_stage(*prefix_args), bucket.noise, bucket.rtc_y, bucket.rtc_weights,
                     bucket.rtc_guidance)
        stages = {"vision": lambda: runner.vision_stage(f.images), "prefix": lambda: runner.prefix_stage(*prefix_args),
                  "loop": lambda: runner.loop_stage(*loop_args)}
    costs = flow_stage_costs(cfg.replace(token_budget=res["prefix_len_run"] - slots * cfg.siglip.num_patches),
                             1, slots, state_token=MODELS[MODEL][4])
    peak, bw = res["ceilings"]["gemm_tflops"] * 1e12, res["ceilings"]["copy_tbps"] * 1e12
    res["stages"] = {}
    for name, fn in stages.items():
        ms = statistics.median(cuda_ms(fn, 50))
        c = costs[name]
        res["stages"][name] = {"ms": ms, "tflop": c.flops / 1e12, "gbytes": c.bytes / 1e9, "intensity": c.intensity,
                               "achieved_tflops": c.flops / ms / 1e9, "floor_ms": 1e3 * c.floor_s(peak, bw)}
    res["floor_ms"] = sum(s["floor_ms"] for s in res["stages"].values())

    # Full policy path as the node runs it (480x640 uint8 in, robot-unit actions out), host timed: predict_batch
    # starts the vision graph once the frames are up and builds the prompt while it runs; "sequential" is the
    # same work with the whole of prepare before the first graph (the path before that overlap, for comparison).
    images, state = observation(rng, 1)

    def sequential():
        x = policy.prepare(images, state, TASK)
        return policy.unnormalize_actions(runner.sample(observe(runner, policy, x), noise))

    def host_timed(launch) -> dict:
        for _ in range(3):
            launch().cpu()
        wall, parts = [], []
        for _ in range(50):
            sync()
            t0 = time.perf_counter()
            out = launch()
            t1 = time.perf_counter()
            out.cpu()
            t2 = time.perf_counter()
            wall.append(1e3 * (t2 - t0))
            parts.append((1e3 * (t1 - t0), 1e3 * (t2 - t1)))
        # Host time until every graph is launched, then the wait for the chunk on the host.
        return {"median": statistics.median(wall), "p99": pct(wall, 99),
                **{k: statistics.median(p[i] for p in parts) for i, k in enumerate(("host_launch", "wait"))}}
    res["policy_path_ms"] = host_timed(lambda: policy.predict_batch(images, state, TASK, noise))
    res["policy_path_sequential_ms"] = host_timed(sequential)
    # The frames as the node holds them: copied into pinned memory by the camera callback (runtime/transfer.py).
    held = {k: pinned_array(v) for k, v in images.items()}
    res["policy_path_pinned_ms"] = host_timed(lambda: policy.predict_batch(held, state, TASK, noise))
    if args.host_profile:   # where the node's policy path's host time goes (cProfile, the GPU drained first)
        import cProfile
        import pstats
        prof = cProfile.Profile()
        for _ in range(50):
            sync()
            prof.enable()
            policy.predict_batch(held, state, TASK, noise)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)

    # Batching: T_sync(B), Q(B) = B / T_sync, T_amort(B) = T_sync / B.
    res["batching"] = {}
    for b in [int(x) for x in args.batches.split(",")]:
        inputs_b, noise_b = prepared(b)
        reset_peak()

        state_b = policy.state_padded(inputs_b)

        def chunk_b():
            return runner.sample(observe(runner, policy, inputs_b, state_b), noise_b)

        t_sync = statistics.median(cuda_ms(chunk_b, args.batch_iters))
        res["batching"][b] = {"T_sync_ms": t_sync, "Q_per_s": 1e3 * b / t_sync, "T_amort_ms": t_sync / b,
                              "peak_mem_gb": peak_gb()}
        print(f"batch {b}: {res['batching'][b]}", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    b1 = res["batch1"]
    print(f"\n{MODELS[MODEL][3]} {args.config} on {res['device']} (prefix {res['prefix_len_run']} of {res['prefix_len']}, "
          f"{cfg.num_steps} steps, ops {res['ops']})")
    print(f"batch 1: median {b1['median_ms']:.2f} ms  p90 {b1['p90_ms']:.2f}  p99 {b1['p99_ms']:.2f}  "
          f"({b1['runs']} runs), host CPU {b1['host_cpu_ms']:.2f} ms/chunk, peak {b1['peak_mem_gb']:.1f} GB")
    print(f"ceilings: GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, copy {res['ceilings']['copy_tbps']:.2f} TB/s;"
          f" roofline floor {res['floor_ms']:.2f} ms")
    print(f"{'stage':8} {'ms':>7} {'TFLOP':>7} {'GB':>6} {'FLOP/B':>7} {'TFLOP/s':>8} {'floor ms':>8}")
    for name, s in res["stages"].items():
        print(f"{name:8} {s['ms']:7.2f} {s['tflop']:7.3f} {s['gbytes']:6.2f} {s['intensity']:7.0f} "
              f"{s['achieved_tflops']:8.0f} {s['floor_ms']:8.2f}")
    for key, what in (("policy_path_ms", "policy path"), ("policy_path_sequential_ms", "  prepare, then graphs"),
                      ("policy_path_pinned_ms", "  frames pinned as the node holds them")):
        pp = res[key]
        print(f"{what} (480x640 uint8 -> actions, host timed): median {pp['median']:.2f} ms p99 {pp['p99']:.2f} "
              f"(host until launched {pp['host_launch']:.2f}, then the wait {pp['wait']:.2f})")
    print(f"{'B':>3} {'T_sync ms':>10} {'Q /s':>8} {'T_amort ms':>10} {'mem GB':>7}")
    for b, r in res["batching"].items():
        print(f"{b:>3} {r['T_sync_ms']:10.2f} {r['Q_per_s']:8.1f} {r['T_amort_ms']:10.2f} {r['peak_mem_gb']:7.1f}")
    print(f"start-up: {res['startup']}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
