#!/usr/bin/env python3
"""MiniCPM-Robot runtime benchmark on a CUDA device: latency (bf16 and fp32 head), stages against their floors,
batching, host prepare, start-up, and transformers' own MiniCPM-V 4.6 with an eager head in the same process.

Writes a random-weight checkpoint of the released sizes (SigLIP 27 x 1152 with the window merger after layer 6,
Qwen3.5 24 layers x 1024 LLLF, DiT 16 x 768, 30 x 80 actions, 32 banks; bf16 on disk) with the parity set's
processor files (stand-in tokenizer, its special ids), loads it through the real loader, and times the observation
runner (CUDA graphs) from prepared inputs to the chunk, and predict from three raw 480x640 views to the chunk.

    python scripts/bench_minicpm.py --out /tmp/minicpm.json                # full size, cuda
    python scripts/bench_minicpm.py --device cpu --config tiny --iters 2   # smoke run of the same code

The reference: ``MiniCPMV4_6ForConditionalGeneration`` of the installed transformers (bf16, sdpa; fla absent:
its torch GDN), forward over the same token layout, then the fixture README's head and sampler in eager fp32
(test/minicpm_reference.py's), as OpenBMB's stack runs them; timed the same way (call_timing.call_ms).
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
sys.path.insert(0, str(REPO / "test"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_runtime import ceilings, pct  # noqa: E402  (scripts/, next to this file)
from call_timing import call_ms, startup_in_child  # noqa: E402
from phyai_ros.models.minicpm import head as head_mod  # noqa: E402
from phyai_ros.models.minicpm import language, vision  # noqa: E402
from phyai_ros.models.minicpm.adapter import MiniCpmAdapter  # noqa: E402
from phyai_ros.models.minicpm.checkpoint import key_shapes  # noqa: E402
from phyai_ros.models.minicpm.config import written_config  # noqa: E402
from phyai_ros.models.minicpm.processor import pixels_from_levels  # noqa: E402
from phyai_ros.runtime.graphs import capture  # noqa: E402
from phyai_ros.runtime.transfer import pinned_array  # noqa: E402

FIXTURE = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or REPO.parent / "shared" / "fixtures" / "lerobot_parity"
               ).parent / "minicpm_parity"
FULL_VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
               "image_size": 980, "patch_size": 14, "insert_layer_id": 6}
FULL_TEXT = {"vocab_size": 248094, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
             "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6, "num_attention_heads": 8,
             "num_key_value_heads": 2, "head_dim": 256, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_conv_kernel_dim": 4,
             "partial_rotary_factor": 0.25,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [11, 11, 10], "mrope_interleaved": True}}
FULL_HEAD = {"num_attention_heads": 12, "attention_head_dim": 64, "num_layers": 16, "output_dim": 1024,
             "decoder_hidden": 1024, "action_dim": 80, "state_dim": 80, "action_horizon": 30,
             "num_future_tokens": 32, "max_seq_len": 1024, "num_embodiments": 32}
CAMERAS = ("base", "left_wrist", "right_wrist")
TASK = "Task: pick up the red block and place it in the blue bowl on the left side of the table."
REFERENCE = {"whole_ms": 98.9, "vlm_ms": 85.4, "vision_ms": 32.7, "head_ms": 20.0, "one_view_ms": 80.5,
             "what": "issue 37's anchor: transformers 5.17 MiniCPM-V 4.6 bf16 sdpa (no fla) + eager fp32 head, H100"}
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def write_checkpoint(root: Path, config: str, std: float = 0.02) -> float:
    """root/ = the set's processor files, the full (or tiny) sizes written into its configs, random bf16 weights
    drawn on the device; returns seconds."""
    from safetensors.torch import save_file
    t0 = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(FIXTURE / "processor", root / "processor")
    backbone = json.loads((FIXTURE / "backbone_config.json").read_text())
    head = json.loads((FIXTURE / "config.json").read_text())["head"]
    if config == "full":
        backbone["vision_config"].update(FULL_VISION)
        backbone["insert_layer_id"] = FULL_VISION["insert_layer_id"]
        backbone["text_config"].update(FULL_TEXT)
        head = dict(FULL_HEAD)
    (root / "backbone_config.json").write_text(json.dumps(backbone, indent=1))
    cfg = {"type": "minicpm_robot", "cameras": list(CAMERAS), "head": head, "sampler": {"num_steps": 4}}
    (root / "config.json").write_text(json.dumps(cfg, indent=1))
    model_cfg = written_config(backbone, root / "backbone_config.json", head)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    weights = {}
    for k, shape in sorted(key_shapes(model_cfg).items()):
        t = torch.randn(shape, generator=gen, device=DEVICE) * std
        plain_gain = not k.startswith("model.language_model.") or k.endswith("linear_attn.norm.weight")
        if len(shape) == 1 and "norm" in k and k.endswith("weight") and plain_gain:
            t = t + 1.0
        weights[k] = t.to(torch.bfloat16).cpu()
    save_file(weights, str(root / "model.safetensors"))
    return time.perf_counter() - t0


def load(root: Path, head_dtype: str, token_bucket: int = 0):
    policy = MiniCpmAdapter.load(root, camera_names=list(CAMERAS), device=DEVICE,
                                 dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32,
                                 options={"head_dtype": head_dtype})
    policy.use_runner(use_graphs=DEVICE == "cuda", token_bucket=token_bucket)
    return policy


def frames(rng, batch: int = 1, hw=(480, 640)):
    return [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for _ in range(batch * len(CAMERAS))]


def prepared(policy, batch: int, rng):
    state = rng.standard_normal((batch, policy.state_dim)).astype(np.float32)
    return policy.prepare(frames(rng, batch), state, [TASK] * batch, [0] * batch)


def first_chunk(root: Path) -> dict:
    t0 = time.perf_counter()
    policy = load(root, "float32", token_bucket=32)
    sync()
    t_load = time.perf_counter()
    rng = np.random.default_rng(0)
    images = dict(zip(CAMERAS, frames(rng)))
    state = np.zeros(policy.state_dim, np.float32)
    policy.capture_buckets(images, state)
    sync()
    t_capture = time.perf_counter()
    chunk = policy.predict(dict(zip(CAMERAS, frames(rng))), state, TASK)
    t_first = time.perf_counter()
    return {"import_s": t0 - T_PROCESS, "load_s": t_load - t0, "capture_s": t_capture - t_load,
            "buckets": len(policy.runner.buckets()), "first_chunk_s": t_first - t_capture,
            "in_process_total_s": t_first - T_PROCESS, "finite": bool(np.isfinite(chunk).all())}


def stage_graphs(policy, inputs, eager: bool = False) -> dict:
    """Each stage alone as a graph (vision, text model, context + loop) on the runner's own buffers."""
    m, w, c = policy.model, policy.weights, policy.config
    obs = m.observation(inputs)
    noise = policy._noise(None, inputs.input_ids.shape[0])
    pixels = pixels_from_levels(obs["frames"], m.levels, m.vlm_dtype)
    feats = vision.image_features(w, c, pixels)
    embeds = language.scatter_image_rows(language.embed_tokens(w, obs["input_ids"]), obs["image_rows"], feats)
    vl = m.backbone(obs)
    prefix, weight, unused = m.solver_tensors(None, noise.shape[0])

    def head_fn():
        ctx = m.context(obs, vl)
        return m.loop(ctx, m.step_tables(), noise, prefix, weight, unused)
    fns = {"vision": lambda: vision.image_features(w, c, pixels_from_levels(obs["frames"], m.levels, m.vlm_dtype)),
           "language": lambda: language.text_model(w, c.text, embeds, obs["attention_mask"], (obs["cos"], obs["sin"])),
           "head": head_fn}
    if DEVICE != "cuda" or eager:
        return fns
    return {k: capture(f, ()).replay for k, f in fns.items()}


