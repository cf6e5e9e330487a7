"""Writes MiniCPM-Robot parity sets that the shared fixtures do not hold, from transformers 5.7.0 itself.

Run as a script in an interpreter that imports transformers 5.7.0 (test/test_minicpm_reference.py does, with the
pinned reference of scripts/setup_reference.sh on its path):

    python test/minicpm_reference.py OUT_DIR VARIANT

The set has the shared fixture's layout (config.json with its cases, backbone_config.json, weights.safetensors,
processor/, frames/, inputs.safetensors, expected.safetensors), so ``python -m phyai_ros.predict`` runs it the same
way. The backbone is transformers' ``MiniCPMV4_6ForConditionalGeneration`` (eager attention, fp32, CPU) behind its
own processor (PIL backend); the head and its sampler are written here from the fixture README's description
(plain torch, nothing of phyai_ros), so the two implementations are independent.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "minicpm_parity"

# Each variant: backbone overrides, head sizes, and the cases' items (instruction, raw view sizes, bank id).
VARIANTS = {
    # batch 2, three views of three sizes per item, other banks per item, GDN with more V than K heads,
    # the window merger after another layer, a 10 x 10 position table, a longer head
    "b2_gqa": dict(
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=3,
                    image_size=140, insert_layer_id=0),
        text=dict(hidden_size=40, intermediate_size=56, num_hidden_layers=6,
                  layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                               "linear_attention", "full_attention"],
                  num_attention_heads=4, num_key_value_heads=1, head_dim=12, linear_key_head_dim=6,
                  linear_value_head_dim=10, linear_num_key_heads=1, linear_num_value_heads=3, partial_rotary=0.5,
                  mrope_section=[1, 1, 1]),
        head=dict(heads=3, head_dim=8, layers=5, output_dim=20, decoder_hidden=36, action_dim=7, state_dim=4,
                  horizon=7, future=2, max_seq_len=12, banks=5),
        cases=[dict(name="b0_batch2", items=[("Task: stack the green block.", [(448, 448), (240, 320), (480, 640)], 4),
                                             ("Task: open the black drawer.", [(300, 200), (448, 448), (96, 128)], 1)])]),
    # 4x mode (no window merger, 256 tokens a view), one view, batch 1, unequal batch prompts (left padding)
    "x4_pad": dict(
        vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                    image_size=56, insert_layer_id=1),
        downsample_mode="4x",
        text=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                  layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, linear_key_head_dim=8,
                  linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, partial_rotary=0.25,
                  mrope_section=[1, 1, 0]),
        head=dict(heads=2, head_dim=8, layers=2, output_dim=16, decoder_hidden=20, action_dim=3, state_dim=5,
                  horizon=4, future=1, max_seq_len=8, banks=2),
        cases=[dict(name="c0_single", items=[("Task: wipe.", [(360, 480)], 1)]),
               dict(name="c1_padded", items=[("Task: pick the cup up and place it on the tray.", [(448, 448)], 0),
                                             ("Task: push.", [(200, 200)], 1)])]),
}
SEED, STD = 20261207, 0.15


def backbone_dict(variant: dict) -> dict:
    base = json.loads((FIXTURE / "backbone_config.json").read_text())
    base["vision_config"].update(variant["vision"])
    base["insert_layer_id"] = variant["vision"]["insert_layer_id"]
    base["downsample_mode"] = variant.get("downsample_mode", "16x")
    text = dict(variant["text"])
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": text.pop("partial_rotary"),
            "mrope_section": text.pop("mrope_section"), "mrope_interleaved": True}
    base["text_config"].update(text, rope_parameters=rope, partial_rotary_factor=rope["partial_rotary_factor"])
    return base


def random_weights(model, gen) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * STD)
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.add_(1.0)


def head_weights(h: dict, cross_dim: int, gen) -> dict:
    w = h["heads"] * h["head_dim"]
    e, a, s = h["banks"], h["action_dim"], h["state_dim"]
    shapes = {"action_encoder.W1.W": (e, a + s, w), "action_encoder.W1.b": (e, w),
              "action_encoder.W2.W": (e, 2 * w, w), "action_encoder.W2.b": (e, w),
              "action_encoder.W3.W": (e, w, w), "action_encoder.W3.b": (e, w),
              "action_decoder.layer1.W": (e, h["output_dim"], h["decoder_hidden"]),
              "action_decoder.layer1.b": (e, h["decoder_hidden"]),
              "action_decoder.layer2.W": (e, h["decoder_hidden"], a), "action_decoder.layer2.b": (e, a),
              "future_tokens.weight": (h["future"], w), "position_embedding.weight": (h["max_seq_len"], w),
              "model.timestep_encoder.timestep_embedder.linear_1.weight": (w, 256),
              "model.timestep_encoder.timestep_embedder.linear_1.bias": (w,),
              "model.timestep_encoder.timestep_embedder.linear_2.weight": (w, w),
              "model.timestep_encoder.timestep_embedder.linear_2.bias": (w,),
              "model.proj_out_1.weight": (2 * w, w), "model.proj_out_1.bias": (2 * w,),
              "model.proj_out_2.weight": (h["output_dim"], w), "model.proj_out_2.bias": (h["output_dim"],)}
    for i in range(h["layers"]):
        b = f"model.transformer_blocks.{i}."
        kv_in = cross_dim if i % 2 == 0 else w
        for name, shape in (("attn1.to_q", (w, w)), ("attn1.to_k", (w, kv_in)), ("attn1.to_v", (w, kv_in)),
                            ("attn1.to_out.0", (w, w)), ("ff.net.0.proj", (4 * w, w)), ("ff.net.2", (w, 4 * w)),
                            ("norm1.linear", (2 * w, w))):
            shapes[b + name + ".weight"], shapes[b + name + ".bias"] = shape, (shape[0],)
    return {k: torch.randn(v, generator=gen) * STD for k, v in shapes.items()}


def reference_head(hw: dict, h: dict, vl: torch.Tensor, state: torch.Tensor, noise: torch.Tensor,
                   ids: torch.Tensor) -> torch.Tensor:
    """The sampler and head of the fixture README, literally."""
    n_heads, t_len = h["heads"], h["horizon"]

    def bank(x, name):
        return torch.einsum("bti,bio->bto", x, hw[name + ".W"][ids]) + hw[name + ".b"][ids][:, None]

    def lin(x, name):
        return F.linear(x, hw[name + ".weight"], hw[name + ".bias"])

    def attention(q, k, v):
        b, tq, _ = q.shape
        split = lambda x: x.view(b, x.shape[1], n_heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return (p @ v).transpose(1, 2).reshape(b, tq, -1)

    batch, dev = state.shape[0], state.device
    actions = torch.zeros(batch, t_len, h["action_dim"], device=dev)
    for step in (4, 3, 2, 1):
        t = step / 4
        bucket = torch.full((batch,), min(int(t * 1000), 999), dtype=torch.int64, device=dev)
        noisy = t * noise + (1 - t) * actions
        x = torch.cat([noisy, state[:, None].expand(batch, t_len, -1)], -1)
        a = bank(x, "action_encoder.W1")
        half = a.shape[-1] // 2
        c = torch.log(torch.tensor(10000.0)) / half
        freq = torch.exp(-torch.arange(half, dtype=torch.float32, device=dev) * c.to(dev))
        angle = bucket.float()[:, None, None] * freq
        tau = torch.cat([angle.sin(), angle.cos()], -1).expand(-1, t_len, -1)
        hid = F.silu(bank(torch.cat([a, tau], -1), "action_encoder.W2"))
        af = bank(hid, "action_encoder.W3") + hw["position_embedding.weight"][:t_len]
        seq = torch.cat([hw["future_tokens.weight"].expand(batch, -1, -1), af], 1)
        exponent = (-math.log(10000) * torch.arange(128, dtype=torch.float32, device=dev)) / 127
        emb = bucket.float()[:, None] * torch.exp(exponent)[None]
        emb = torch.cat([emb.cos(), emb.sin()], -1)
        temb = lin(F.silu(lin(emb, "model.timestep_encoder.timestep_embedder.linear_1")),
                   "model.timestep_encoder.timestep_embedder.linear_2")
        xs = seq
        for i in range(h["layers"]):
            b = f"model.transformer_blocks.{i}."
            scale, shift = lin(F.silu(temb), b + "norm1.linear").chunk(2, -1)
            n = F.layer_norm(xs, (xs.shape[-1],), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]
            kv = vl if i % 2 == 0 else n
            out = attention(lin(n, b + "attn1.to_q"), lin(kv, b + "attn1.to_k"), lin(kv, b + "attn1.to_v"))
            xs = xs + lin(out, b + "attn1.to_out.0")
            ff = lin(F.gelu(lin(F.layer_norm(xs, (xs.shape[-1],), eps=1e-5), b + "ff.net.0.proj"),
                            approximate="tanh"), b + "ff.net.2")
            xs = xs + ff
        shift, scale = lin(F.silu(temb), "model.proj_out_1").chunk(2, -1)
        out = lin(F.layer_norm(xs, (xs.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None],
                  "model.proj_out_2")
        dec = bank(F.relu(bank(out, "action_decoder.layer1")), "action_decoder.layer2")
        actions = dec[:, -t_len:]
    return actions


def make_processor(folder: Path, processor_cls):
    """The processor of ``folder`` with its PIL image processor. Its video processor needs torchvision (not
    installed: the official environment has none either); images never reach it, so a stand-in carrying the one
    setting the processor reads takes its place (the argument's class check is skipped for it alone)."""
    from types import SimpleNamespace
    from transformers import AutoTokenizer
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
    pc = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    images = MiniCPMV4_6ImageProcessorPil(**{k: v for k, v in pc.items() if k != "image_processor_type"})
    video = SimpleNamespace(downsample_mode=pc["downsample_mode"])
    check = processor_cls.check_argument_for_proper_class
    processor_cls.check_argument_for_proper_class = \
        lambda self, n, a: a if n == "video_processor" else check(self, n, a)
    try:
        return processor_cls(image_processor=images, video_processor=video,
                             tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                             chat_template=(folder / "chat_template.jinja").read_text())
    finally:
        processor_cls.check_argument_for_proper_class = check


def frame(h: int, w: int, gen) -> np.ndarray:
    """A smooth random RGB view (a coarse random field upsampled), so resizing matters."""
    coarse = torch.rand(1, 3, max(2, h // 16), max(2, w // 16), generator=gen)
    full = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]
    noise = torch.rand(3, h, w, generator=gen) * 0.2
    return ((full * 0.8 + noise).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def main(out: Path, name: str) -> None:
    from transformers import MiniCPMV4_6Config, MiniCPMV4_6ForConditionalGeneration, MiniCPMV4_6Processor
    variant = VARIANTS[name]
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "frames").mkdir(exist_ok=True)
    shutil.copytree(FIXTURE / "processor", out / "processor", dirs_exist_ok=True)
    if variant.get("downsample_mode") == "4x":
        pc = json.loads((out / "processor" / "processor_config.json").read_text())
        for section in ("image_processor", "video_processor"):
            pc[section]["downsample_mode"] = "4x"
        (out / "processor" / "processor_config.json").write_text(json.dumps(pc, indent=2))
    backbone = backbone_dict(variant)
    (out / "backbone_config.json").write_text(json.dumps(backbone, indent=1))
    config = MiniCPMV4_6Config.from_dict(backbone)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(SEED)
    model = MiniCPMV4_6ForConditionalGeneration(config).eval()
    random_weights(model, gen)
    h = variant["head"]
    hw = head_weights(h, backbone["text_config"]["hidden_size"], gen)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    weights.update({"action_head." + k: v for k, v in hw.items()})
    save_file(weights, str(out / "weights.safetensors"))
    processor = make_processor(out / "processor", MiniCPMV4_6Processor)
    inputs, expected, cases = {}, {}, []
    for case in variant["cases"]:
        items, cams, images, convs = case["items"], [], [], []
        for b, (text, sizes, _) in enumerate(items):
            content = []
            for k, (hh, ww) in enumerate(sizes):
                raw = frame(hh, ww, gen)
                path = f"frames/{case['name']}_item{b}_cam{k}.png"
                Image.fromarray(raw).save(out / path)
                cams.append({"item": b, "cam": k, "file": path, "raw_hw": [hh, ww],
                             "sha256": hashlib.sha256((out / path).read_bytes()).hexdigest()})
                images.append(Image.fromarray(raw).resize((448, 448)))
                content.append({"type": "image", "image": images[-1]})
            content.append({"type": "text", "text": text})
            convs.append([{"role": "user", "content": content}])
        proc = processor.apply_chat_template(convs if len(convs) > 1 else convs[0], tokenize=True,
                                             add_generation_prompt=True, return_dict=True, return_tensors="pt",
                                             processor_kwargs={"padding": len(convs) > 1})
        with torch.no_grad():
            res = model(input_ids=proc["input_ids"], attention_mask=proc["attention_mask"],
                        pixel_values=proc["pixel_values"], target_sizes=proc["target_sizes"],
                        output_hidden_states=True, use_cache=False)
        vl = res.hidden_states[-1].float()
        batch = len(items)
        state = torch.randn(batch, 1, h["state_dim"], generator=gen)
        noise = torch.randn(batch, h["horizon"], h["action_dim"], generator=gen)
        ids = torch.tensor([bank for _, _, bank in items], dtype=torch.int64)
        p = case["name"] + "."
        inputs.update({p + "state": state, p + "noise": noise, p + "embodiment_id": ids})
        expected.update({p + "vl_embs": vl, p + "proc.input_ids": proc["input_ids"],
                         p + "proc.attention_mask": proc["attention_mask"]})
        padded = bool((proc["attention_mask"] == 0).any())
        if not padded:   # the head's treatment of padded rows is not the reference's to say
            expected[p + "actions"] = reference_head(hw, h, vl, state[:, 0], noise, ids)
        cases.append({"name": case["name"], "kind": "e2e", "batch": batch, "embodiment_id": ids.tolist(),
                      "items": [{"instruction": text} for text, _, _ in items], "cams": cams, "padded": padded})
    cfg = {"set": name, "head": {"num_attention_heads": h["heads"], "attention_head_dim": h["head_dim"],
                                 "num_layers": h["layers"], "output_dim": h["output_dim"],
                                 "decoder_hidden": h["decoder_hidden"], "action_dim": h["action_dim"],
                                 "state_dim": h["state_dim"], "action_horizon": h["horizon"],
                                 "num_future_tokens": h["future"], "max_seq_len": h["max_seq_len"],
                                 "num_embodiments": h["banks"]},
           "sampler": {"num_steps": 4}, "cases": cases}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(inputs, str(out / "inputs.safetensors"))
    save_file({k: v.contiguous() for k, v in expected.items()}, str(out / "expected.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
