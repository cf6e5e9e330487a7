#!/usr/bin/env python3
"""Cosmos3 policy benchmark: batch-1 latency and its stages (VAE, conditioning, generation), batches, memory,
start-up, and the same call through diffusers 0.42.1's Cosmos3OmniPipeline when its wheels are importable.

Random weights at the diffusers defaults (hidden 4096, 36 layers, 32 heads / 8 KV heads, head_dim 128, the
Wan 2.2 VAE; ~15 B parameters, printed) drawn on the device in bf16, kept in memory (only configs and the
byte-level stand-in tokenizer are written; --startup disk writes and reloads the whole folder instead). The
runner captures the conditioning and the whole denoising loop as CUDA graphs. Settings default to PhyAI's
published policy setting: 4 UniPC steps, guidance 3.0 (cond + uncond batched as one batch of two), a 32-action
chunk, the 480 tier's 480x832 canvas (33 frames). The vision tokens follow the camera image's content (never
upscaled): a 480x832 image fills the canvas (9 x 30 x 52 latents, 3510 tokens per pass), a 180x320 DROID frame
does not (9 x 11 x 20, 540 tokens); both are measured (--images), batching and diffusers on the first.

    python scripts/bench_cosmos3.py --out /tmp/cosmos3.json                 # full size, cuda, bf16
    python scripts/bench_cosmos3.py --device cpu --config tiny --iters 2    # fp32 smoke run of the same code
    python scripts/bench_cosmos3.py --vae-only --iters 5                    # the VAE stage: clip vs frame 0

Timing as every benchmark here (scripts/call_timing.py): warm-up calls, then CUDA events per call. Batch 1 is
timed from prepared inputs (tokens, canvas: host side, reported apart) to the action chunk, as diffusers' call
is timed from its arguments (it tokenizes and resizes inside): once with the text pathway run for every chunk (a
new instruction each time, as diffusers does) and once with the instruction kept (a robot's case).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

T_PROCESS = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from call_timing import call_ms, startup_in_child  # noqa: E402  (scripts/, next to this file)
from phyai_ros.models.cosmos3 import Cosmos3Adapter, Cosmos3Settings, TransformerConfig, VaeConfig  # noqa: E402
from phyai_ros.layers.quantized import SCHEMES  # noqa: E402
from phyai_ros.models.cosmos3 import transformer as tfm  # noqa: E402
from phyai_ros.models.cosmos3.checkpoint import (load_cosmos3_checkpoint, random_checkpoint,  # noqa: E402
                                                 write_random_checkpoint)
from phyai_ros.models.cosmos3.config import (FULL_TRANSFORMER, FULL_VAE, transformer_parameter_count,  # noqa: E402
                                             vae_encoder_parameter_count)
from phyai_ros.models.cosmos3.costs import cosmos3_stage_costs  # noqa: E402

TINY_TRANSFORMER = TransformerConfig(hidden_size=32, head_dim=16, num_heads=4, num_kv_heads=2, intermediate_size=64,
                                     num_layers=2, hidden_act="silu", rope_axes_dim=(4, 2, 2), action_dim=32,
                                     vocab_size=272)
TINY_VAE = VaeConfig(base_dim=8, dim_mult=(1, 1, 1, 1), num_res_blocks=1)
TASK = "pick up the red block from the table and place it in the blue bowl"
PHYAI = {"chunk_s": 1.132, "vae_s": 0.213, "conditioning_s": 0.126, "generation_s": 0.793,
         "what": "PhyAI's published Cosmos3-Nano-Policy-DROID figure: one Hopper GPU, eager, BF16, batch 1, 4 steps, "
                 "CFG 3.0, 32 actions, 33 frames at 480x832 (issue 25)"}


def sync(device) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device) -> float:
    return torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else float("nan")


def configs(name: str):
    return (FULL_TRANSFORMER, FULL_VAE) if name == "full" else (TINY_TRANSFORMER, TINY_VAE)


def settings(args) -> Cosmos3Settings:
    return Cosmos3Settings(num_steps=args.steps, guidance=args.guidance, chunk_size=args.chunk, fps=args.fps,
                           resolution_tier=args.tier, view_point="ego_view", domain="droid_lerobot")


def build(args, dtype, disk: bool):
    """(policy, seconds to build / load the weights)."""
    tcfg, vcfg = configs(args.config)
    root = args.root / args.config
    t0 = time.perf_counter()
    if disk:
        if not (root / "transformer" / "diffusion_pytorch_model.safetensors").is_file():
            write_random_checkpoint(root, tcfg, vcfg, seed=0, device=args.device, dtype=dtype)
        ckpt = load_cosmos3_checkpoint(root)
    else:
        ckpt = random_checkpoint(root, tcfg, vcfg, seed=0, device=args.device, dtype=dtype)
    policy = Cosmos3Adapter(ckpt, settings(args), args.device, dtype, token_bucket=args.token_bucket)
    del ckpt
    policy.use_runner(use_graphs=args.device == "cuda", token_bucket=args.token_bucket)
    sync(args.device)
    return policy, time.perf_counter() - t0


def image_batch(size: str, batch: int, seed: int = 0) -> dict:
    """A random camera image of size "HxW", batch times."""
    h, w = (int(v) for v in size.split("x"))
    return {"image": np.random.default_rng(seed).integers(0, 256, (batch, h, w, 3), dtype=np.uint8)}


def prepared(policy, size: str, batch: int):
    x = policy.prepare(image_batch(size, batch), [TASK] * batch)
    return x, policy.stages.observation(x), policy.make_noise(x, torch.Generator().manual_seed(0))


def first_chunk(args) -> dict:
    """What a fresh process does before the robot can act: weights, capture, the first chunk."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    t0 = time.perf_counter()
    policy, _ = build(args, dtype, args.startup == "disk")
    t_load = time.perf_counter()
    size = args.images.split(",")[0]
    x, obs, (vis, act) = prepared(policy, size, 1)
    policy.runner.run(obs, x.layout, vis.to(policy.device), act.to(policy.device))   # captures on CUDA
    sync(args.device)
    t_capture = time.perf_counter()
    actions = policy.sample_actions(policy.prepare(image_batch(size, 1, 1), TASK))
    t_first = time.perf_counter()
    return {"import_s": t0 - T_PROCESS, "weights_s": t_load - t0, "capture_s": t_capture - t_load,
            "first_chunk_s": t_first - t_capture, "in_process_total_s": t_first - T_PROCESS,
            "weights_from": args.startup, "finite": bool(torch.isfinite(actions).all())}


