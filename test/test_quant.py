"""Quantized execution on the CPU: the kernels under Triton's interpreter against their torch references, the
round-to-nearest quantizer, the ops' routing, the quantized checkpoint folder (write, load, refuse) and the
accuracy of each scheme on the pi0.5 / pi0 parity fixtures against LeRobot's fp32 actions.

The interpreter computes bf16 dot products wrongly (integer arithmetic on the bit patterns), so the kernels are
checked in float32 here and in bf16 on the GPU (test_quant_gpu.py).
"""
import json
import os
import shutil

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from phyai_ros.kernels import common  # noqa: E402
from phyai_ros.kernels import quant_linear as ql  # noqa: E402
from phyai_ros.kernels import skinny_epilogue as se  # noqa: E402
from phyai_ros.layers import dispatch, ops  # noqa: E402
from phyai_ros.layers.quant_dispatch import torch_qlinear  # noqa: E402
from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme, apply_calibration, calibrating  # noqa: E402
from phyai_ros.layers.selector import SELECTOR  # noqa: E402

needs_kernels = pytest.mark.skipif(not (common.available() and common.interpret_mode()),
                                   reason="Triton interpreter not available")
SCHEMES = {"int8": QuantScheme.make("w8a16"), "fp8": QuantScheme.make("w8a16", "fp8"),
           "w8a8": QuantScheme.make("w8a8"), "w8a8_static": QuantScheme.make("w8a8", activations="static"),
           "int4": QuantScheme.make("w4a16", group=64)}


def _weight(n=96, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.02


def _qweight(name, w=None, act_scale=None):
    qw = QuantizedWeight.from_float(_weight() if w is None else w, SCHEMES[name])
    if act_scale is not None:
        qw.act_scale.fill_(act_scale)
    return qw


def _x(rows=50, k=256, seed=1):
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- quantizer
def test_schemes_refuse_what_they_cannot_store():
    with pytest.raises(ValueError, match="scheme must be one of"):
        QuantScheme.make("w2a2")
    with pytest.raises(ValueError, match="w8a8 stores fp8"):
        QuantScheme.make("w8a8", "int8")
    with pytest.raises(ValueError, match="power-of-two group"):
        QuantScheme.make("w4a16", group=48)
    with pytest.raises(ValueError, match="not a multiple of the group"):
        QuantizedWeight(QuantScheme.make("w4a16"), 8, 4304)   # SigLIP's fc2 K with 128-wide groups
    assert QuantScheme.make("w8a8", activations="static").tag == "w8a8-fp8-static"


@pytest.mark.parametrize("name", ["int8", "fp8", "int4"])
def test_round_to_nearest_error_is_within_half_a_step(name):
    w = _weight()
    w[3] = 0.0  # a zero row must not divide by zero
    qw = _qweight(name, w)
    err = (qw.dequantize() - w).abs()
    if name == "int8":
        assert bool((err <= qw.scale[:, None] / 2 + 1e-9).all())
    elif name == "int4":
        step = qw.scale.repeat_interleave(64, dim=1)
        assert bool((err <= step / 2 + 1e-9).all())
        assert qw.q.dtype == torch.uint8 and qw.q.shape == (96, 128)
    else:  # fp8 e4m3: 3 mantissa bits, relative error <= 2^-4 for normal values
        big = w.abs() > 2 ** -6 * qw.scale[:, None]
        assert bool((err[big] <= w.abs()[big] * 2 ** -4 + 1e-9).all())
    assert torch.equal(qw.dequantize()[3], torch.zeros(256))


def test_int4_packing_round_trips():
    q = torch.randint(-8, 8, (16, 256), dtype=torch.int8)
    assert torch.equal(ql.unpack_int4(ql.pack_int4(q, 64), 64), q)
    with pytest.raises(ValueError):
        ql.pack_int4(q, 48)


# ----------------------------------------------------------------------------- kernels (interpreter)
@needs_kernels
@pytest.mark.parametrize("name", ["int8", "fp8", "w8a8", "w8a8_static", "int4"])
@pytest.mark.parametrize("tiling", [{}, {"block_n": 32, "block_k": 64, "splits": 1}, {"block_n": 16, "splits": 3}])
def test_quant_linear_kernel_matches_reference(name, tiling):
    x = _x()
    qw = _qweight(name, act_scale=float(x.abs().max()) / 448 if name == "w8a8_static" else None)
    bias = torch.randn(96)
    ref = ql.quant_linear_ref(x, qw.q, qw.scale, qw.group, qw.act_quant, qw.act_scale, bias)
    y = ql.quant_linear(x, qw.q, qw.scale, qw.group, qw.act_quant, qw.act_scale, bias=bias, **tiling)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=1e-5)
    g = ql.quant_linear(x, qw.q, qw.scale, qw.group, qw.act_quant, qw.act_scale, bias=bias, act="gelu_tanh",
                        **tiling)
    torch.testing.assert_close(g, ops.gelu_tanh(ref), atol=2e-5, rtol=1e-5)


