"""Operator dispatch: the selector's choice rules, and the Triton adapters of each op family (layers/norms.py,
activations.py, linears.py, attention.py) against the torch candidates.

The Triton candidates run here through Triton's interpreter on CPU tensors (the selector itself only offers
them on CUDA); on the device the same comparisons run in bf16 at real shapes (test_kernels_gpu, profile_ops).
"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from phyai_ros.kernels import common
from phyai_ros.layers import activations, attention, dispatch, linears, norms, ops
from phyai_ros.layers.selector import Candidate, OperatorSelector
from phyai_ros.models.pi.modeling.config import SiglipConfig
from phyai_ros.models.pi.modeling.siglip import SiglipEncoder

# test/conftest.py switches Triton's interpreter on where there is no GPU.
needs_interpreter = pytest.mark.skipif(not (common.HAVE_TRITON and common.interpret_mode()),
                                       reason="Triton interpreter check for CPU-only machines")


def test_selector_prefers_profile_then_order_and_falls_back_on_failure():
    sel = OperatorSelector()
    calls = []

    def broken(x):
        calls.append("fast")
        raise RuntimeError("no kernel for this platform")

    sel.register("op", Candidate("fast", broken))
    sel.register("op", Candidate("slow", lambda x: x + 1))
    sel.register("op", Candidate("torch", lambda x: x + 2))
    cpu = torch.device("cpu")
    # No profile: first usable in order ("fast"), which fails once, is disabled for that key, and the call
    # falls back to the next usable candidate.
    assert sel.call("op", "k", cpu, 1) == 2
    assert sel.call("op", "k", cpu, 1) == 2 and calls == ["fast"]
    assert ("op", "k", "fast") in sel.disabled
    # Another key is unaffected by the failure.
    sel2 = OperatorSelector(candidates=sel.candidates)
    sel2.profile = {"cpu": {"op": {"k": "torch"}}}
    assert sel2.call("op", "k", cpu, 1) == 3
    assert sel2.call("op", "other", cpu, 1) == 2  # not in the profile: order, "fast" failing -> "slow"
    sel3 = OperatorSelector(candidates=sel.candidates, forced="torch")
    assert sel3.call("op", "k", cpu, 1) == 3


def test_device_restricted_candidates_are_not_offered_on_cpu():
    sel = OperatorSelector()
    sel.register("op", Candidate("gpu_only", lambda x: -1, devices=("cuda",)))
    sel.register("op", Candidate("torch", lambda x: x))
    assert sel.choose("op", "k", torch.device("cpu")).name == "torch"
    with pytest.raises(RuntimeError, match="no usable candidate"):
        OperatorSelector(candidates={"op": [Candidate("g", lambda: 0, devices=("cuda",))]}).choose(
            "op", "k", torch.device("cpu"))


def test_profiled_only_candidates_run_only_where_a_profile_names_them():
    """A candidate measured slower on some device (the fused RoPE attention on the H200) is never the default,
    but a profile made on a device where it wins still selects it."""
    sel = OperatorSelector()
    sel.register("op", Candidate("fused", lambda x: x + 1, profiled_only=True))
    sel.register("op", Candidate("unfused", lambda x: x + 2))
    cpu = torch.device("cpu")
    assert sel.call("op", "k", cpu, 1) == 3
    sel.profile = {"cpu": {"op": {"k": "fused"}}}
    assert sel.call("op", "k", cpu, 1) == 2 and sel.call("op", "other", cpu, 1) == 3
    # the pi family's skinny tilings stay defaults; GR00T's bias-epilogue ones (the same tilings) are profiled-only
    linear = dispatch.SELECTOR.candidates["linear"]
    assert [c.name for c in linear if c.profiled_only] == ["triton_depth"] + list(linears.SKINNY_TILINGS)
    assert not any(c.profiled_only for c in linear if c.supports is linears._skinny_without_bias)
    assert dispatch.SELECTOR.candidates["rope_attention_with_prefix"][-1].name == "unfused"


def test_recording_keeps_each_op_and_shape_once():
    sel = OperatorSelector()
    sel.register("op", Candidate("torch", lambda x: x))
    sel.recording = {}
    for _ in range(3):
        sel.call("op", "k1", torch.device("cpu"), torch.ones(1))
    sel.call("op", "k2", torch.device("cpu"), torch.ones(2))
    assert list(sel.recording) == [("op", "k1"), ("op", "k2")]


@needs_interpreter
def test_triton_adapters_match_torch_candidates_on_model_layouts():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    b, t, w, eps = 2, 5, 64, 1e-6
    h, y = r(b, t, w), r(b, t, w)
    mod = r(1, 3, 3, 1, w)  # [1, norms, (scale, shift, gate), 1, W] as the pi0.5 expert slices it
    got = norms._triton_gated_ada(h, y, mod[:, 0, 2], mod[:, 1, 0], mod[:, 1, 1], eps)
    want = norms._torch_gated_ada(h, y, mod[:, 0, 2], mod[:, 1, 0], mod[:, 1, 1], eps)
    for a, e in zip(got, want):
        assert (a - e).abs().max().item() < 1e-5
    a = norms._triton_ada(h, mod[:, 2, 0], mod[:, 2, 1], eps)
    assert (a - ops.ada_rms_norm(h, mod[:, 2, 0], mod[:, 2, 1], eps)).abs().max().item() < 1e-5
    wt = r(w)
    got = norms._triton_add_rms(h, y, wt, eps)
    want = norms._torch_add_rms_norm(h, y, wt, eps)
    assert all((a - e).abs().max().item() < 1e-5 for a, e in zip(got, want))
    gu = r(b, t, 2 * 48)
    assert (_candidate("geglu", "triton").fn(gu) - activations._torch_geglu(gu)).abs().max().item() < 1e-5
    q, kp, vp, ks, vs = r(b, 8, 6, 16), r(b, 1, 20, 16), r(b, 1, 20, 16), r(b, 1, 6, 16), r(b, 1, 6, 16)
    valid = torch.ones(b, 6, 26, dtype=torch.bool)
    valid[1, :, 12:20] = False
    mask = ops.bool_to_additive_mask(valid)
    got = attention._triton_attention_with_prefix(q, kp, vp, ks, vs, mask)
    want = attention._torch_attention_with_prefix(q, kp, vp, ks, vs, mask)
    assert (got - want).abs().max().item() < 1e-5
    # the expert's attention straight from its QKV projection, RoPE in the kernel vs qkv_rope + attention
    qkv = r(b, 6, (8 + 2) * 32)
    kp, vp = r(b, 1, 20, 32), r(b, 1, 20, 32)
    pos = torch.arange(6)[None] + torch.tensor([[12], [20]])
    cos, sin = ops.rope_cos_sin(pos, 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32)), torch.float32)
    got = attention._triton_rope_attention(qkv, cos, sin, kp, vp, mask)
    want = attention._unfused_rope_attention(qkv, cos, sin, kp, vp, mask)   # on the CPU: torch sub-ops
    assert got.shape == (b, 8, 6, 32) and (got - want).abs().max().item() < 1e-5
    assert got.transpose(1, 2).is_contiguous()   # written token-major: o_proj reads it as it lies


def _siglip_before_fusion(enc, pixels):
    """SigLIP as computed before the residual + LayerNorm op: bias in the GEMM, the add, a three-kernel LN."""
    cfg = enc.cfg

    def ln(x, w, b):
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), cfg.ln_eps).to(x.dtype)

    h = F.conv2d(pixels, enc.patch_w, enc.patch_b, stride=cfg.patch_size).flatten(2).transpose(1, 2) + enc.pos_emb
    n, t, _ = h.shape
    for lay in enc.layers:
        qkv = F.linear(ln(h, lay.ln1_w, lay.ln1_b), lay.qkv_w, lay.qkv_b).view(n, t, 3, cfg.num_heads, cfg.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, cfg.width)
        h = h + F.linear(a, lay.o_w, lay.o_b)
        m = F.gelu(F.linear(ln(h, lay.ln2_w, lay.ln2_b), lay.fc1_w, lay.fc1_b), approximate="tanh")
        h = h + F.linear(m, lay.fc2_w, lay.fc2_b)
    return ln(h, enc.post_ln_w, enc.post_ln_b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_siglip_torch_candidates_keep_the_unfused_sequence_bitwise(dtype):
    """On CPU the fused residual + LN op runs its torch candidate, which must not move a bit (the parity
    tests compare SigLIP with LeRobot)."""
    g = torch.Generator().manual_seed(3)
    enc = SiglipEncoder(SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=96, patch_size=14, image_size=42),
                        dtype)
    for buf in enc.buffers():
        buf.copy_(torch.randn(buf.shape, generator=g) * 0.3 + (1.0 if buf.dim() == 1 else 0.0))
    pixels = (torch.rand(2, 3, 42, 42, generator=g) * 2 - 1).to(dtype)
    assert torch.equal(enc(pixels), _siglip_before_fusion(enc, pixels))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_siglip_head_merge_is_a_view(device):
    """SDPA lays its [N, heads, T, hd] output out token-major, so SigLIP's transpose(1, 2).reshape before the
    o-proj copies nothing (checked at the real 3 cameras x 256 tokens, 16 heads x 72; bf16 on the GPU)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n, t, nh, hd = 3, 256, 16, 72
    qkv = torch.randn(n, t, 3 * nh * hd, device=device, dtype=dtype).view(n, t, 3, nh, hd)
    out = ops.attention_unmasked(*(qkv[:, :, i].transpose(1, 2) for i in range(3)))
    assert out.transpose(1, 2).is_contiguous()


