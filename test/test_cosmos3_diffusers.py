"""Cosmos3 against diffusers 0.42.1 itself on tiny instances the shared fixtures do not cover (the test extra
`cosmos3-reference` in setup.py; skipped where diffusers is not importable).

The fixtures fix one architecture (relu2, no text q/k norm, the extra text-key norm, a one-width VAE) and one
scheduler config; the real checkpoint's may differ. Each case here saves a random diffusers pipeline with
save_pretrained, loads the folder with our loader and runs the same pipeline call: silu MLP with text q/k
norms and attention biases; a VAE whose widths grow (shortcut convolutions, grouped averaging) with two
residual blocks; UniPC of order 3 with a disabled corrector, the native flow
schedule, a terminal shift and sigma_min; no fps modulation, spatial ids not reset; a chunk that is not a
multiple of 4 and one below 4 (one latent frame); an image to snap to 16 and one to downscale into the canvas.
Same bound as the fixtures: 1e-4 max-abs, fp32 CPU.
"""
import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")
if diffusers.__version__ != "0.42.1":
    pytest.skip(f"diffusers {diffusers.__version__}: the reference is 0.42.1", allow_module_level=True)

TOL = 1e-4
TASK = "stack the green cube on top of the yellow one"

CASES = {
    "silu_qknorm_bias": dict(
        transformer=dict(hidden_act="silu", qk_norm_for_text=True, use_und_k_norm_for_gen=False, attention_bias=True,
                         unified_3d_mrope_reset_spatial_ids=False),
        vae=dict(dim_mult=[1, 2, 2, 2], num_res_blocks=2),
        scheduler=dict(solver_order=3, solver_type="bh2", disable_corrector=[1]),
        native=False, image=(100, 150), chunk=6, steps=5, guidance=4.0, fps=15.0, negative="shaky", view="wrist_view",
        domain="fractal"),
    "relu2_nofps_native": dict(
        transformer=dict(hidden_act="relu2", qk_norm_for_text=False, use_und_k_norm_for_gen=True,
                         enable_fps_modulation=False),
        vae=dict(dim_mult=[1, 1, 2, 2], num_res_blocks=1),
        scheduler=dict(solver_order=2, final_sigmas_type="zero", shift_terminal=0.2),
        native=True, image=(400, 400), chunk=2, steps=3, guidance=2.0, fps=10.0, negative=None,
        view="third_person_view", domain="pusht"),
    "silu_g1_sigma_min": dict(
        transformer=dict(hidden_act="silu", qk_norm_for_text=True, use_und_k_norm_for_gen=True),
        vae=dict(dim_mult=[1, 1, 1, 1], num_res_blocks=1),
        scheduler=dict(solver_order=2, final_sigmas_type="sigma_min", flow_shift=3.0),
        native=False, image=(144, 256), chunk=8, steps=4, guidance=1.0, fps=24.0, negative=None, view="ego_view",
        domain="droid_lerobot"),
}


def _randomize(module, seed):
    """Every parameter random (norm gains 1 + 0.1 N, weights scaled by fan-in, the rest 0.1 N): no term may hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            n = torch.randn(p.shape, generator=g)
            if "norm" in name or name.endswith("gamma"):
                p.copy_(1 + 0.1 * n)
            elif p.dim() >= 2 and "fc" not in name and "embed_tokens" not in name:
                p.copy_(n / p[0].numel() ** 0.5)
            else:
                p.copy_(0.1 * n)


def _pipeline(spec, folder):
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler
    from transformers import AutoTokenizer

    from phyai_ros.models.cosmos3.checkpoint import write_byte_tokenizer
    t = Cosmos3OmniTransformer(hidden_size=32, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                               intermediate_size=64, num_hidden_layers=2, rope_axes_dim=[4, 2, 2], action_gen=True,
                               action_dim=12, num_embodiment_domains=32, vocab_size=272, **spec["transformer"])
    rng = np.random.default_rng(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=48, is_residual=True, patch_size=2, in_channels=12, out_channels=12,
                           scale_factor_spatial=16, scale_factor_temporal=4, temperal_downsample=[False, True, True],
                           latents_mean=rng.normal(0, 0.2, 48).tolist(), latents_std=rng.uniform(0.4, 1.3, 48).tolist(),
                           **spec["vae"])
    _randomize(t, 1)
    _randomize(vae, 2)
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    **{"flow_shift": 5.0, **spec["scheduler"]})
    tok = AutoTokenizer.from_pretrained(write_byte_tokenizer(folder / "tok"))
    pipe = Cosmos3OmniPipeline(transformer=t.eval(), text_tokenizer=tok, vae=vae.eval(), scheduler=sched,
                               enable_safety_checker=False, use_native_flow_schedule=spec["native"])
    pipe.set_progress_bar_config(disable=True)
    pipe.save_pretrained(folder / "pipeline")
    return pipe


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_pipeline_variants(tmp_path, name):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
    from PIL import Image

    from phyai_ros.models.cosmos3 import Cosmos3Adapter, Cosmos3Settings
    torch.manual_seed(0)
    spec = CASES[name]
    pipe = _pipeline(spec, tmp_path)
    image = np.random.default_rng(4).integers(0, 256, (*spec["image"], 3), dtype=np.uint8)
    action = CosmosActionCondition(mode="policy", chunk_size=spec["chunk"], domain_name=spec["domain"],
                                   resolution_tier=256, image=Image.fromarray(image), view_point=spec["view"])
    with torch.no_grad():
        out = pipe(prompt=TASK, negative_prompt=spec["negative"], action=action, num_inference_steps=spec["steps"],
                   guidance_scale=spec["guidance"], fps=spec["fps"], generator=torch.Generator().manual_seed(7),
                   output_type="latent", enable_safety_check=False)
    s = Cosmos3Settings(num_steps=spec["steps"], guidance=spec["guidance"], chunk_size=spec["chunk"], fps=spec["fps"],
                        resolution_tier=256, view_point=spec["view"], domain=spec["domain"],
                        negative_prompt=spec["negative"])
    pol = Cosmos3Adapter.from_files(tmp_path / "pipeline", settings=s)
    x = pol.prepare({"image": image}, TASK)
    trace = {}
    ours = pol.sample_actions(x, pol.make_noise(x, torch.Generator().manual_seed(7)), trace)
    theirs = out.action[0]
    assert ours[0].shape == theirs.shape
    assert theirs.abs().max().item() > 1e-2
    assert (ours[0] - theirs).abs().max().item() <= TOL
    assert (trace["final_vision_latents"] - out.video).abs().max().item() <= TOL


def test_byte_tokenizer_loads_in_transformers(tmp_path):
    """The stand-in tokenizer random checkpoints carry tokenizes as our reader does (transformers' tokenizers)."""
    from transformers import AutoTokenizer

    from phyai_ros.models.cosmos3.checkpoint import write_byte_tokenizer
    from phyai_ros.models.cosmos3.prompt import ChatTokenizer
    folder = write_byte_tokenizer(tmp_path / "tok")
    ref, ours = AutoTokenizer.from_pretrained(folder), ChatTokenizer(folder)
    text = 'Ünïcödé "quotes", tabs\tand 12345 numbers \u4e2d\u6587 <|im_end|>'
    assert ours.bpe.encode(text) == ref(text, add_special_tokens=False)["input_ids"]
