#!/usr/bin/env python3
"""GR00T N1.7 runtime benchmark on a CUDA device: latency, stages, batching, memory, start-up, roofline.

Writes a random-weight checkpoint in LeRobot's layout (checkpoint/ + base_model/ + backbone/, full size by
default: Cosmos-Reason2-2B's Qwen3-VL cut at layer 16, 32-layer DiT of width 1536, 4 flow steps, 40-action
horizon, 132-dim state / action; bf16), loads it through the real loader and times the observation runner
(CUDA graphs) from prepared inputs to the action chunk, as LeRobot's predict_action_chunk is timed from its
preprocessed tensors. One and two 256x256 views. Prints a table, writes JSON to --out.

    python scripts/bench_groot.py --out /tmp/groot.json          # full size, cuda, bf16
    python scripts/bench_groot.py --device cpu --config tiny      # fp32 smoke run of the same code (fixture dims)

Configs and tokenizer come from the parity fixture folder (PHYAI_PARITY_FIXTURES/groot_n17; its token ids are
kept, only sizes change), so the processor, chat template and loader are the real ones.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

T_PROCESS = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_runtime import ceilings, pct  # noqa: E402  (scripts/, next to this file)
from call_timing import call_ms, startup_in_child  # noqa: E402
from phyai_ros.models.groot_n17 import GrootAdapter  # noqa: E402
from phyai_ros.models.groot_n17.checkpoint import PREFIX, groot_key_shapes  # noqa: E402
from phyai_ros.models.groot_n17.config import groot_config  # noqa: E402
from phyai_ros.models.groot_n17.modeling import groot_stage_costs  # noqa: E402
from phyai_ros.runtime.transfer import pinned_array  # noqa: E402

FIXTURE = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or REPO.parent / "shared" / "fixtures" / "lerobot_parity") \
    / "groot_n17"
# Public N1.7 sizes (LeRobot 0.6.1 GR00T_N1_7_DEFAULTS + its hard-coded Cosmos-Reason2-2B Qwen3-VL config, as
# ../shared/tools/lerobot_groot_gpu.py builds them: 3.144 B parameters).
FULL_TEXT = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28}
FULL_ROPE = {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_theta": 5000000, "rope_type": "default"}
FULL_VISION = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "patch_size": 16,
               "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 2048,
               "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17]}
FULL_HEAD = {"select_layer": 16, "backbone_embedding_dim": 2048, "hidden_size": 1024, "input_embedding_dim": 1536,
             "max_state_dim": 132, "max_action_dim": 132, "action_horizon": 40, "max_num_embodiments": 32,
             "max_seq_len": 1024, "num_inference_timesteps": 4,
             "vl_self_attention_cfg": {"num_attention_heads": 32, "attention_head_dim": 64, "num_layers": 4},
             "diffusion_model_cfg": {"num_attention_heads": 32, "attention_head_dim": 48, "num_layers": 32,
                                     "output_dim": 1024}}
GEOMETRY = {"image_target_size": [256, 256], "image_crop_size": [230, 230]}   # LeRobot's N1.7 defaults
CAMERAS = ("front", "wrist")
TASK_WORDS = ("pick up the red block and place it in the blue bowl on the left side of the table then push the "
              "drawer closed and wave").split()
TEXT_TOKENS = 40        # LeRobot's reference: 40 non-image tokens per prompt (L = 104 with one view)
LEROBOT_REF = {"batch1_median_ms": 115.8, "batch1_p90_ms": 119.4, "batch1_p99_ms": 130.0, "backbone_ms": 33.6,
               "action_head_ms": 83.1, "batch8_ms": 142.1, "batch32_ms": 177.9, "peak_gib_b1": 5.97,
               "what": "LeRobot 0.6.1 GrootPolicy.predict_action_chunk, bf16 parameters, one 256x256 view, 104 "
                       "tokens, no compile option in LeRobot for GR00T; NVIDIA H200, 2026-12-01, "
                       "../shared/tools/lerobot_groot_gpu.py, recorded in ../shared/device-wheels/README.md"}
DEVICE, DTYPE = "cuda", torch.bfloat16


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak_gb() -> float:
    return torch.cuda.max_memory_allocated() / 2 ** 30 if DEVICE == "cuda" else float("nan")


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))


def write_checkpoint(root: Path, full: bool, std: float = 0.02) -> float:
    """root/{backbone, base_model, checkpoint_1view, checkpoint_2views} from the fixture's files with the full
    sizes written in, random weights drawn on the device; returns seconds."""
    from safetensors.torch import save_file
    t0 = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copytree(FIXTURE / "backbone", root / "backbone")
    shutil.copytree(FIXTURE / "base_model", root / "base_model", ignore=shutil.ignore_patterns("*.safetensors"))
    if full:
        def backbone(d):
            d["text_config"].update(FULL_TEXT)
            d["text_config"]["rope_parameters"] = FULL_ROPE
            d["vision_config"].update(FULL_VISION)
        _edit_json(root / "backbone" / "config.json", backbone)
        _edit_json(root / "backbone" / "preprocessor_config.json",
                   lambda d: d.update(patch_size=16, size={"shortest_edge": 65536, "longest_edge": 16777216}))
        _edit_json(root / "base_model" / "config.json", lambda d: d.update(FULL_HEAD, **GEOMETRY))
    for views in (1, 2):
        ck = root / f"checkpoint_{views}view{'s' if views > 1 else ''}"
        shutil.copytree(FIXTURE / "checkpoint", ck, ignore=shutil.ignore_patterns("model.safetensors"))
        drop = [f"observation.images.{c}" for c in CAMERAS[views:]]
        _edit_json(ck / "config.json", lambda d: [d["input_features"].pop(k) for k in drop])
        if full:
            _edit_json(ck / "config.json", lambda d: d.update(chunk_size=40, n_action_steps=40, max_state_dim=132,
                                                              max_action_dim=132))

            def vlm_step(d):
                for s in d["steps"]:
                    if s["registry_name"] == "groot_n1_7_vlm_encode_v1":
                        s["config"].update(GEOMETRY)
            _edit_json(ck / "policy_preprocessor.json", vlm_step)
    cfg = groot_config(json.loads((root / "backbone" / "config.json").read_text()),
                       json.loads((root / "base_model" / "config.json").read_text()), "backbone", "base_model")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    weights = {PREFIX + k: (torch.randn(s, generator=gen, device=DEVICE) * std).to(DTYPE).cpu()
               for k, s in sorted(groot_key_shapes(cfg).items())}
    save_file(weights, str(root / "checkpoint_1view" / "model.safetensors"))
    # One file for both views: a hard link (a symlink out of its folder is refused by the checkpoint loader, as a
    # hostile path is), a copy where the filesystem has no links.
    one, two = root / "checkpoint_1view" / "model.safetensors", root / "checkpoint_2views" / "model.safetensors"
    try:
        os.link(one, two)
    except OSError:
        shutil.copyfile(one, two)
    return time.perf_counter() - t0


def checkpoint_dir(root: Path, views: int) -> Path:
    return root / f"checkpoint_{views}view{'s' if views > 1 else ''}"


def load(root: Path, views: int):
    policy = GrootAdapter.from_files(checkpoint_dir(root, views), device=DEVICE, dtype=DTYPE)
    # The adapter's own runner, with graphs on CUDA, as the node and the serve engine set it up: predict (image to
    # chunk) and the stage timings then run the same graphs.
    return policy, policy.use_runner(use_graphs=DEVICE == "cuda")


def task_for(policy, views: int) -> str:
    """The longest prefix of TASK_WORDS whose prompt has at most TEXT_TOKENS non-image tokens."""
    best = TASK_WORDS[0]
    for k in range(1, len(TASK_WORDS) + 1):
        task = " ".join(TASK_WORDS[:k])
        x = prepared(policy, 1, views, task, np.random.default_rng(0))
        if int((x.input_ids != policy.config.tokens.image).sum()) > TEXT_TOKENS:
            break
        best = task
    return best


def observation_frames(policy, views: int, rng):
    """One robot observation: 480x640 uint8 frames of the first ``views`` cameras and a raw state vector."""
    return ({c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in CAMERAS[:views]},
            rng.standard_normal(policy.state_dim).astype(np.float32))


def prepared(policy, batch: int, views: int, task: str, rng):
    images = {c: rng.integers(0, 256, (batch, 480, 640, 3), dtype=np.uint8) for c in CAMERAS[:views]}
    state = rng.standard_normal((batch, policy.state_dim)).astype(np.float32)
    return policy.prepare(images, state, [task] * batch)


def first_chunk(root: Path) -> dict:
    """What a fresh process does before the robot can act: load, capture the bucket, first chunk."""
    t0 = time.perf_counter()
    policy, runner = load(root, 1)
    sync()
    t_load = time.perf_counter()
    task = " ".join(TASK_WORDS[:8])
    rng = np.random.default_rng(0)
    runner.run(runner.model.observation(prepared(policy, 1, 1, task, rng)), policy.make_noise(1))
    sync()
    t_capture = time.perf_counter()
    x = prepared(policy, 1, 1, task, rng)
    actions = policy.decode(runner.run(runner.model.observation(x), policy.make_noise(1)), x).cpu()
    t_first = time.perf_counter()
    return {"import_s": t0 - T_PROCESS, "load_s": t_load - t0, "capture_s": t_capture - t_load,
            "first_chunk_s": t_first - t_capture, "in_process_total_s": t_first - T_PROCESS,
            "finite": bool(torch.isfinite(actions).all())}


def kernel_profile(fns: dict, timeline: str = "loop", timeline_len: int = 400) -> dict:
    """Per stage, run eagerly once under torch.profiler: kernel count, kernel time, the top kernels; for the
    ``timeline`` stage also its first ``timeline_len`` kernels in launch order (name, us), so one DiT block's
    kernels can be read off (the per-block timeline the loop's figures are explained by)."""
    out = {}
    activity = torch.profiler.ProfilerActivity.CUDA if DEVICE == "cuda" else torch.profiler.ProfilerActivity.CPU
    for name, fn in fns.items():
        fn()
        sync()
        with torch.profiler.profile(activities=[activity]) as prof:
            fn()
            sync()
        rows = []
        for e in prof.key_averages():
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if us:
                rows.append((us, e.count, e.key[:90]))
        rows.sort(reverse=True)
        out[name] = {"kernels": sum(r[1] for r in rows), "kernel_ms": sum(r[0] for r in rows) / 1e3,
                     "top": [{"name": n, "count": c, "ms": us / 1e3} for us, c, n in rows[:25]]}
        if name == timeline:
            kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith(DEVICE.upper())
                       and (DEVICE == "cuda" or e.cpu_parent is None)]   # on the CPU: the top-level ops
            kernels.sort(key=lambda e: e.time_range.start)
            out[name]["timeline"] = [(e.name[:80], round(e.time_range.elapsed_us(), 2))
                                     for e in kernels[:timeline_len]]
    return out