@needs_interpreter
@pytest.mark.parametrize("k", [64, 100])
def test_triton_layer_norm_adapters_match_torch_candidates(k):
    g = torch.Generator().manual_seed(k)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    h, x, w, bias, ln_w, ln_b = r(2, 5, 100) * 3, r(2, 5, k), r(100, k) / k ** 0.5, r(100), r(100), r(100)
    got = linears._triton_linear_add_layer_norm(h, x, w, bias, ln_w, ln_b, 1e-6)
    want = linears._torch_linear_add_layer_norm(h, x, w, bias, ln_w, ln_b, 1e-6)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norms._triton_layer_norm(h, ln_w, ln_b, 1e-6),
                               ops.layer_norm(h, ln_w, ln_b, 1e-6), rtol=1e-5, atol=1e-5)


@needs_interpreter
def test_siglip_runs_the_fused_layer_norms():
    """SigLIP through the Triton LayerNorm candidates (offered on CPU here) matches its torch path, and no call
    falls back (e.g. for a residual stream whose rows are not contiguous)."""
    g = torch.Generator().manual_seed(4)
    enc = SiglipEncoder(SiglipConfig(width=72, depth=2, num_heads=4, mlp_dim=100, patch_size=14, image_size=42))
    for buf in enc.buffers():
        buf.copy_(torch.randn(buf.shape, generator=g) * 0.3 + (1.0 if buf.dim() == 1 else 0.0))
    pixels = torch.rand(2, 3, 42, 42, generator=g) * 2 - 1
    want = enc(pixels)
    fused = ("layer_norm", "linear_add_layer_norm")
    sel = OperatorSelector(candidates={op: [dataclasses.replace(c, devices=("cpu",)) if op in fused else c
                                            for c in cands] for op, cands in dispatch.SELECTOR.candidates.items()})
    sel.recording = {}
    with sel.active():
        torch.testing.assert_close(enc(pixels), want, rtol=1e-5, atol=1e-5)
    assert not sel.disabled
    assert {sel.choose(op, key, pixels.device, args).name
            for (op, key), (args, _) in sel.recording.items() if op in fused} == {"triton"}