def bench_diffusers(policy, args) -> dict:
    """The same call through diffusers' pipeline (eager; it re-runs the text tokens every step and pass), from
    the same random weights and noise; the chunk's max-abs against ours."""
    try:
        import diffusers
        from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
        from PIL import Image
        from transformers import AutoTokenizer
    except Exception as exc:           # an optional comparison: absent wheels are a note, not a failure
        return {"skipped": f"diffusers / transformers not importable ({exc.__class__.__name__}: {exc})"}
    tcfg, vcfg = configs(args.config)
    root = args.root / args.config
    dev, dtype = args.device, policy.dtype
    from phyai_ros.models.cosmos3.checkpoint import random_transformer_state, random_vae_state
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)         # built on the device in the model dtype: no fp32 copy of 15 B
    try:
        with torch.device(dev):
            t = Cosmos3OmniTransformer(**{k: v for k, v in tcfg.to_json().items() if not k.startswith("_")})
            vae = AutoencoderKLWan(**{k: v for k, v in vcfg.to_json().items() if not k.startswith("_")})
    finally:
        torch.set_default_dtype(default)
    t.load_state_dict(random_transformer_state(tcfg, 0, 0.02, dev, dtype, lm_head=True))   # the policy's draw
    t.time_embedder.float()                # diffusers keeps it in float32 (_keep_in_fp32_modules)
    vae.load_state_dict(random_vae_state(vcfg, 1, dev, dtype), strict=False)              # the encoder's
    pipe = Cosmos3OmniPipeline(transformer=t.eval(), text_tokenizer=AutoTokenizer.from_pretrained(root / "text_tokenizer"),
                               vae=vae.eval(), scheduler=UniPCMultistepScheduler.from_pretrained(root / "scheduler"),
                               enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    s = policy.settings
    size = args.images.split(",")[0]
    image = Image.fromarray(image_batch(size, 1)["image"][0])

    def call():
        action = CosmosActionCondition(mode="policy", chunk_size=s.chunk_size, domain_name=s.domain,
                                       resolution_tier=s.resolution_tier, image=image, view_point=s.view_point)
        return pipe(prompt=TASK, negative_prompt=s.negative_prompt, action=action, num_inference_steps=s.num_steps,
                    guidance_scale=s.guidance, fps=s.fps, generator=torch.Generator("cpu").manual_seed(0),
                    output_type="latent", enable_safety_check=False)

    torch.cuda.reset_peak_memory_stats() if dev == "cuda" else None
    lat = call_ms(call, args.diffusers_iters, 1, dev)
    theirs = call().action[0].float()
    x = policy.prepare(image_batch(size, 1), TASK)
    ours = policy.sample_actions(x, policy.make_noise(x, torch.Generator().manual_seed(0)))[0].cpu()
    return {"version": diffusers.__version__, "batch1_median_ms": statistics.median(lat), "runs": len(lat),
            "min_ms": min(lat), "peak_mem_gib": peak_gib(dev), "actions_maxabs_vs_ours": (ours - theirs).abs().max().item(),
            "actions_max": theirs.abs().max().item()}


def measure_image(policy, args, size: str) -> dict:
    """Batch 1 from prepared inputs (graphs on CUDA) and its stages for one camera image size."""
    dev, stages, runner = args.device, policy.stages, policy.runner
    torch.cuda.reset_peak_memory_stats() if dev == "cuda" else None
    x, obs, (vis, act) = prepared(policy, size, 1)
    host = []
    for _ in range(5):
        t = time.perf_counter()
        stages.observation(policy.prepare(image_batch(size, 1), TASK))
        host.append(1e3 * (time.perf_counter() - t))
    text_len, gen_len = obs["ids"].shape[1], x.layout.tokens
    out = {"tokens": {"text_padded": text_len, "cond": len(x.cond_ids[0]), "uncond": len(x.uncond_ids[0]),
                      "vision": x.layout.vision_tokens, "actions": x.layout.chunk, "rows": obs["ids"].shape[0],
                      "canvas": [x.canvas.height, x.canvas.width], "content": [x.canvas.content_h, x.canvas.content_w],
                      "latent": [x.layout.frames, x.layout.height, x.layout.width]},
           "host_prepare_ms": statistics.median(host)}
    vis, act = vis.to(policy.device), act.to(policy.device)
    lat = call_ms(lambda: runner.run(obs, x.layout, vis, act), args.iters, 2, dev)
    out["batch1"] = {"median_ms": statistics.median(lat), "p90_ms": float(np.percentile(lat, 90)),
                     "min_ms": min(lat), "max_ms": max(lat), "runs": len(lat), "peak_mem_gib": peak_gib(dev)}
    print(f"{size} batch 1: {out['batch1']}  tokens {out['tokens']}", flush=True)
    # as a robot runs it: a new image every chunk, the instruction kept (its text keys / values not recomputed)
    key = stages.text_key(x)
    kept = call_ms(lambda: runner.run(obs, x.layout, vis, act, text_key=key), args.iters, 2, dev)
    out["batch1_kept_instruction"] = {"median_ms": statistics.median(kept), "p90_ms": float(np.percentile(kept, 90))}
    print(f"{size} batch 1, instruction kept: {out['batch1_kept_instruction']}", flush=True)
    bucket = runner.set_observation(obs, x.layout)
    lay = x.layout
    fns = {"vae": lambda: stages.encode(bucket.obs["frames"], lay),
           "conditioning": lambda: tfm.text_kv(stages.w, stages.cfg, bucket.obs["ids"], bucket.obs["text_cos"],
                                               bucket.obs["text_sin"], bucket.obs["causal"], stages.parallel.reduce),
           "generation": (lambda: runner.sample(bucket, vis, act))}
    costs = cosmos3_stage_costs(stages.cfg, obs["ids"].shape[0], text_len, gen_len, args.steps)
    out["stages"] = {}
    for name, fn in fns.items():
        ms = statistics.median(call_ms(fn, max(3, args.iters // 2), 1, dev))
        out["stages"][name] = {"ms": ms, "graph": name == "generation" and runner.use_graphs}
        if name in costs:
            flops = costs[name].flops
            out["stages"][name].update(tflop=flops / 1e12, achieved_tflops=flops / ms / 1e9)
    print(f"{size} stages (vae and conditioning eager, generation "
          f"{'graph' if runner.use_graphs else 'eager'}): {out['stages']}", flush=True)
    return out


def measure_quantized(policy, args, ours, save) -> dict:
    """The same weights with the generation pathway quantized as a robot would load them (the adapter's
    quantization setting): batch 1 per image size, and the chunk against the unquantized one (same noise)."""
    t0 = time.perf_counter()
    policy.use_settings(replace(policy.settings, quantization=args.quantized))   # a fresh runner of the same kind
    out = {"scheme": policy.quantization(), "quantize_s": time.perf_counter() - t0}
    size = args.images.split(",")[0]
    x = policy.prepare(image_batch(size, 1), TASK)
    theirs = policy.sample_actions(x, policy.make_noise(x, torch.Generator().manual_seed(0)))[0].float().cpu()
    out.update(actions_maxabs_vs_unquantized=(theirs - ours).abs().max().item(), actions_max=ours.abs().max().item(),
               actions_rms_ratio=((theirs - ours).pow(2).mean() / ours.pow(2).mean()).sqrt().item())
    print(f"quantized: {out}", flush=True)
    for size in args.images.split(","):
        out[size] = measure_image(policy, args, size)
        save()
    return out


def run(args, res: dict, save) -> dict:
    """Fills `res` section by section, calling save() after each (a later failure keeps the earlier figures)."""
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    tcfg, vcfg = configs(args.config)
    res.update({"bench": "cosmos3_policy", "config": args.config, "device": torch.cuda.get_device_name() if dev == "cuda"
           else "cpu", "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "settings": settings(args).__dict__, "images": args.images.split(","), "phyai_reference": PHYAI,
           "parameters": {"transformer": transformer_parameter_count(tcfg),
                          "transformer_without_lm_head": transformer_parameter_count(tcfg, lm_head=False),
                          "vae_encoder": vae_encoder_parameter_count(vcfg)}})
    print(f"parameters: transformer {res['parameters']['transformer'] / 1e9:.3f} B (policy reads "
          f"{res['parameters']['transformer_without_lm_head'] / 1e9:.3f} B), VAE encoder "
          f"{res['parameters']['vae_encoder'] / 1e6:.1f} M", flush=True)
    if args.startup == "skip":
        res["startup"] = {"skipped": True}
    else:
        res["startup"] = startup_in_child([__file__, "--first-chunk", *sys.argv[1:]])
        print(f"start-up: {res['startup']}", flush=True)
    save()
    policy, res["weights_s"] = build(args, dtype, disk=False)
    res["per_image"] = {}
    for size in args.images.split(","):
        res["per_image"][size] = measure_image(policy, args, size)
        save()
    runner, size = policy.runner, args.images.split(",")[0]
    res["batching"] = {}
    for b in [int(v) for v in args.batches.split(",") if v]:
        try:
            xb, ob, (vb, ab) = prepared(policy, size, b)
            vb, ab = vb.to(policy.device), ab.to(policy.device)
            torch.cuda.reset_peak_memory_stats() if dev == "cuda" else None
            t_sync = statistics.median(call_ms(lambda: runner.run(ob, xb.layout, vb, ab), args.batch_iters, 1, dev))
            res["batching"][b] = {"T_sync_ms": t_sync, "Q_per_s": 1e3 * b / t_sync, "T_amort_ms": t_sync / b,
                                  "peak_mem_gib": peak_gib(dev)}
        except torch.cuda.OutOfMemoryError as exc:     # record it; the smaller batches' figures stand
            res["batching"][b] = {"out_of_memory": str(exc)[:300]}
            xb = ob = vb = ab = None
            torch.cuda.empty_cache()
        print(f"batch {b}: {res['batching'][b]}", flush=True)
        save()
    x = policy.prepare(image_batch(size, 1), TASK)
    ours = policy.sample_actions(x, policy.make_noise(x, torch.Generator().manual_seed(0)))[0].float().cpu()
    res["finite"] = bool(torch.isfinite(ours).all())
    if args.diffusers == "on":
        del runner
        try:
            res["diffusers"] = bench_diffusers(policy, args)
        except Exception as exc:    # the reference is a comparison: its failure must not lose our figures
            res["diffusers"] = {"error": f"{exc.__class__.__name__}: {str(exc)[:1500]}"}
        print(f"diffusers: {res['diffusers']}", flush=True)
    save()
    if args.quantized:          # last: it replaces the policy's generation weights
        runner = None           # the bf16 runner's graphs go with it
        res["quantized"] = measure_quantized(policy, args, ours, save)
    return res


def precision(args) -> dict:
    """One chunk of the same random weights, image and noise in fp32 (TF32 off), in bf16, and in bf16 with the
    generation pathway in fp8: how far each moves the actions at full size (eager, one image size)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    size, chunks, out = args.images.split(",")[0], {}, {}
    for name, dtype, scheme in (("fp32", torch.float32, None), ("bf16", torch.bfloat16, None),
                                ("w8a8", torch.bfloat16, "w8a8")):
        try:
            policy, _ = build(args, dtype, disk=False)
            if scheme:
                policy.use_settings(replace(policy.settings, quantization=scheme))
            policy.use_runner(use_graphs=False)
            x = policy.prepare(image_batch(size, 1), TASK)
            t0 = time.perf_counter()
            chunks[name] = policy.sample_actions(x, policy.make_noise(x, torch.Generator().manual_seed(0)))[0]
            chunks[name] = chunks[name].float().cpu()
            out[name] = {"chunk_s": time.perf_counter() - t0}
        except torch.cuda.OutOfMemoryError as exc:
            out[name] = {"out_of_memory": str(exc)[:300]}
        policy = x = None
        torch.cuda.empty_cache()
        print(f"{name}: {out[name]}", flush=True)
    pairs = [(a, b) for a, b in (("bf16", "fp32"), ("w8a8", "fp32"), ("w8a8", "bf16")) if a in chunks and b in chunks]
    for a, b in pairs:
        d, ref = chunks[a] - chunks[b], chunks[b]
        out[f"{a}_vs_{b}"] = {"maxabs": d.abs().max().item(), "max_ref": ref.abs().max().item(),
                              "rms_ratio": (d.pow(2).mean() / ref.pow(2).mean()).sqrt().item()}
        print(f"{a} vs {b}: {out[f'{a}_vs_{b}']}", flush=True)
    return {"bench": "cosmos3_precision", "image": size, "date": time.strftime("%Y-%m-%d"),
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", **out}


def vae_only(args) -> dict:
    """The VAE stage alone, fast to set up (random encoder weights, no transformer): the clip the pipeline encodes
    (the frame repeated over (T - 1) x 4 + 1 frames) against frame 0 alone, which the policy encodes (the encoder
    is causal in time), on the first --images size's canvas; and their latent frame 0 compared."""
    from phyai_ros.models.cosmos3 import vae
    dev, dtype = args.device, (torch.bfloat16 if args.device == "cuda" else torch.float32)
    _, vcfg = configs(args.config)
    g = torch.Generator(device=dev).manual_seed(0)
    w = {k: (torch.randn(*shape, generator=g, device=dev) * (0.02 if len(shape) > 1 else 1.0)).to(dtype)
         for k, shape in vae.key_shapes(vcfg).items()}
    h, wd = (int(v) for v in args.images.split(",")[0].split("x"))
    sf = vcfg.scale_factor_spatial
    h, wd = -(-h // sf) * sf, -(-wd // sf) * sf
    frames = 1 + ((args.chunk + 1 - 1) // vcfg.scale_factor_temporal) * vcfg.scale_factor_temporal
    frame = torch.rand(1, 3, 1, h, wd, generator=g, device=dev).mul(2).sub(1).to(dtype)
    clip = frame.expand(-1, -1, frames, -1, -1)
    out = {"canvas": [h, wd], "clip_frames": frames}
    lat = {}
    for name, x in (("clip", clip), ("frame0", frame)):
        lat[name] = vae.encode(w, vcfg, x)
        out[name + "_ms"] = statistics.median(call_ms(lambda x=x: vae.encode(w, vcfg, x), args.iters, 2, dev))
    ref = lat["clip"][:, :, :1].float()
    out["frame0_maxabs_vs_clip"] = (lat["frame0"].float() - ref).abs().max().item()
    out["clip_latent_maxabs"] = ref.abs().max().item()
    print(f"VAE on a {h}x{wd} canvas: clip of {frames} frames {out['clip_ms']:.1f} ms, frame 0 alone "
          f"{out['frame0_ms']:.1f} ms; latent frame 0 max-abs difference {out['frame0_maxabs_vs_clip']:.3g} "
          f"(of max {out['clip_latent_maxabs']:.3g})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="full", choices=("full", "tiny"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--fps", type=float, default=24.0)
    ap.add_argument("--tier", type=int, default=480)
    ap.add_argument("--images", default="480x832,180x320",
                    help="camera image sizes HxW, comma-separated (batching and diffusers use the first): 480x832 "
                         "fills the 480 tier's canvas (9 x 15 x 26 vision tokens), a 180x320 DROID frame sits "
                         "un-upscaled in the same canvas (9 x 6 x 10)")
    ap.add_argument("--token-bucket", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--batches", default="2,4,8")
    ap.add_argument("--batch-iters", type=int, default=3)
    ap.add_argument("--startup", default="memory", choices=("memory", "disk", "skip"),
                    help="how the start-up child gets its weights: drawn on the device, or written to --root and "
                         "read back (30 GB at full size)")
    ap.add_argument("--diffusers", default="on", choices=("on", "off"))
    ap.add_argument("--quantized", default=None, choices=SCHEMES,
                    help="then the generation pathway quantized with this scheme (the same weights), measured again")
    ap.add_argument("--diffusers-iters", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/phyai_cosmos3_bench"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "bench_cosmos3.json")
    ap.add_argument("--first-chunk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vae-only", action="store_true",
                    help="only the VAE stage: the pipeline's repeated clip against frame 0 alone (random weights)")
    ap.add_argument("--precision", action="store_true",
                    help="only one chunk in fp32, bf16 and bf16 + fp8 generation: the actions' differences")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_cosmos3: no CUDA device; nothing to measure (try --device cpu --config tiny)")
        return
    if args.first_chunk:
        with torch.no_grad():
            print(json.dumps(first_chunk(args)))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for flag, fn in ((args.vae_only, vae_only), (args.precision, precision)):
        if flag:
            with torch.no_grad():
                args.out.write_text(json.dumps(fn(args), indent=1))
            return
    res: dict = {}
    with torch.no_grad():
        run(args, res, lambda: args.out.write_text(json.dumps(res, indent=1)))
    print(json.dumps({k: v for k, v in res.items() if k not in ("stages", "batching")}))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