def bench_views(root: Path, views: int, args, res: dict) -> dict:
    policy, runner = load(root, views)
    stages, cfg = runner.model, policy.config
    rng = np.random.default_rng(0)
    task = task_for(policy, views)
    out = {"task": task}
    torch.cuda.reset_peak_memory_stats() if DEVICE == "cuda" else None
    x = prepared(policy, 1, views, task, rng)
    obs, noise = stages.observation(x), policy.make_noise(1)
    length, n_img = x.input_ids.shape[1], x.image_grid_thw.shape[0]
    patches = int(x.image_grid_thw[0].prod())
    out.update(tokens=length, image_tokens=int((x.input_ids == cfg.tokens.image).sum()), patches_per_view=patches)
    lat = call_ms(lambda: runner.run(obs, noise), args.iters, 5, DEVICE)
    out["batch1"] = {"median_ms": statistics.median(lat), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
                     "min_ms": min(lat), "max_ms": max(lat), "runs": len(lat), "peak_mem_gib": peak_gb()}
    # Host side, frames made beforehand (making a 480x640 frame with numpy costs ~1 ms itself): the processor and
    # the backbone plan up to the graphs (host prepare), and the robot's whole wait, frames in memory to actions
    # in robot units on the host (image to chunk, through the adapter's predict as the node calls it).
    frames = [observation_frames(policy, views, rng) for _ in range(25)]
    noise1 = policy.make_noise(1)
    host, whole = [], []
    for i, (images, state) in enumerate(frames):
        sync()
        t = time.perf_counter()
        stages.observation(policy.prepare(images, state[None], [task]))
        sync()
        host.append(1e3 * (time.perf_counter() - t))
        t = time.perf_counter()
        policy.predict(images, state, task, noise1)
        whole.append(1e3 * (time.perf_counter() - t))
    host, whole = host[5:], whole[5:]
    # The same with the frames as the node holds them: copied into pinned memory by its camera callback.
    pinned = []
    for images, state in [({k: pinned_array(v) for k, v in im.items()}, st) for im, st in frames]:
        sync()
        t = time.perf_counter()
        policy.predict(images, state, task, noise1)
        pinned.append(1e3 * (time.perf_counter() - t))
    pinned = pinned[5:]
    if args.host_profile:   # where host prepare's time goes (cProfile, the GPU drained before each call)
        import cProfile
        import pstats
        prof = cProfile.Profile()
        for images, state in frames:
            sync()
            prof.enable()
            stages.observation(policy.prepare(images, state[None], [task]))
            sync()
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    out["host_prepare_ms"] = statistics.median(host)   # processor + stages.observation, not in batch1
    out["image_to_chunk_ms"] = {"median": statistics.median(whole), "p99": pct(whole, 99)}
    out["image_to_chunk_pinned_ms"] = {"median": statistics.median(pinned), "p99": pct(pinned, 99)}
    bucket = runner.set_observation(obs)
    runner.sample(bucket, noise)
    if runner.use_graphs:
        fns = {"backbone": bucket.backbone.replay, "context": bucket.context.replay, "loop": bucket.loop.replay}
    else:
        feats = stages.backbone(bucket.obs)
        ctx = stages.context(bucket.obs, feats)
        loop_args = (ctx, bucket.tables, bucket.noise, bucket.seed, bucket.keep, bucket.weight)
        fns = {"backbone": lambda: stages.backbone(bucket.obs), "context": lambda: stages.context(bucket.obs, feats),
               "loop": lambda: stages.loop(*loop_args)}
    costs = groot_stage_costs(cfg, 1, n_img, patches, length)
    peak, bw = res["ceilings"]["gemm_tflops"] * 1e12, res["ceilings"]["copy_tbps"] * 1e12
    out["stages"] = {}
    for name, fn in fns.items():
        ms = statistics.median(call_ms(fn, 50, 3, DEVICE))
        c = costs[name]
        out["stages"][name] = {"ms": ms, "tflop": c.flops / 1e12, "gbytes": c.bytes / 1e9, "intensity": c.intensity,
                               "achieved_tflops": c.flops / ms / 1e9, "achieved_tbps": c.bytes / ms / 1e9,
                               "floor_ms": 1e3 * c.floor_s(peak, bw)}
    out["head_ms"] = out["stages"]["context"]["ms"] + out["stages"]["loop"]["ms"]
    out["floor_ms"] = sum(s["floor_ms"] for s in out["stages"].values())
    if args.profile and views == 1:
        feats = stages.backbone(bucket.obs)
        ctx = stages.context(bucket.obs, feats)
        loop_args = (ctx, bucket.tables, bucket.noise, bucket.seed, bucket.keep, bucket.weight)
        try:
            out["eager_kernel_profile"] = kernel_profile({
                "backbone": lambda: stages.backbone(bucket.obs), "context": lambda: stages.context(bucket.obs, feats),
                "loop": lambda: stages.loop(*loop_args)})
        except Exception as exc:  # the profile is a diagnosis, never a reason to lose the figures
            out["eager_kernel_profile"] = {"error": repr(exc)[:500]}
    out["batching"] = {}
    for b in [int(v) for v in args.batches.split(",") if v]:
        xb = prepared(policy, b, views, task, rng)
        obs_b, noise_b = stages.observation(xb), policy.make_noise(b)
        torch.cuda.reset_peak_memory_stats() if DEVICE == "cuda" else None
        t_sync = statistics.median(call_ms(lambda: runner.run(obs_b, noise_b), args.batch_iters, 3, DEVICE))
        out["batching"][b] = {"T_sync_ms": t_sync, "Q_per_s": 1e3 * b / t_sync, "T_amort_ms": t_sync / b,
                              "peak_mem_gib": peak_gb()}
        print(f"{views} view(s) batch {b}: {out['batching'][b]}", flush=True)
    return out