@needs_interpreter
def test_fused_qkv_rope_matches_split_and_rotate():
    g = torch.Generator().manual_seed(1)
    b, t, hq, hkv, d = 2, 7, 4, 1, 16
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, generator=g)
    pos = torch.arange(t)[None].expand(b, t) + torch.tensor([[0], [3]])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = ops.rope_cos_sin(pos, inv, torch.float32)
    got = attention._triton_qkv_rope(qkv, cos, sin, hq, hkv, d)
    want = attention._torch_qkv_rope(qkv, cos, sin, hq, hkv, d)
    for a, e in zip(got, want):
        assert a.shape == e.shape and (a - e).abs().max().item() < 1e-5


@needs_interpreter
@pytest.mark.parametrize("rows, k, n, splits", [(5, 96, 40, 1), (50, 256, 72, 3), (64, 384, 16, None)])
def test_skinny_linear_matches_torch(rows, k, n, splits):
    from phyai_ros.kernels.skinny_linear import linear_ref, skinny_linear
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(1, rows, k, generator=g), torch.randn(n, k, generator=g)
    got = skinny_linear(x, w, block_n=16, block_k=32, splits=splits)
    assert got.shape == (1, rows, n)
    assert (got - linear_ref(x, w)).abs().max().item() < 1e-4


def test_skinny_candidate_declines_shapes_it_cannot_take():
    w = torch.zeros(8, 4)
    assert linears._skinny_shape(torch.zeros(50, 4), w)
    assert not linears._skinny_shape(torch.zeros(65, 4), w)
    assert linears._skinny_shape(torch.zeros(50, 4), w, torch.zeros(8))          # a [N] bias: the epilogue adds it
    assert not linears._skinny_shape(torch.zeros(50, 4), w, torch.zeros(4))
    assert not linears._skinny_shape(torch.zeros(50, 4, dtype=torch.float64), w)
    # the pi family's bias-free tilings never take a bias; GR00T's bias candidate takes only a bias
    assert not linears._skinny_without_bias(torch.zeros(50, 4), w, torch.zeros(8))
    assert not linears._skinny_with_bias(torch.zeros(50, 4), w)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k, n", [(50, 1024, 2560), (50, 2048, 1024), (50, 1024, 8192), (50, 4096, 1024),
                                        (64, 1152, 4304)])