@needs_kernels
def test_activation_quantization_matches_torch_fp8_rounding():
    """Rows spanning fp8's normal and subnormal range: the kernels' rounding is torch's cast, bit for bit."""
    x = torch.cat([_x(8, 512) * 100, _x(8, 512, seed=2) * 1e-3, _x(8, 512, seed=3)]).contiguous()
    x[0, 0] = 0.0
    xq, s = ql.quantize_rows(x)
    ref_q, ref_s = ql.quantize_activations_ref(x)
    assert torch.equal(s, ref_s) and torch.equal(xq.float(), ref_q)
    static = torch.tensor([0.01])
    xq, s = ql.quantize_rows(x, static)
    ref_q, _ = ql.quantize_activations_ref(x, static)
    assert torch.equal(xq.float(), ref_q) and bool((s == 0.01).all())


@needs_kernels
@pytest.mark.parametrize("name", ["int8", "w8a8", "int4"])
def test_fused_epilogues_from_quantized_partials(name):
    """GeGLU and gated residual + adaRMS over the quantized GEMM's partials equal the reference chain."""
    torch.manual_seed(0)
    x = _x(50, 256)
    gate_up = _qweight(name, _weight(192, 256, seed=4))
    part = ql.quant_partials(x, gate_up.q, gate_up.scale, gate_up.group, gate_up.act_quant, block_n=32, splits=2)
    y = se.geglu_from_partials(part, x)
    ref = ql.quant_linear_ref(x, gate_up.q, gate_up.scale, gate_up.group, gate_up.act_quant)
    want = ops.gelu_tanh_mul(ref[:, :96], ref[:, 96:])
    torch.testing.assert_close(y, want, atol=2e-5, rtol=1e-5)
    for splits in (1, 3):   # one split: GeGLU in the GEMM's epilogue; more: in the split sum
        y = ql.quant_linear_geglu(x, gate_up.q, gate_up.scale, gate_up.group, gate_up.act_quant, block_n=32,
                                  splits=splits)
        torch.testing.assert_close(y, want, atol=2e-5, rtol=1e-5)
    o = _qweight(name, _weight(64, 256, seed=5))
    h = torch.randn(1, 50, 64)
    gate, scale, shift = (torch.randn(1, 1, 64) for _ in range(3))
    got = dispatch.linear_gated_ada_rms_norm(x.view(1, 50, 256), o, h, gate, scale, shift, 1e-6)
    y = ql.quant_linear_ref(x, o.q, o.scale, o.group, o.act_quant).view(1, 50, 64)
    r = h + y * gate
    want = (r, ops.ada_rms_norm(r, scale, shift, 1e-6))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    part = ql.quant_partials(x, o.q, o.scale, o.group, o.act_quant)
    normed, new_res = se.norm_from_partials(part, x, h.view(50, 64), None, torch.randn(64), None, 1e-6)
    torch.testing.assert_close(new_res, h.view(50, 64) + y.view(50, 64), atol=2e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- routing
def test_dispatch_routes_quantized_weights_to_their_ops():
    x = _x(3, 256)
    for name in SCHEMES:
        qw = _qweight(name, act_scale=0.01 if name == "w8a8_static" else None)
        y = dispatch.linear(x, qw)
        torch.testing.assert_close(y, torch_qlinear(x, qw), atol=1e-5, rtol=1e-5)
        assert SELECTOR.choose("qlinear", "k", x.device, (x, qw)).name == "torch"   # the CPU's candidate
        # Quantized, but the same linear map up to the rounding of the weights.
        assert (y - x @ _weight().T).abs().max() < 0.15 * (x @ _weight().T).abs().max()
    gu = _qweight("int8", _weight(192, 256))
    torch.testing.assert_close(dispatch.linear_geglu(x, gu),
                               ops.gelu_tanh_mul(*torch_qlinear(x, gu).split(96, dim=-1)), atol=1e-5, rtol=1e-5)


def test_static_scales_come_from_calibration():
    qw = _qweight("w8a8_static")
    x1, x2 = _x(4, 256) * 3, _x(4, 256, seed=9) * 5
    with calibrating() as seen:
        dispatch.linear(x1, qw)
        dispatch.linear(x2, qw)
    assert apply_calibration(seen) == 1
    assert qw.act_scale.item() == pytest.approx(max(x1.abs().max(), x2.abs().max()).item() / 448)
    big = x1 * 1000   # beyond the calibrated range: clamped at +-448 steps, not overflowed to NaN
    assert bool(torch.isfinite(dispatch.linear(big, qw)).all())


# ----------------------------------------------------------------------------- checkpoint folder + accuracy
from phyai_ros.fixtures import fixtures_dir, require_tokenizer  # noqa: E402

FIX = fixtures_dir()
needs_fixtures = pytest.mark.skipif(not (FIX / "pi05" / "checkpoint").is_dir(), reason=f"no fixtures at {FIX}")


def _predict(checkpoint, fx, tasks, policy_cls):
    from phyai_ros.models.files import read_safetensors_file
    inputs = read_safetensors_file(fx / "inputs.safetensors")
    images = {k.split("raw.observation.images.")[1]: v.numpy() for k, v in inputs.items() if "images." in k}
    policy = policy_cls.from_files(checkpoint, require_tokenizer(), fx / "norm_stats.json")
    out = policy.predict_batch(images, inputs["raw.observation.state"].numpy(), tasks, noise=inputs["noise"])
    return policy, out


def _quantize_cli(src, out, *args):
    from phyai_ros.quant.__main__ import main
    return main(["--checkpoint", str(src), "--output", str(out), "--dtype", "float32", *args])


# Measured on these fixtures (2026-12-01, CPU fp32, `scripts/quant_accuracy.py --fixtures`; docs/benchmarks.md):
# max-abs error of the actions relative to the largest |action| of LeRobot's fp32 reference, pi0.5 / pi0:
# w8a16 int8 expert 0.33% / 0.47%, fp8 expert 1.94% / 1.98%, w8a8 dynamic everything 3.61% / 4.17%, w4a16 g32
# expert 5.58% / 11.97%. These models are tiny (widths 64-128) with random weights, where one rounding error
# weighs more than at full size. Bounds ~2x the worse of the two, so run-to-run noise passes and a broken
# kernel or a wrong scale (errors of tens of percent) fails.
BOUNDS = {("w8a16",): 0.01, ("w8a16", "--weight-format", "fp8"): 0.04,
          ("w8a8", "--parts", "vision,prefix,expert"): 0.08, ("w4a16", "--group", "32"): 0.25}


@needs_fixtures
@pytest.mark.parametrize("policy_type", ["pi05", "pi0"])
@pytest.mark.parametrize("scheme", list(BOUNDS))
def test_quantized_checkpoint_loads_and_stays_close_to_lerobot(tmp_path, policy_type, scheme):
    from phyai_ros.models import family
    fx = FIX / policy_type
    tasks = json.loads((fx / "inputs.json").read_text())["tasks"]
    assert _quantize_cli(fx / "checkpoint", tmp_path / "q", "--scheme", *scheme) == 0
    manifest = json.loads((tmp_path / "q" / "quantization.json").read_text())
    assert manifest["policy_type"] == policy_type and manifest["layers"]
    policy, out = _predict(tmp_path / "q", fx, tasks, family(policy_type))
    quantized = [m for m in policy.model.modules() if isinstance(m, QuantizedWeight)]
    assert len(quantized) == len(manifest["layers"]) and all(m.scheme.name == scheme[0] for m in quantized)
    from phyai_ros.models.files import read_safetensors_file
    ref = read_safetensors_file(fx / "expected.safetensors")["actions.unnormalized"]
    rel = ((torch.as_tensor(out).float() - ref).abs().max() / ref.abs().max()).item()
    assert rel <= BOUNDS[scheme], f"{scheme}: max-abs {rel:.4f} of the action scale"
    assert rel > 0, "quantization changed nothing: the weights were not quantized"


@needs_fixtures
def test_quantized_folder_refuses_a_mismatch(tmp_path):
    from phyai_ros.models.files import CheckpointError
    from phyai_ros.models.pi.pi05.checkpoint import load_pi05_checkpoint
    src = FIX / "pi05" / "checkpoint"
    assert _quantize_cli(src, tmp_path / "q", "--scheme", "w8a16") == 0
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "q", bad)
    m = json.loads((bad / "quantization.json").read_text())
    m["layers"] = m["layers"][:-1]         # a quantized weight the manifest does not name
    (bad / "quantization.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="does not match the model its manifest describes"):
        load_pi05_checkpoint(bad)
    m["scheme"]["weight_format"] = "int3"
    (bad / "quantization.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="invalid quantization scheme"):
        load_pi05_checkpoint(bad)
    assert _quantize_cli(src, src, "--scheme", "w8a16") == 2                 # never over the source
    assert _quantize_cli(src, tmp_path / "s", "--scheme", "w8a8", "--activations", "static") == 2  # no calibration


@pytest.mark.parametrize("family_name", ["pi05", "groot_n17"])
def test_an_already_quantized_folder_is_refused(tmp_path, capsys, family_name):
    """The quantizer refuses a quantized folder for every family with one line (exit 2), before any family's
    hook would try to quantize weights that are no longer float."""
    from fixture_sets import groot_fixture_dir
    src = (groot_fixture_dir() if family_name == "groot_n17" else FIX / family_name) / "checkpoint"
    if not src.is_dir():
        pytest.skip(f"no {family_name} fixture at {src}")
    assert _quantize_cli(src, tmp_path / "q", "--scheme", "w8a16") == 0
    capsys.readouterr()
    assert _quantize_cli(tmp_path / "q", tmp_path / "q2", "--scheme", "w8a16") == 2
    err = capsys.readouterr().err
    assert "is already quantized" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "q2").exists()


@needs_fixtures
def test_static_w8a8_is_calibrated_on_observations(tmp_path):
    fx = FIX / "pi05"
    rc = _quantize_cli(fx / "checkpoint", tmp_path / "s", "--scheme", "w8a8", "--activations", "static",
                       "--calibration-inputs", str(fx / "inputs.safetensors"), "--tokenizer", str(require_tokenizer()),
                       "--norm-stats", str(fx / "norm_stats.json"), "--tasks-json", str(fx / "inputs.json"))
    assert rc == 0
    from phyai_ros.models.files import read_safetensors_file
    sd = read_safetensors_file(tmp_path / "s" / "model.safetensors")
    scales = {k: v.item() for k, v in sd.items() if k.endswith(".act_scale")}
    manifest = json.loads((tmp_path / "s" / "quantization.json").read_text())
    assert len(scales) == len(manifest["layers"])
    # The last VLM layer's attention output and MLP never run (only its K/V are used): left at 1.
    assert manifest["calibration"]["layers_calibrated"] == len(scales) - 3
    assert all(0 < s < 1 for k, s in scales.items() if not k.startswith("vlm_layers.1.") or "qkv" in k)


@needs_fixtures
def test_predict_takes_a_quantized_checkpoint(tmp_path):
    """`predict` (the offline command) reads the scheme from the folder's manifest like the node does."""
    import subprocess
    import sys
    fx = FIX / "pi05"
    assert _quantize_cli(fx / "checkpoint", tmp_path / "q", "--scheme", "w8a16", "--weight-format", "fp8") == 0
    out = subprocess.run([sys.executable, "-m", "phyai_ros.predict", "--checkpoint", str(tmp_path / "q"),
                          "--tokenizer", str(require_tokenizer()), "--norm-stats", str(fx / "norm_stats.json"),
                          "--inputs", str(fx / "inputs.safetensors"), "--tasks-json", str(fx / "inputs.json"),
                          "--noise", "noise", "--output", str(tmp_path / "a.safetensors"),
                          "--expected", str(fx / "expected.safetensors"), "--tolerance", "0.2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max-abs actions vs actions.unnormalized" in out.stdout


# GR00T N1.7 (phyai_ros/models/groot_n17/quantization.py), measured on its fixture (CPU fp32, 2026-12-01): max-abs of the
# unnormalized actions relative to the largest |action| of LeRobot's: w8a16 expert 0.50%, w8a8 everything 2.52%,
# w4a16 g32 expert 6.94% (its 48-wide inputs stay float: K not a multiple of 32). Bounds ~2x those.
GROOT_BOUNDS = {("w8a16",): 0.01, ("w8a8", "--parts", "vision,prefix,expert"): 0.05,
                ("w4a16", "--group", "32"): 0.14}


@pytest.mark.parametrize("scheme", list(GROOT_BOUNDS))
def test_groot_quantized_checkpoint_loads_fuses_and_stays_close(tmp_path, scheme):
    from fixture_sets import groot_fixture_dir
    from phyai_ros.models.files import read_safetensors_file
    from phyai_ros.models.groot_n17.adapter import GrootAdapter
    g = groot_fixture_dir()
    if g is None or not (g / "checkpoint").is_dir():
        pytest.skip("no GR00T N1.7 fixture")
    assert _quantize_cli(g / "checkpoint", tmp_path / "q", "--scheme", *scheme) == 0
    manifest = json.loads((tmp_path / "q" / "quantization.json").read_text())
    policy = GrootAdapter.from_files(tmp_path / "q")    # base model / backbone from the manifest, not relative paths
    assert policy.quantization().startswith(f"quantization {scheme[0]}")
    fused = [k for k, w in policy.weights.items() if isinstance(w, QuantizedWeight) and "qkv" in k]
    assert fused, "the adapter fuses quantized q/k/v as it does float ones"
    inp = read_safetensors_file(g / "inputs.safetensors")
    meta = json.loads((g / "inputs.json").read_text())
    images = {k.split("raw.observation.images.")[1]: v.numpy() for k, v in inp.items() if "images." in k}
    state = inp["raw.observation.state"]
    x = policy.prepare(images, state.numpy(), meta["tasks"], inp["embodiment_id"].tolist())
    out = policy.decode(policy.sample_actions(x, inp["noise"]), x)
    ref = read_safetensors_file(g / "expected.safetensors")["actions.unnormalized"]
    rel = ((torch.as_tensor(out).float() - ref).abs().max() / ref.abs().max()).item()
    assert 0 < rel <= GROOT_BOUNDS[scheme], f"{scheme}: max-abs {rel:.4f} of the action scale ({manifest['layers'][:2]})"


def test_groot_refuses_static_scales(tmp_path):
    from fixture_sets import groot_fixture_dir
    g = groot_fixture_dir()
    if g is None or not (g / "checkpoint").is_dir():
        pytest.skip("no GR00T N1.7 fixture")
    assert _quantize_cli(g / "checkpoint", tmp_path / "s", "--scheme", "w8a8", "--activations", "static",
                         "--calibration-inputs", str(g / "inputs.safetensors"), "--tokenizer", "x") == 2