def stage_costs(policy, batch: int, tokens: int, weight_bytes: int, head_bytes: int) -> dict:
    """Logical FLOPs and bytes per stage (weights read once per use, 2 FLOPs a multiply-add, attention over
    every (query, key) pair), as the other families' stage rooflines count."""
    c = policy.config
    v, t, h = c.vision, c.text, c.head
    frames_n = batch * len(CAMERAS)
    n = (policy.frame_size[0] // v.patch_size) * (policy.frame_size[1] // v.patch_size)
    block = 4 * v.width ** 2 + 2 * v.width * v.mlp_dim
    pre, post = v.insert_layer_id + 1, v.depth - v.insert_layer_id - 1
    vis_params = v.depth * block + 3 * v.patch_size ** 2 * v.width
    vis_flops = frames_n * 2 * (pre * n + post * n // 4) * block + frames_n * 4 * v.width * (pre * n * n + post * (n // 4) ** 2)
    attn_p = t.width * (2 * t.num_heads * t.head_dim + 2 * t.num_kv_heads * t.head_dim) + t.num_heads * t.head_dim * t.width
    gdn_p = t.width * (t.conv_dim + t.value_dim + 2 * t.gdn_v_heads) + t.value_dim * t.width
    mlp_p = 3 * t.width * t.mlp_dim
    full = sum(k == "full_attention" for k in t.layer_types)
    lm_params = full * attn_p + (t.depth - full) * gdn_p + t.depth * mlp_p
    lm_flops = batch * (2 * tokens * lm_params + full * 4 * tokens * tokens * t.num_heads * t.head_dim
                        + (t.depth - full) * 4 * tokens * t.gdn_chunk * t.gdn_v_heads * t.gdn_k_dim)
    rows = h.future_tokens + h.horizon
    dit_p = h.depth * (4 * h.width ** 2 + 2 * h.width * h.ffn_dim) + h.width * h.output_dim
    per_item = (h.action_dim + h.state_dim) * h.hidden + 3 * h.hidden * h.hidden + h.output_dim * h.decoder_hidden \
        + h.decoder_hidden * h.action_dim
    head_flops = h.num_steps * batch * 2 * rows * (dit_p + per_item) + h.num_steps * batch * 4 * rows * tokens * h.width * (h.depth // 2)
    head_bytes_total = h.num_steps * (dit_p + batch * per_item) * head_bytes
    return {"vision": (vis_flops, vis_params * weight_bytes), "language": (lm_flops, lm_params * weight_bytes),
            "head": (head_flops, head_bytes_total)}


def reference_call(policy, batch: int, seq_len: int):
    """transformers' MiniCPM-V 4.6 (bf16, sdpa) + the README's eager fp32 head on the same token layout."""
    import transformers
    from minicpm_reference import reference_head
    from transformers import MiniCPMV4_6Config, MiniCPMV4_6ForConditionalGeneration
    backbone = json.loads((policy.ckpt.folder / "backbone_config.json").read_text())
    config = MiniCPMV4_6Config.from_dict(backbone)
    for cfg in (config, config.text_config, config.vision_config):
        cfg._attn_implementation = "sdpa"
    with torch.device(DEVICE):
        model = MiniCPMV4_6ForConditionalGeneration(config).to(torch.bfloat16).eval()
    hw = {k[len(head_mod.HEAD):]: v.float() for k, v in policy.ckpt.weights.items() if k.startswith(head_mod.HEAD)}
    for i in range(policy.config.head.depth):   # the adapter fused these at load: the reference reads them apart
        b = f"model.transformer_blocks.{i}.attn1."
        parts = ("q", "k", "v") if i % 2 else ("k", "v")
        fused = hw.pop(b + "to_" + "".join(parts) + ".weight"), hw.pop(b + "to_" + "".join(parts) + ".bias")
        for j, p in enumerate(parts):
            hw[b + f"to_{p}.weight"] = fused[0].chunk(len(parts))[j]
            hw[b + f"to_{p}.bias"] = fused[1].chunk(len(parts))[j]
    hw = {k: v for k, v in hw.items() if not k.endswith("colsum")}
    h = policy.config.head
    spec = {"heads": h.num_heads, "horizon": h.horizon, "action_dim": h.action_dim, "layers": h.depth}
    rng = np.random.default_rng(0)
    inputs = prepared(policy, batch, rng)
    patch = 14
    pixels = pixels_from_levels(inputs.frames, policy.model.levels, torch.bfloat16)   # [F, 3, 448, 448]
    f, _, hh, ww = pixels.shape
    packed = pixels.reshape(f, 3, hh // patch, patch, ww // patch, patch).permute(1, 3, 0, 2, 4, 5) \
        .reshape(1, 3, patch, -1)
    sizes = torch.tensor([[hh // patch, ww // patch]] * f, dtype=torch.int32, device=DEVICE)
    state = torch.randn(batch, h.state_dim, device=DEVICE)
    noise = torch.randn(batch, h.horizon, h.action_dim, device=DEVICE)
    ids = torch.zeros(batch, dtype=torch.int64, device=DEVICE)

    def vlm():
        with torch.no_grad():
            out = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, pixel_values=packed,
                        target_sizes=sizes, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1].float()

    def whole():
        vl = vlm()
        with torch.no_grad():
            return reference_head(hw, spec, vl, state, noise, ids)

    def vision_only():
        with torch.no_grad():
            return model.model.get_image_features(packed, sizes)
    vl = vlm()
    return {"whole": whole, "vlm": vlm, "vision": vision_only,
            "head": lambda: reference_head(hw, spec, vl, state, noise, ids)}, transformers.__version__


def timed(fn, iters: int) -> dict:
    ms = call_ms(fn, iters, device=DEVICE)
    return {"median_ms": statistics.median(ms), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99)}


def main() -> None:
    global DEVICE
    torch.backends.cuda.matmul.allow_tf32 = False   # fp32 means IEEE fp32 here (the head's default dtype)
    torch.backends.cudnn.allow_tf32 = False
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="full", choices=("full", "tiny"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--root", default="/tmp/minicpm_bench")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reference", default="on", choices=("on", "off"))
    ap.add_argument("--startup", default="on", choices=("on", "off"))
    ap.add_argument("--first-chunk", default=None, help="(internal) a fresh process's start-up, JSON on stdout")
    ap.add_argument("--profile", default="on", choices=("on", "off"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    DEVICE = args.device
    if args.first_chunk:
        print(json.dumps(first_chunk(Path(args.first_chunk))))
        return
    root = Path(args.root)
    out = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "config": args.config, "date": time.strftime("%Y-%m-%d")}
    if DEVICE == "cuda":
        out["ceilings"] = ceilings()
    out["write_checkpoint_s"] = write_checkpoint(root, args.config)
    if args.startup == "on":
        out["startup"] = startup_in_child([__file__, "--first-chunk", str(root), "--device", DEVICE])
        print("startup", json.dumps(out["startup"]), flush=True)
    rng = np.random.default_rng(1)
    for head_dtype in ("bfloat16", "float32"):
        policy = load(root, head_dtype)
        res = out.setdefault(f"head_{head_dtype}", {})
        # predict from three raw 480x640 views (pinned as the node holds them) to the chunk, and host prepare alone
        images = {c: pinned_array(f) for c, f in zip(CAMERAS, frames(rng))}
        state = rng.standard_normal(policy.state_dim).astype(np.float32)
        res["predict"] = timed(lambda: policy.predict(images, state, TASK), args.iters)
        t_host = []
        for _ in range(args.iters):
            t = time.perf_counter()
            policy._observation(images, state, TASK)
            t_host.append(1e3 * (time.perf_counter() - t))
            sync()
        res["host_prepare_ms"] = statistics.median(t_host)
        for batch in [int(b) for b in args.batches.split(",")]:
            inputs = prepared(policy, batch, rng)
            noise = policy._noise(None, batch)
            obs = policy.model.observation(inputs)
            run = {"chunk": timed(lambda: policy.runner.run(obs, noise), args.iters)}
            run["chunks_per_s"] = 1e3 * batch / run["chunk"]["median_ms"]
            if batch == 1 or head_dtype == "float32":
                stages = stage_graphs(policy, inputs)
                tokens = inputs.input_ids.shape[1]
                costs = stage_costs(policy, batch, tokens, 2, 2 if head_dtype == "bfloat16" else 4)
                for name, fn in stages.items():
                    t = timed(fn, args.iters)
                    flops, nbytes = costs[name]
                    if DEVICE == "cuda":
                        cl = out["ceilings"]
                        t["floor_ms"] = max(flops / (cl["gemm_tflops"] * 1e9), nbytes / (cl["copy_tbps"] * 1e9))
                    run[name] = t
                run["tokens"] = tokens
                if args.profile == "on" and batch == 1 and DEVICE == "cuda":
                    from bench_groot import kernel_profile   # its per-stage kernel table (CUDA)
                    run["kernels"] = kernel_profile(stage_graphs(policy, inputs, eager=True), timeline="")
            res[f"batch{batch}"] = run
            print(head_dtype, batch, json.dumps(run), flush=True)
            if args.out:   # what was measured so far survives a later failure or the time limit
                Path(args.out).write_text(json.dumps(out, indent=1))
        if DEVICE == "cuda":
            res["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        if args.reference == "on" and head_dtype == "float32":
            try:
                fns, version = reference_call(policy, 1, None)
                out["reference"] = {"transformers": version, **{k: timed(f, max(3, args.iters // 3))
                                                                 for k, f in fns.items()}}
            except Exception as exc:   # the reference is the installed transformers': report, go on
                out["reference"] = {"error": repr(exc)[:2000]}
            print("reference", json.dumps(out["reference"]), flush=True)
        policy = None   # its GPU memory back before the next head dtype
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    out["anchor"] = REFERENCE
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