def test_skinny_linear_bf16_on_the_device(rows, k, n):
    """bf16 operands, fp32 accumulation: within bf16 output rounding of the fp32 product of the same operands."""
    from phyai_ros.kernels.skinny_linear import skinny_linear
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(1, rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    out = torch.full((1, rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.copy_(skinny_linear(x, w))
    ref = x.float() @ w.float().T
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 4e-3


@pytest.mark.gpu
@pytest.mark.parametrize("t", [50, 968])
def test_fused_qkv_rope_bf16_on_the_device(t):
    g = torch.Generator(device="cuda").manual_seed(t)
    hq, hkv, d = 8, 1, 256
    qkv = torch.randn(1, t, (hq + 2 * hkv) * d, device="cuda", generator=g).bfloat16()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    cos, sin = ops.rope_cos_sin(torch.arange(t, device="cuda")[None] + 700, inv, torch.bfloat16)
    got = attention._triton_qkv_rope(qkv, cos, sin, hq, hkv, d)
    want = attention._torch_qkv_rope(qkv.float(), cos.float(), sin.float(), hq, hkv, d)
    for a, e in zip(got, want):
        assert ((a.float() - e).norm() / e.norm()).item() < 8e-3


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1152, 4304])
def test_linear_add_layer_norm_bf16_on_the_device(k):
    """SigLIP's o-proj (k=1152) and fc2 (k=4304) at 3 x 256 tokens: the fused candidate (GEMM without bias,
    bias + residual + LN in one kernel) is as close to fp32 as the eager bf16 sequence."""
    g = torch.Generator(device="cuda").manual_seed(k)
    r = lambda *s, sc=1.0: torch.randn(*s, device="cuda", generator=g) * sc  # noqa: E731
    h, x = r(3, 256, 1152, sc=4.0).bfloat16(), r(3, 256, k).bfloat16()
    w, bias, ln_w, ln_b = r(1152, k, sc=k ** -0.5).bfloat16(), r(1152).bfloat16(), r(1152), r(1152)
    got = linears._triton_linear_add_layer_norm(h, x, w, bias, ln_w, ln_b, 1e-6)
    eager = linears._torch_linear_add_layer_norm(h, x, w, bias, ln_w, ln_b, 1e-6)
    ref = linears._torch_linear_add_layer_norm(h.float(), x.float(), w.float(), bias.float(), ln_w, ln_b, 1e-6)
    for a, e, f in zip(got, eager, ref):
        assert a.dtype == torch.bfloat16 and torch.isfinite(a).all()
        rel = lambda u: ((u.float() - f).norm() / f.norm()).item()  # noqa: E731
        assert rel(a) < 8e-3 and rel(a) <= 1.5 * rel(e) + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k,n", [(3 * 256, 1152, 4304), (256, 1024, 4096), (93, 2048, 8192)])
def test_cublaslt_gelu_epilogue_is_the_tanh_gelu_on_the_device(rows, k, n):
    """The library GEMM with its GELU epilogue (SigLIP's fc1, Qwen3-VL's vision fc1, GR00T's VL MLP):
    in bf16 as close to fp32 GELU-tanh as the eager GEMM + GELU; and its GELU is the tanh form, not the exact one
    that torch's CPU path of the same call applies (told apart in fp32, where bf16's rounding does not hide the
    ~5e-4 between them)."""
    g = torch.Generator(device="cuda").manual_seed(n)
    r = lambda *s, sc=1.0: torch.randn(*s, device="cuda", generator=g) * sc  # noqa: E731
    x, w, b = r(rows, k), r(n, k, sc=2 * k ** -0.5), r(n)
    cand = {c.name: c for c in dispatch.SELECTOR.candidates["linear_gelu_tanh"]}["cublaslt"]
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    assert cand.supports(xb, wb, bb) and not cand.supports(xb, wb, None) and not cand.supports(x, w, b)
    assert not cand.supports(xb[:41], wb, bb)            # few rows: the skinny kernels' (PDL-chained in the DiT)
    got = cand.fn(xb, wb, bb)
    eager = linears._torch_linear_gelu_tanh(xb, wb, bb)
    pre = torch.nn.functional.linear(xb.float(), wb.float(), bb.float())
    tanh = torch.nn.functional.gelu(pre, approximate="tanh")
    rel = lambda u, f: ((u.float() - f).norm() / f.norm()).item()  # noqa: E731
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert rel(got, tanh) <= 1.5 * rel(eager, tanh) + 1e-3
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        got32 = cand.fn(x, w, b)
        pre32 = torch.nn.functional.linear(x, w, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    tanh32, exact32 = (torch.nn.functional.gelu(pre32, approximate=a) for a in ("tanh", "none"))
    near = (tanh32 - exact32).abs() > 1e-4                       # where the two forms differ
    assert near.sum() > 100
    assert (got32 - tanh32)[near].abs().max() < 0.25 * (got32 - exact32)[near].abs().mean()


# ----------------------------------------------------------------------------- GEMMs with fused epilogues
def _epilogue_case(dtype, per_token=False, seed=0):
    """pi0.5-expert-like operands at toy width: x [2, 5, 48] -> [2, 5, 32], modulation sliced as the model
    does ([1, norms, 3, 1, W], or per token [2, norms, 3, 5, W])."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    mod = torch.randn(*((2, 2, 3, 5, 32) if per_token else (1, 2, 3, 1, 32)), generator=g)
    return dict(x=r(2, 5, 48), w=r(32, 48) * 0.2, gate_up_w=r(64, 48) * 0.2, h=r(2, 5, 32), norm_w=r(32),
                gate=mod[:, 0, 2], scale=mod[:, 1, 0], shift=mod[:, 1, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_token", [False, True])
def test_fused_ops_on_cpu_equal_the_old_op_sequence_bitwise(dtype, per_token):
    c = _epilogue_case(dtype, per_token)
    cpu, eps = torch.device("cpu"), 1e-6
    assert torch.equal(dispatch.linear_geglu(c["x"], c["gate_up_w"]),
                       dispatch.geglu(dispatch.linear(c["x"], c["gate_up_w"])))
    got = dispatch.linear_add_rms_norm(c["x"], c["w"], c["h"], c["norm_w"], eps)
    want = dispatch.add_rms_norm(dispatch.linear(c["x"], c["w"]), c["h"], c["norm_w"], eps)
    assert all(torch.equal(a, e) for a, e in zip(got, want))
    got = dispatch.linear_gated_ada_rms_norm(c["x"], c["w"], c["h"], c["gate"], c["scale"], c["shift"], eps)
    want = dispatch.gated_ada_rms_norm(c["h"], dispatch.linear(c["x"], c["w"]), c["gate"], c["scale"], c["shift"],
                                       eps)
    assert all(torch.equal(a, e) for a, e in zip(got, want))
    for op in ("linear_geglu", "linear_add_rms_norm", "linear_gated_ada_rms_norm"):
        assert dispatch.SELECTOR.choose(op, "k", cpu).name == "unfused"


def test_forcing_torch_runs_fused_ops_unfused_and_reference_errors_propagate():
    sel = OperatorSelector()
    sel.register("op", Candidate("fused", lambda x: -1))
    sel.register("op", Candidate("unfused", lambda x: x))
    assert sel.choose("op", "k", torch.device("cpu")).name == "fused"
    sel.forced = "torch"
    assert sel.choose("op", "k", torch.device("cpu")).name == "unfused"

    def broken(x):
        raise KeyError("a real bug")

    sel2 = OperatorSelector()
    sel2.register("op", Candidate("unfused", broken))
    with pytest.raises(KeyError, match="a real bug"):
        sel2.call("op", "k", torch.device("cpu"), 1)


def test_fused_candidates_decline_what_the_kernels_cannot_take():
    c = _epilogue_case(torch.float32)
    x, w, h = c["x"], c["w"], c["h"]
    assert linears._skinny_residual(x, w, h)
    assert not linears._skinny_residual(torch.zeros(1, 65, 48), w, torch.zeros(1, 65, 32))   # the prefix
    assert not linears._skinny_residual(x, w, h.bfloat16())
    assert not linears._skinny_residual(x, w, h[:, :4])
    mod = (c["gate"], c["scale"], c["shift"])
    assert linears._skinny_per_item(x, w, h, *mod, 1e-6)
    tok = _epilogue_case(torch.float32, per_token=True)
    assert not linears._skinny_per_item(x, w, h, tok["gate"], tok["scale"], tok["shift"], 1e-6)


@needs_interpreter
def test_fused_triton_candidates_match_unfused_on_model_layouts():
    c = _epilogue_case(torch.float32, seed=3)
    eps = 1e-6
    got = linears._triton_linear_geglu(c["x"], c["gate_up_w"])
    assert (got - linears._unfused_linear_geglu(c["x"], c["gate_up_w"])).abs().max().item() < 1e-5
    args = (c["x"], c["w"], c["h"], c["norm_w"], eps)
    for a, e in zip(linears._triton_linear_add_rms(*args), linears._unfused_linear_add_rms(*args)):
        assert a.shape == e.shape and (a - e).abs().max().item() < 1e-5
    args = (c["x"], c["w"], c["h"], c["gate"], c["scale"], c["shift"], eps)
    for a, e in zip(linears._triton_linear_gated_ada(*args), linears._unfused_linear_gated_ada(*args)):
        assert a.shape == e.shape and (a - e).abs().max().item() < 1e-5


@pytest.mark.gpu
def test_fused_ops_are_chosen_for_expert_rows_only():
    cuda = torch.device("cuda")
    bf = torch.bfloat16
    x, w, h = (torch.zeros(*s, device=cuda, dtype=bf) for s in ((1, 50, 4096), (1024, 4096), (1, 50, 1024)))
    mod = torch.zeros(1, 1, 1024, device=cuda)
    assert dispatch.SELECTOR.choose("linear_gated_ada_rms_norm", "k", cuda, (x, w, h, mod, mod, mod, 1e-6)
                                    ).name == "triton_depth"
    xp, hp = torch.zeros(1, 968, 4096, device=cuda, dtype=bf), torch.zeros(1, 968, 1024, device=cuda, dtype=bf)
    assert dispatch.SELECTOR.choose("linear_add_rms_norm", "k", cuda, (xp, w, hp, mod[0, 0], 1e-6)).name == "unfused"


# ----------------------------------------------------------------------------- every profiled tiling is correct
@pytest.mark.gpu
@pytest.mark.parametrize("name", [*attention.PREFIX_ATTENTION_TILINGS, "triton_short"])
def test_every_prefix_attention_tiling_matches_fp32(name):
    """The prefix pass's self-attention (816 tokens, 8 heads on one KV head, padded prompt) and GR00T's DiT
    cross-attention in bf16, each launch shape the profile may pick, on the rows that attend somewhere (padding
    rows are 0 here, not read)."""
    g = torch.Generator(device="cuda").manual_seed(2)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v = r(1, 8, 816, 256), r(1, 1, 816, 256), r(1, 1, 816, 256)
    pad = torch.ones(1, 816, dtype=torch.bool, device="cuda")
    pad[:, 800:] = False
    mask = ops.bool_to_additive_mask(pad[:, :, None] & pad[:, None, :])
    fn = next(c for c in dispatch.SELECTOR.candidates["attention"] if c.name == name).fn
    got = fn(q, k, v, mask)
    want = ops.attention(q.float(), k.float(), v.float(), mask)
    rows = pad[:, None, :, None]
    assert ((got.float() - want) * rows).norm() / (want * rows).norm() < 8e-3
    # GR00T's DiT cross-attention: 32 heads of 48, 41 action rows against 103 VL keys, the padded ones masked
    q, k, v = r(1, 32, 41, 48), r(1, 32, 103, 48), r(1, 32, 103, 48)
    keys = ops.bool_to_additive_mask(torch.arange(103, device="cuda")[None, None] < 97)  # [1, 1, 1, 103]
    got = fn(q, k, v, keys)
    want = ops.attention(q.float(), k.float(), v.float(), keys)
    assert (got.float() - want).norm() / want.norm() < 8e-3

def _candidate(op, name):
    return next(c for c in dispatch.SELECTOR.candidates[op] if c.name == name)


PI_EXPERT_ROWS = (50, 51)   # the action chunk's tokens (pi0.5), with pi0's state token


def test_the_unprofiled_skinny_tiling_is_within_a_tenth_of_the_h200_profiles_best():
    """depth_tiling (the default where no profile has an entry) against what the shipped H200 profile timed for
    each candidate at the pi expert's GEMM shapes: never more than 10% over the fastest skinny tiling there. Only
    there: the rule is the default of the pi family's bias-free GEMMs alone (GR00T's DiT GEMMs carry a bias and
    run their skinny tilings only where a profile names them), so the profile's other few-row keys (GR00T's 41
    rows, its one-row timestep MLP) are not held to it."""
    import json
    from pathlib import Path
    profile = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "h200.json").read_text())
    timings = profile["timings"]["cuda:sm90:NVIDIA H200"]
    checked = 0
    for op in ("linear", "linear_geglu", "linear_add_rms_norm", "linear_gated_ada_rms_norm"):
        for key, results in timings[op].items():
            us = {name: r["us"] for name, r in results.items()
                  if name.startswith("triton") and isinstance(r, dict) and r.get("ok")}
            dims = [[int(d) for d in part.split("x")] for part in key.split("|")[0].split(",")]
            rows, (n, k) = dims[0][0] * dims[0][1], dims[1]
            if rows not in PI_EXPERT_ROWS or not us:
                continue
            pick = linears.depth_tiling(n, k, sms=132)
            assert us[pick] <= 1.10 * min(us.values()), (op, key, pick, us[pick], min(us.values()))
            checked += 1
    assert checked >= 10


def test_the_unprofiled_short_attention_beats_sdpa_at_every_profiled_short_shape():
    """The default where no profile has an entry (``triton_short``, short_attention_tiling's rule): at every
    short attention shape the shipped H200 profile timed (<= 256 keys, head_dim <= 128: GR00T's DiT and
    backbone), faster than SDPA and within 15% of the fastest tiling; the pi prefix's shapes (968 / 816 keys of
    256) are not taken by it."""
    import json
    from pathlib import Path
    profile = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "h200.json").read_text())
    timings = profile["timings"]["cuda:sm90:NVIDIA H200"]["attention"]
    checked = 0
    for key, results in timings.items():
        us = {name: r["us"] for name, r in results.items() if isinstance(r, dict) and r.get("ok")}
        (b, hq, lq, d), (_, hkv, lk, _) = ([int(x) for x in part.split("x")] for part in key.split("|")[0].split(","))
        q, k = torch.empty(b, hq, lq, d, device="meta"), torch.empty(b, hkv, lk, d, device="meta")
        short = attention._short_attention(q, k, k)
        assert short == (lk <= 256 and d <= 128), key
        if not short:
            continue
        pick = us[attention.short_attention_tiling(b * hkv, hq // hkv * lq, sms=132)]
        assert pick < us["sdpa"] and pick <= 1.15 * min(us.values()), (key, pick, us)
        checked += 1
    assert checked >= 8


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*linears.SKINNY_TILINGS, "triton_depth"])
def test_every_skinny_tiling_matches_fp32_at_the_expert_shapes(name):
    """The profile may pick any tiling on some device: each one, at the action expert's bf16 shapes, is as
    close to the fp32 result as one bf16 rounding allows (plain GEMMs, GeGLU and both norm epilogues)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, sc=1.0: torch.randn(*s, device="cuda", generator=g) * sc  # noqa: E731
    rel = lambda a, e: ((a.float() - e).norm() / e.norm()).item()  # noqa: E731
    bf = torch.bfloat16
    for k, n in ((1024, 2560), (1024, 8192), (2048, 1024), (4096, 1024)):
        x, w = r(1, 50, k).to(bf), r(n, k, sc=k ** -0.5).to(bf)
        assert rel(_candidate("linear", name).fn(x, w), x.float() @ w.float().T) < 4e-3, (k, n)
    x, w = r(1, 50, 1024).to(bf), r(8192, 1024, sc=1024 ** -0.5).to(bf)
    ref = activations._torch_geglu(x.float() @ w.float().T)
    assert rel(_candidate("linear_geglu", name).fn(x, w), ref) < 8e-3
    for k in (2048, 4096):
        x, w = r(1, 50, k).to(bf), r(1024, k, sc=k ** -0.5).to(bf)
        h, norm_w = r(1, 50, 1024, sc=4.0).to(bf), r(1024)
        gate, scale, shift = (r(1, 1, 1024, sc=0.5) for _ in range(3))
        y = x.float() @ w.float().T
        normed, res = _candidate("linear_add_rms_norm", name).fn(x, w, h, norm_w, 1e-6)
        want = norms._torch_add_rms_norm(y, h.float(), norm_w, 1e-6)
        assert rel(normed, want[0]) < 8e-3 and rel(res, want[1]) < 4e-3, k
        res, normed = _candidate("linear_gated_ada_rms_norm", name).fn(x, w, h, gate, scale, shift, 1e-6)
        want = norms._torch_gated_ada(h.float(), y, gate, scale, shift, 1e-6)
        assert rel(res, want[0]) < 4e-3 and rel(normed, want[1]) < 8e-3, k


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(attention.ATTENTION_TILINGS))
def test_every_expert_attention_tiling_matches_fp32(name):
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    q, kp, vp, ks, vs = r(1, 8, 50, 256), r(1, 1, 968, 256), r(1, 1, 968, 256), r(1, 1, 50, 256), r(1, 1, 50, 256)
    allowed = torch.ones(1, 50, 1018, dtype=torch.bool, device="cuda")
    allowed[..., 900:968] = False   # padded prompt tokens
    mask = ops.bool_to_additive_mask(allowed)   # the model's mask form (suffix.py)
    got = _candidate("attention_with_prefix", name).fn(q, kp, vp, ks, vs, mask)
    want = attention._torch_attention_with_prefix(q.float(), kp.float(), vp.float(), ks.float(), vs.float(), mask)
    assert ((got.float() - want).norm() / want.norm()).item() < 8e-3
    # the same launch shape with RoPE applied in the kernel, from a QKV projection output
    qkv = r(1, 50, 10 * 256)
    inv = 1.0 / (10000 ** (torch.arange(0, 256, 2, device="cuda").float() / 256))
    cos, sin = ops.rope_cos_sin(torch.arange(900, 950, device="cuda")[None], inv, torch.bfloat16)
    got = _candidate("rope_attention_with_prefix", name).fn(qkv, cos, sin, kp, vp, mask)
    q, k, v = attention._torch_qkv_rope(qkv.float(), cos.float(), sin.float(), 8, 1, 256)
    want = attention._torch_attention_with_prefix(q, kp.float(), vp.float(), k, v, mask)
    assert ((got.float() - want).norm() / want.norm()).item() < 8e-3