def print_table(res: dict) -> None:
    print(f"\nGR00T N1.7 {res['config']} on {res['device']} ({res['dtype']}, date {res['date']}); ceilings "
          f"GEMM {res['ceilings']['gemm_tflops']:.0f} TFLOP/s, copy {res['ceilings']['copy_tbps']:.2f} TB/s")
    ref = LEROBOT_REF["batch1_median_ms"]
    for views, r in res["views"].items():
        b1 = r["batch1"]
        print(f"\n{views} view(s), {r['tokens']} tokens ({r['image_tokens']} image): batch 1 median "
              f"{b1['median_ms']:.2f} ms  p90 {b1['p90_ms']:.2f}  p99 {b1['p99_ms']:.2f} (p99/median "
              f"{b1['p99_ms'] / b1['median_ms']:.3f}, {b1['runs']} runs), peak {b1['peak_mem_gib']:.2f} GiB, "
              f"host prepare {r['host_prepare_ms']:.2f} ms, image to chunk {r['image_to_chunk_ms']['median']:.2f} ms "
              f"(p99 {r['image_to_chunk_ms']['p99']:.2f}; frames pinned as the node holds them "
              f"{r['image_to_chunk_pinned_ms']['median']:.2f}, p99 {r['image_to_chunk_pinned_ms']['p99']:.2f})"
              + (f"; LeRobot 0.6.1 {ref} ms -> {ref / b1['median_ms']:.1f}x" if views == "1" else ""))
        print(f"{'stage':9} {'ms':>7} {'TFLOP':>7} {'GB':>6} {'FLOP/B':>7} {'TFLOP/s':>8} {'TB/s':>6} {'floor ms':>8}")
        for name, s in r["stages"].items():
            print(f"{name:9} {s['ms']:7.3f} {s['tflop']:7.3f} {s['gbytes']:6.2f} {s['intensity']:7.0f} "
                  f"{s['achieved_tflops']:8.1f} {s['achieved_tbps']:6.2f} {s['floor_ms']:8.3f}")
        print(f"{'B':>3} {'T_sync ms':>10} {'Q /s':>8} {'T_amort ms':>10} {'mem GiB':>8}")
        for b, q in r["batching"].items():
            print(f"{b:>3} {q['T_sync_ms']:10.2f} {q['Q_per_s']:8.1f} {q['T_amort_ms']:10.2f} {q['peak_mem_gib']:8.2f}")
    print(f"\nstart-up to first chunk: {res['startup']}")