def test_a_shape_the_profile_lacks_takes_the_nearest_profiled_length():
    """GR00T's prompt is not padded, so its token count follows the instruction: a length the profile was not
    made at takes the choice profiled at the nearest length (one length differing, within a factor of 2), never
    that of another width, rank or dtype."""
    from phyai_ros.layers.selector import nearest_key
    table = {"1x32x41x48,1x32x93x48|bfloat16": "a", "1x32x41x48,1x32x159x48|bfloat16": "b",
             "1x93x2048,6144x2048|bfloat16": "c", "1x93x2048,6144x2048|float32": "d"}
    assert nearest_key(table, "1x32x41x48,1x32x103x48|bfloat16") == "1x32x41x48,1x32x93x48|bfloat16"
    assert nearest_key(table, "1x32x41x48,1x32x150x48|bfloat16") == "1x32x41x48,1x32x159x48|bfloat16"
    assert nearest_key(table, "1x32x41x48,1x32x400x48|bfloat16") is None        # beyond a factor of 2
    assert nearest_key(table, "1x32x41x64,1x32x93x64|bfloat16") is None         # head width: another kernel shape
    assert nearest_key(table, "1x103x2048,6144x2048|bfloat16") == "1x93x2048,6144x2048|bfloat16"
    assert nearest_key(table, "1x103x2048,4096x2048|bfloat16") is None          # a weight's shape differs too
    assert nearest_key(table, "1x93x2048,4096x2048|bfloat16") is None           # another weight: not a length
    assert nearest_key(table, "1x103x2048|bfloat16") is None and nearest_key(table, "junk|x") is None
    sel = OperatorSelector()
    sel.register("op", Candidate("fast", lambda x: x + 1, profiled_only=True))
    sel.register("op", Candidate("torch", lambda x: x + 2))
    cpu = torch.device("cpu")
    sel.profile = {"cpu": {"op": {"1x93x2048|bfloat16": "fast"}}}
    assert sel.call("op", "1x93x2048|bfloat16", cpu, 1) == 2
    assert sel.call("op", "1x103x2048|bfloat16", cpu, 1) == 2       # nearest profiled length
    assert sel.call("op", "1x300x2048|bfloat16", cpu, 1) == 3       # too far: the default


def test_the_nearest_profiled_length_is_looked_up_once_per_shape(monkeypatch):
    """An eager path calls the selector for every op; a shape the profile lacks is matched against its table
    once, then remembered (and looked up again when the table grows)."""
    from phyai_ros.layers import selector as sel_mod
    calls = []
    real = sel_mod.nearest_key
    monkeypatch.setattr(sel_mod, "nearest_key", lambda table, key: calls.append(key) or real(table, key))
    sel = OperatorSelector()
    sel.register("op", Candidate("fast", lambda x: x + 1, profiled_only=True))
    sel.register("op", Candidate("torch", lambda x: x + 2))
    cpu = torch.device("cpu")
    sel.profile = {"cpu": {"op": {"1x93x2048|bfloat16": "fast"}}}
    for _ in range(5):
        assert sel.call("op", "1x103x2048|bfloat16", cpu, 1) == 2
        assert sel.call("op", "1x999x2048|bfloat16", cpu, 1) == 3
    assert calls == ["1x103x2048|bfloat16", "1x999x2048|bfloat16"]
    sel.profile["cpu"]["op"]["1x800x2048|bfloat16"] = "fast"     # the table grew: looked up again
    assert sel.call("op", "1x999x2048|bfloat16", cpu, 1) == 2