def drop_candidates(selector, spec: str) -> None:
    """Remove ``op:prefix`` candidates (never an op's last one, its reference), before any policy derives its
    selector (derived selectors share the candidate lists)."""
    import phyai_ros.layers.dispatch  # noqa: F401  registers the candidates
    for item in filter(None, spec.split(",")):
        op, prefix = item.split(":")
        if op not in selector.candidates:
            raise SystemExit(f"--drop-candidates: unknown op {op!r} (known: {sorted(selector.candidates)})")
        cands = selector.candidates[op]
        cands[:] = [c for c in cands[:-1] if not c.name.startswith(prefix)] + cands[-1:]


def main() -> None:
    global DEVICE, DTYPE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="full", choices=("full", "tiny"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--views", default="1,2")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batches", default="1,2,8,32")
    ap.add_argument("--batch-iters", type=int, default=20)
    ap.add_argument("--root", type=Path, default=Path("/tmp/phyai_groot_bench"))
    ap.add_argument("--reuse-checkpoint", action="store_true")
    ap.add_argument("--skip-startup", action="store_true")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--host-profile", action="store_true", help="print where host prepare's time goes (cProfile)")
    ap.add_argument("--drop-candidates", default="", metavar="OP:PREFIX,...",
                    help="A/B of single kernels: remove the selector candidates of OP whose name starts with PREFIX "
                         "(e.g. linear_gelu_tanh:triton,linear_add_layer_norm:skinny)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "bench_groot.json")
    ap.add_argument("--first-chunk", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    DEVICE, DTYPE = args.device, (torch.bfloat16 if args.device == "cuda" else torch.float32)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_groot: no CUDA device; nothing to measure (try --device cpu --config tiny)")
        return
    from phyai_ros.layers.profiles import load_device_profile
    from phyai_ros.layers.selector import SELECTOR
    # PHYAI_OP_PROFILE, else this device's cached or shipped profile (found by device name), as the node does.
    profile = load_device_profile(DEVICE)
    if args.first_chunk:
        print(json.dumps(first_chunk(args.root)))
        return
    print(profile.describe(), flush=True)
    drop_candidates(SELECTOR, args.drop_candidates)
    res = {"bench": "groot_n17_runner", "config": args.config, "dtype": str(DTYPE).replace("torch.", ""),
           "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "ops": SELECTOR.forced or (str(profile.path) if profile.path else "default"), "date": time.strftime("%Y-%m-%d"),
           "dropped_candidates": args.drop_candidates or None,
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "lerobot_reference": LEROBOT_REF}
    res["ceilings"] = ceilings() if DEVICE == "cuda" else {"gemm_tflops": 1.0, "copy_tbps": 0.05}
    if args.reuse_checkpoint and (args.root / "checkpoint_1view" / "model.safetensors").is_file():
        res["checkpoint_write_s"] = None
    else:
        res["checkpoint_write_s"] = write_checkpoint(args.root, args.config == "full")
    res["checkpoint_gb"] = (args.root / "checkpoint_1view" / "model.safetensors").stat().st_size / 1e9
    print(f"checkpoint {args.root}: {res['checkpoint_gb']:.2f} GB ({res['checkpoint_write_s']} s)", flush=True)
    if args.skip_startup:
        res["startup"] = {"skipped": True}
    else:
        res["startup"] = startup_in_child([__file__, "--first-chunk", "--device", DEVICE, "--root", str(args.root)])
        print(f"start-up to first chunk: {res['startup']}", flush=True)
    res["views"] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for views in [int(v) for v in args.views.split(",") if v]:
        res["views"][str(views)] = bench_views(args.root, views, args, res)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()    # the last view's policy and graphs are gone with bench_views' frame
        args.out.write_text(json.dumps(res, indent=1))
    print_table(res)
    print(json.dumps({k: v for k, v in res.items() if k != "views"}))


if __name__ == "__main__":
    main()
