"""Fused Triton kernels (phyai_ros.kernels) against their fp32 torch references.

Without CUDA the kernels run on CPU tensors through Triton's interpreter
(TRITON_INTERPRET=1, set here before triton is imported); with CUDA the same
small-shape tests run compiled on the GPU.  Real pi0.5 shapes and bf16 live in
test_kernels_gpu.py (``gpu`` marker).
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from phyai_ros.kernels import common  # noqa: E402
from phyai_ros.kernels import ada_rms_norm as ada  # noqa: E402
from phyai_ros.kernels import geglu as gg  # noqa: E402
from phyai_ros.kernels import layer_norm as ln  # noqa: E402
from phyai_ros.kernels import rms_norm as rn  # noqa: E402
from phyai_ros.kernels import skinny_epilogue as se  # noqa: E402
from phyai_ros.kernels import split_kv_attention as ska  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "cpu" if common.interpret_mode() else "cuda"
needs_triton = pytest.mark.skipif(not common.available(), reason="triton not usable here")
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 vs fp32 torch reference
# the interpreter turns 0-d index tensors into ints through a numpy path that warns
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _rand(*shape, scale=1.0, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % (2 ** 31))
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE)


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


# --------------------------------------------------------------------------- packaging
def test_import_without_triton():
    """Modules import on a machine without triton (the kernels, kernels/candidates and the layers, which import
    their kernel modules at the top: kernels/common.py is the one guard); available() says False, the layers offer
    no Triton candidate and the fused ops raise a clear error; the references still work."""
    code = textwrap.dedent("""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("blocked for test")
        sys.meta_path.insert(0, _Block())
        import torch
        from phyai_ros.kernels import rms_norm, ada_rms_norm, geglu, layer_norm, split_kv_attention, skinny_epilogue
        from phyai_ros.kernels.candidates import expert_layer, l2_prefetch, post_norm, projected_attention
        for m in (rms_norm, ada_rms_norm, geglu, layer_norm, split_kv_attention, skinny_epilogue, expert_layer,
                  post_norm):
            assert m.available() is False, m
        from phyai_ros.layers import dispatch, registry
        assert registry.triton_ok() is False
        triton_cands = [c for cands in dispatch.SELECTOR.candidates.values() for c in cands
                        if c.available is registry.triton_ok]
        assert len(triton_cands) > 100 and not any(c.available() for c in triton_cands)
        x = torch.randn(3, 8); w = torch.randn(8)
        torch.testing.assert_close(dispatch.rms_norm(x, w, 1e-6), rms_norm.rms_norm_ref(x, w, 1e-6))
        rms_norm.rms_norm_ref(x, w)
        try:
            rms_norm.rms_norm(x, w)
        except RuntimeError as e:
            assert "triton" in str(e)
        else:
            raise AssertionError("expected RuntimeError")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_kernels_dir_is_not_a_regular_package():
    assert not os.path.exists(os.path.join(REPO, "kernels", "__init__.py"))


# --------------------------------------------------------------------------- rms_norm
@needs_triton
@pytest.mark.parametrize("rows,width", [(7, 64), (33, 96), (64, 256), (9, 144)])
def test_rms_norm(rows, width):
    x, w = _rand(rows, width, scale=3.0), _rand(width)
    out = _nan(rows, width)
    y = rn.rms_norm(x, w, 1e-6, out=out)
    assert y is out
    torch.testing.assert_close(y, rn.rms_norm_ref(x, w, 1e-6), **TOL)


@needs_triton
def test_rms_norm_3d_and_strided_rows():
    base = _rand(2, 5, 160)
    x = base[:, ::2, :96]                   # 3-D view whose rows cannot be flattened without a copy
    w = _rand(96)
    with pytest.raises(ValueError):
        rn.rms_norm(x, w)
    x2 = base.reshape(10, 160)[:, 32:128]   # 2-D row-strided view: accepted as is
    torch.testing.assert_close(rn.rms_norm(x2, w), rn.rms_norm_ref(x2, w), **TOL)
    x3 = _rand(2, 5, 96)
    torch.testing.assert_close(rn.rms_norm(x3, w), rn.rms_norm_ref(x3, w), **TOL)


@needs_triton
@pytest.mark.parametrize("rows,width", [(7, 64), (50, 96), (16, 256)])
def test_add_rms_norm(rows, width):
    x, r, w = _rand(rows, width, scale=2.0), _rand(rows, width, scale=5.0), _rand(width)
    y, new_r = rn.add_rms_norm(x, r, w, 1e-6, out=_nan(rows, width), residual_out=_nan(rows, width))
    y_ref, r_ref = rn.add_rms_norm_ref(x, r, w, 1e-6)
    torch.testing.assert_close(new_r, r_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, **TOL)


@needs_triton
def test_add_rms_norm_with_qwens_plain_weight():
    """weight_offset 0 (Qwen3's RMSNorm: times w, not 1 + w), as GR00T's backbone fuses its residual adds."""
    x, r, w = _rand(9, 128, scale=2.0), _rand(9, 128, scale=5.0), _rand(128)
    y, new_r = rn.add_rms_norm(x, r, w, 1e-6, weight_offset=0.0)
    y_ref, r_ref = rn.add_rms_norm_ref(x, r, w, 1e-6, weight_offset=0.0)
    torch.testing.assert_close(new_r, r_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(y, rn.rms_norm_ref(x + r, w, 1e-6, 0.0), **TOL)
    assert not torch.allclose(y, rn.add_rms_norm_ref(x, r, w, 1e-6)[0], atol=1e-3)   # the offset matters


@needs_triton
def test_add_rms_norm_in_place_residual():
    x, r, w = _rand(12, 96), _rand(12, 96, scale=4.0), _rand(96)
    y_ref, r_ref = rn.add_rms_norm_ref(x, r, w)
    r_buf = r.clone()
    y, new_r = rn.add_rms_norm(x, r_buf, w, residual_out=r_buf)
    assert new_r is r_buf
    torch.testing.assert_close(new_r, r_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, **TOL)


@needs_triton
def test_rms_norm_bf16_rounding_matches_eager():
    """bf16: on the GPU the residual equals the eager bf16 add bit for bit.  Triton
    3.6's interpreter casts fp32->bf16 by truncation (the GPU rounds to nearest
    even), so under the interpreter allow one bf16 ulp.  The norm is within one
    bf16 rounding of the eager bf16 path either way."""
    x, r = _rand(8, 64).bfloat16(), _rand(8, 64, scale=3.0).bfloat16()
    w = _rand(64, scale=0.5).bfloat16()
    y, new_r = rn.add_rms_norm(x, r, w)
    y_ref, r_ref = rn.add_rms_norm_ref(x, r, w)
    assert new_r.dtype == torch.bfloat16
    if common.interpret_mode():
        torch.testing.assert_close(new_r.float(), r_ref.float(), rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(new_r, r_ref)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=1e-2)


@needs_triton
def test_rms_norm_rejects_bad_inputs():
    x = _rand(8, 64)
    with pytest.raises(ValueError):
        rn.rms_norm(x.t().contiguous().t(), _rand(8))          # last dim not contiguous
    with pytest.raises(ValueError):
        rn.rms_norm(x, _rand(32))                               # weight width mismatch
    with pytest.raises(ValueError):
        rn.add_rms_norm(x, _rand(8, 32), _rand(64))             # residual shape mismatch


# --------------------------------------------------------------------------- layer_norm
LN_SHAPES = [(rows, width) for rows in (1, 3, 768) for width in (1152, 100)]  # 100: a masked block of 128


def _ln_inputs(rows, width, dtype=torch.float32):
    """h with a row mean to remove, sublayer output y, its bias, LN weight and bias (fp32, as SigLIP's)."""
    h = (_rand(rows, width, scale=3.0, seed=rows) + 1.5).to(dtype)
    y, bias = _rand(rows, width, seed=rows + 1).to(dtype), _rand(width, seed=2).to(dtype)
    return h, y, bias, _rand(width, seed=3), _rand(width, seed=4)


@needs_triton
@pytest.mark.parametrize("rows,width", LN_SHAPES)
def test_layer_norm(rows, width):
    x, _, _, w, b = _ln_inputs(rows, width)
    torch.testing.assert_close(ln.layer_norm(x, w, b, 1e-6), ln.layer_norm_ref(x, w, b, 1e-6), **TOL)


@needs_triton
@pytest.mark.parametrize("rows,width", LN_SHAPES)
def test_add_layer_norm(rows, width):
    h, y, bias, w, b = _ln_inputs(rows, width)
    h_new, normed = ln.add_layer_norm(h, y, bias, w, b, 1e-6)
    h_ref, n_ref = ln.add_layer_norm_ref(h, y, bias, w, b, 1e-6)
    torch.testing.assert_close(h_new, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(normed, n_ref, **TOL)


@needs_triton
@pytest.mark.parametrize("rows,width", [(3, 1152), (768, 100)])
def test_layer_norms_bf16_within_one_rounding(rows, width):
    """bf16 activations: each output is one rounding of fp32 math on the upcast inputs (the interpreter
    truncates instead of rounding to nearest, still within one ulp)."""
    h, y, bias, w, b = _ln_inputs(rows, width, torch.bfloat16)
    ulp = dict(rtol=2 ** -7, atol=1e-3)
    out = ln.layer_norm(h, w, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ln.layer_norm_ref(h.float(), w, b), **ulp)
    h_new, normed = ln.add_layer_norm(h, y, bias, w, b)
    h32, _ = ln.add_layer_norm_ref(h.float(), y.float(), bias.float(), w, b)
    torch.testing.assert_close(h_new.float(), h32, **ulp)
    torch.testing.assert_close(normed.float(), ln.layer_norm_ref(h_new.float(), w, b), **ulp)


@needs_triton
def test_layer_norm_3d_and_bad_inputs():
    h, y, bias, w, b = _ln_inputs(15, 100)
    h3, y3 = h.view(3, 5, 100), y.view(3, 5, 100)
    torch.testing.assert_close(ln.layer_norm(h3, w, b), ln.layer_norm_ref(h3, w, b), **TOL)
    got = ln.add_layer_norm(h3, y3, bias, w, b)
    assert all(a.shape == (3, 5, 100) for a in got)
    torch.testing.assert_close(got[1], ln.add_layer_norm_ref(h3, y3, bias, w, b)[1], **TOL)
    with pytest.raises(ValueError):
        ln.layer_norm(h, w[:64], b)                             # weight width mismatch
    with pytest.raises(ValueError):
        ln.add_layer_norm(h, y[:, :64], bias, w, b)             # y shape mismatch
    with pytest.raises(ValueError):
        ln.add_layer_norm(h, y, bias[:64], w, b)                # bias width mismatch
    with pytest.raises(ValueError):
        ln.layer_norm(_rand(4, 20000), _rand(20000), _rand(20000))  # wider than one row block


# --------------------------------------------------------------------------- ada_rms_norm
@needs_triton
@pytest.mark.parametrize("B,T,width", [(1, 7, 64), (3, 5, 96), (4, 16, 128), (2, 9, 144)])
def test_ada_rms_norm(B, T, width):
    x = _rand(B * T, width, scale=2.0)
    mod = _rand(B, 3 * width)
    scale, shift, _ = mod.chunk(3, dim=-1)                      # row-strided views, no copy
    y = ada.ada_rms_norm(x, scale, shift, T, 1e-6, out=_nan(B * T, width))
    torch.testing.assert_close(y, ada.ada_rms_norm_ref(x, scale, shift, T, 1e-6), **TOL)
    # tokens_per_item inferred from rows // B; 3-D [B, T, W] input
    y3 = ada.ada_rms_norm(x.view(B, T, width), scale, shift)
    torch.testing.assert_close(y3.view(B * T, width), y, rtol=0, atol=0)


@needs_triton
def test_ada_rms_norm_reference_is_plain_rms_without_modulation():
    x = _rand(10, 64)
    zeros = torch.zeros(2, 64, device=DEVICE)
    torch.testing.assert_close(ada.ada_rms_norm_ref(x, zeros, zeros, 5),
                               rn.rms_norm_ref(x, torch.zeros(64, device=DEVICE)), rtol=0, atol=0)


@needs_triton
@pytest.mark.parametrize("B,T,width", [(1, 7, 64), (3, 5, 96), (2, 25, 256)])
def test_gated_residual_ada_rms_norm(B, T, width):
    res, ysub = _rand(B * T, width, scale=3.0), _rand(B * T, width)
    mod = _rand(B, 3 * width)
    scale, shift, gate = mod.chunk(3, dim=-1)
    new_r, normed = ada.gated_residual_ada_rms_norm(
        res, ysub, gate, scale, shift, T, 1e-6,
        out=_nan(B * T, width), residual_out=_nan(B * T, width))
    r_ref, n_ref = ada.gated_residual_ada_rms_norm_ref(res, ysub, gate, scale, shift, T, 1e-6)
    torch.testing.assert_close(new_r, r_ref, **TOL)
    torch.testing.assert_close(normed, n_ref, **TOL)
    # in place on the residual stream
    buf = res.clone()
    new_r2, normed2 = ada.gated_residual_ada_rms_norm(buf, ysub, gate, scale, shift, T, residual_out=buf)
    assert new_r2 is buf
    torch.testing.assert_close(buf, r_ref, **TOL)
    torch.testing.assert_close(normed2, n_ref, **TOL)


@needs_triton
def test_ada_rms_norm_rejects_bad_inputs():
    x = _rand(10, 64)
    s = _rand(2, 64)
    with pytest.raises(ValueError):
        ada.ada_rms_norm(x, s, s, 4)                            # 2 * 4 != 10 rows
    with pytest.raises(ValueError):
        ada.ada_rms_norm(x, _rand(3, 64), _rand(3, 64))         # 10 rows not divisible by 3
    with pytest.raises(ValueError):
        ada.ada_rms_norm(x, _rand(64, 2).t(), s, 5)             # scale last dim not contiguous


# --------------------------------------------------------------------------- geglu
@needs_triton
@pytest.mark.parametrize("rows,m", [(7, 64), (33, 96), (5, 1100), (16, 256)])
def test_geglu(rows, m):
    gu = _rand(rows, 2 * m, scale=2.5)
    out = gg.geglu(gu, out=_nan(rows, m))
    torch.testing.assert_close(out, gg.geglu_ref(gu), **TOL)


@needs_triton
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
def test_swiglu_strided_and_tails():
    """SwiGLU (Qwen3's MLP in GR00T's backbone) through the same kernel: silu(gate) * up in fp32, row-strided
    input, and the exp-overflow tails of the sigmoid form."""
    base = _rand(9, 300, scale=2.0)
    gu = base[:, 50:250]
    torch.testing.assert_close(gg.swiglu(gu, out=_nan(9, 100)), gg.swiglu_ref(gu), **TOL)
    assert not torch.allclose(gg.swiglu(gu), gg.geglu_ref(gu), atol=1e-3)     # another activation
    tails = torch.tensor([[-100.0, -12.0, -3.0, 0.0, 3.0, 12.0, 100.0, 1e4,
                           1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], device=DEVICE)
    out = gg.swiglu(tails)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, gg.swiglu_ref(tails), **TOL)
    with pytest.raises(ValueError, match="act"):
        gg.geglu(gu, act="relu")


@needs_triton
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
def test_geglu_strided_and_3d_and_tails():
    base = _rand(9, 300, scale=2.0)
    gu = base[:, 50:250]                                        # row-strided [9, 200]
    torch.testing.assert_close(gg.geglu(gu), gg.geglu_ref(gu), **TOL)
    gu3 = _rand(2, 4, 160)
    torch.testing.assert_close(gg.geglu(gu3), gg.geglu_ref(gu3), **TOL)
    # large |gate| (exp overflow in the sigmoid form must give the right limit)
    tails = torch.tensor([[-60.0, -12.0, -3.0, 0.0, 3.0, 12.0, 60.0, 1e4,
                           1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], device=DEVICE)
    out = gg.geglu(tails)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, gg.geglu_ref(tails), **TOL)
    with pytest.raises(ValueError):
        gg.geglu(_rand(4, 33))                                  # odd width


# --------------------------------------------------------------------------- attention
def _attn_inputs(B, Hq, Hkv, Lq, P, S, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    q = r(B, Hq, Lq, D)
    kp, vp = r(B, Hkv, P, D), r(B, Hkv, P, D)
    ks, vs = (r(B, Hkv, S, D), r(B, Hkv, S, D)) if S else (None, None)
    return q, kp, vp, ks, vs


@needs_triton
@pytest.mark.parametrize("cfg", [
    # B, Hq, Hkv, Lq, P, S, D, mask kind, splits
    (2, 4, 1, 5, 37, 6, 32, "bool_key", 3),
    (1, 8, 1, 3, 50, 10, 32, "add_key", 4),
    (2, 4, 2, 4, 20, 7, 16, "none", 2),
    (1, 2, 1, 6, 33, 0, 32, "bool_query", 2),
    (2, 3, 1, 5, 19, 5, 24, "add_sdpa4d", 1),   # D not a power of two, single split
    (2, 4, 1, 5, 30, 6, 32, "bool_bcast_b", 3),  # [1, Lq, Lk] mask broadcast over B
    (2, 4, 1, 5, 30, 6, 32, "add_4d_key", 3),    # [B, 1, 1, Lk] additive
])
def test_split_kv_attention(cfg):
    B, Hq, Hkv, Lq, P, S, D, kind, splits = cfg
    q, kp, vp, ks, vs = _attn_inputs(B, Hq, Hkv, Lq, P, S, D)
    Lk = P + S
    g = torch.Generator().manual_seed(1)
    mask = None
    if kind == "bool_key":
        mask = (torch.rand(B, Lk, generator=g) > 0.3).to(DEVICE)
        mask[:, P:] = True
        mask[0, 16:32] = False                  # a whole 16-key tile / split masked out
    elif kind == "add_key":
        mask = (torch.randn(B, Lk, generator=g) * 2).to(DEVICE)
        mask[:, 5:9] = float("-inf")
    elif kind == "bool_query":
        mask = (torch.rand(B, Lq, Lk, generator=g) > 0.5).to(DEVICE)
        mask[:, :, 0] = True
    elif kind == "add_sdpa4d":
        mask = torch.randn(B, 1, Lq, Lk, generator=g).to(DEVICE)
    elif kind == "bool_bcast_b":
        mask = (torch.rand(1, Lq, Lk, generator=g) > 0.4).to(DEVICE)
        mask[..., P] = True
    elif kind == "add_4d_key":
        mask = torch.randn(B, 1, 1, Lk, generator=g).to(DEVICE)
    out = torch.full((B, Hq, Lq, D), float("nan"), device=DEVICE)
    o = ska.split_kv_attention(q, kp, vp, ks, vs, mask, block_m=16, block_n=16,
                               num_splits=splits, out=out)
    assert o is out
    ref = ska.split_kv_attention_ref(q, kp, vp, ks, vs, mask)
    torch.testing.assert_close(o, ref, **TOL)


@needs_triton
def test_split_kv_attention_matches_sdpa_and_strided_q():
    B, Hq, Lq, P, S, D = 2, 4, 5, 40, 8, 32
    q, kp, vp, ks, vs = _attn_inputs(B, Hq, 1, Lq, P, S, D, seed=3)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)   # [B, Lq, Hq, D] memory layout
    mask = torch.ones(B, P + S, dtype=torch.bool, device=DEVICE)
    mask[1, 30:40] = False
    o = ska.split_kv_attention(q_strided, kp, vp, ks, vs, mask, scale=0.2, block_m=16, block_n=16)
    k = torch.cat([kp, ks], 2).expand(B, Hq, P + S, D)
    v = torch.cat([vp, vs], 2).expand(B, Hq, P + S, D)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=0.2)
    torch.testing.assert_close(o, sdpa, **TOL)


@needs_triton
def test_split_kv_attention_combine_loops_over_split_blocks(monkeypatch):
    """More splits than the combine kernel loads at once (its loop over blocks)."""
    monkeypatch.setattr(ska, "_COMBINE_MAX_ELEMS", 64)          # D=32 -> 2 splits per step
    q, kp, vp, ks, vs = _attn_inputs(1, 2, 1, 4, 70, 9, 32, seed=7)
    mask = torch.ones(1, 79, dtype=torch.bool, device=DEVICE)
    mask[0, 16:48] = False                                        # two whole splits masked
    o = ska.split_kv_attention(q, kp, vp, ks, vs, mask, block_m=16, block_n=16, num_splits=8)
    torch.testing.assert_close(o, ska.split_kv_attention_ref(q, kp, vp, ks, vs, mask), **TOL)


@needs_triton
def test_split_kv_attention_fully_masked_row_is_zero():
    q, kp, vp, ks, vs = _attn_inputs(1, 2, 1, 3, 20, 4, 16, seed=5)
    mask = torch.ones(1, 3, 24, dtype=torch.bool, device=DEVICE)
    mask[0, 1] = False                                            # query 1 sees nothing
    o = ska.split_kv_attention(q, kp, vp, ks, vs, mask, block_m=16, block_n=16, num_splits=2)
    assert torch.all(o[:, :, 1] == 0)
    torch.testing.assert_close(o, ska.split_kv_attention_ref(q, kp, vp, ks, vs, mask), **TOL)


@needs_triton
@pytest.mark.parametrize("block_m", [16, 32])
def test_one_split_writes_the_output_directly(block_m):
    """Self-attention with every key in one chunk (the prefix pass): the partial kernel normalises and writes
    the output itself; padded keys, a query that sees nothing (0) and a strided output as with the runner."""
    B, Hq, Lq, D = 2, 4, 37, 32
    q, kp, vp, _, _ = _attn_inputs(B, Hq, 1, Lq, Lq, 0, D, seed=9)
    allowed = torch.ones(B, Lq, Lq, dtype=torch.bool)
    allowed[1, :, 30:] = False
    allowed[0, 5] = False
    mask = torch.where(allowed, 0.0, float("-inf"))[:, None].to(DEVICE)
    out = torch.full((B, Lq, Hq, D), float("nan"), device=DEVICE).transpose(1, 2)
    o = ska.split_kv_attention(q, kp, vp, None, None, mask, block_m=block_m, block_n=16, num_splits=1, out=out)
    assert o is out and torch.all(o[0, :, 5] == 0)
    torch.testing.assert_close(o, ska.split_kv_attention_ref(q, kp, vp, None, None, mask), **TOL)


@needs_triton
def test_split_kv_attention_rejects_bad_inputs():
    q, kp, vp, ks, vs = _attn_inputs(1, 3, 2, 3, 8, 2, 16)
    with pytest.raises(ValueError):
        ska.split_kv_attention(q, kp, vp, ks, vs)                # 3 heads, 2 kv heads
    q, kp, vp, ks, vs = _attn_inputs(1, 2, 1, 3, 8, 2, 16)
    with pytest.raises(ValueError):
        ska.split_kv_attention(q, kp, vp, ks, None)              # half a suffix
    with pytest.raises(ValueError):
        ska.split_kv_attention(q, kp, vp, ks, vs, torch.ones(1, 9, dtype=torch.bool, device=DEVICE))


def _rope_attention_case(B=2, Hq=4, Hkv=1, T=6, P=37, D=32, seed=11):
    """A fused QKV output, the suffix's RoPE tables (positions after the prefix) and the expert's mask
    (prefix keys with padding, then pi0's block structure: token 0 sees only the prefix and itself)."""
    from phyai_ros.layers import ops
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    qkv = r(B, T, (Hq + 2 * Hkv) * D)
    kp, vp = r(B, Hkv, P, D), r(B, Hkv, P, D)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    pos = torch.arange(T)[None] + torch.tensor([[P - 5], [P]])[:B]
    cos, sin = (t.to(DEVICE) for t in ops.rope_cos_sin(pos, inv, torch.float32))
    allowed = torch.ones(B, T, P + T, dtype=torch.bool)
    allowed[0, :, P - 5:P] = False
    allowed[:, 0, P + 1:] = False
    return qkv, cos, sin, kp, vp, ops.bool_to_additive_mask(allowed).to(DEVICE)


@needs_triton
@pytest.mark.parametrize("splits", [1, 3])
def test_rope_split_kv_attention_matches_rotate_then_attend(splits):
    """RoPE applied to q and the suffix keys as they are loaded equals qkv_rope followed by attention."""
    qkv, cos, sin, kp, vp, mask = _rope_attention_case()
    o = ska.rope_split_kv_attention(qkv, cos, sin, kp, vp, mask, block_m=16, block_n=16, num_splits=splits)
    torch.testing.assert_close(o, ska.rope_split_kv_attention_ref(qkv, cos, sin, kp, vp, mask), **TOL)
    q, k, v = ska.split_heads(qkv, 4, 1, 32)
    plain = ska.split_kv_attention(q, kp, vp, k, v, mask, block_m=16, block_n=16, num_splits=splits)
    assert (o - plain).abs().max() > 1e-2   # without the rotation the result differs: RoPE was applied


@needs_triton
def test_rope_split_kv_attention_rejects_what_it_cannot_rotate():
    qkv, cos, sin, kp, vp, mask = _rope_attention_case(D=32)
    with pytest.raises(ValueError):
        ska.rope_split_kv_attention(qkv, cos[:, :-1], sin[:, :-1], kp, vp, mask)     # tables for T-1 tokens
    qkv, cos, sin, kp, vp, mask = _rope_attention_case(D=24)
    with pytest.raises(ValueError):
        ska.rope_split_kv_attention(qkv, cos, sin, kp, vp, mask)                      # D not a power of two


# --------------------------------------------------------------------------- skinny GEMM epilogues
TILES = dict(block_n=16, block_k=32)   # small tiles: several n-blocks, a masked tail and K blocks per split
EPILOGUE_CASES = [(rows, splits) for rows in (1, 7, 50) for splits in (1, 3)]


def _gemm(rows, k, n, seed, dtype=torch.float32):
    """x [1, rows, k] and a [n, k] weight scaled so that x @ W^T is O(1)."""
    return _rand(1, rows, k, seed=seed).to(dtype), _rand(n, k, scale=k ** -0.5, seed=seed + 1).to(dtype)


def _modulation(batch, width, seed):
    """(gate, scale, shift) [B, W]: row-strided column chunks of one [B, 3W] tensor, as the model slices it."""
    return _rand(batch, 3 * width, scale=0.5, seed=seed).chunk(3, dim=-1)


@pytest.fixture
def bf16_dot(monkeypatch):
    """Triton 3.6's interpreter multiplies bf16 dot operands as their raw uint16 bits; upcast them first (a
    bf16 MMA on the GPU forms exact products and accumulates in fp32, as this does)."""
    if not common.interpret_mode():
        return
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def upcast_dot(self, a, b, *rest):
        a, b = (self.cast_impl(t, common.tl.float32) if t.dtype == common.tl.bfloat16 else t for t in (a, b))
        return dot(self, a, b, *rest)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", upcast_dot)


@needs_triton
@pytest.mark.parametrize("rows,splits", EPILOGUE_CASES)
def test_linear_geglu(rows, splits):
    x, w = _gemm(rows, 200, 2 * 40, seed=rows)                # K and I are not multiples of the tiles
    out = se.linear_geglu(x, w, splits=splits, **TILES)
    assert out.shape == (1, rows, 40)
    torch.testing.assert_close(out, se.linear_geglu_ref(x, w), **TOL)


@needs_triton
@pytest.mark.parametrize("rows,splits", EPILOGUE_CASES)
def test_linear_add_rms_norm(rows, splits):
    x, w = _gemm(rows, 200, 72, seed=rows)
    res, norm_w = _rand(1, rows, 72, scale=3.0, seed=7), _rand(72, scale=0.5, seed=8)
    normed, new_res = se.linear_add_rms_norm(x, w, res, norm_w, 1e-6, splits=splits, **TILES)
    n_ref, r_ref = se.linear_add_rms_norm_ref(x, w, res, norm_w, 1e-6)
    torch.testing.assert_close(new_res, r_ref, **TOL)
    torch.testing.assert_close(normed, n_ref, **TOL)


@needs_triton
@pytest.mark.parametrize("rows,splits", EPILOGUE_CASES)
def test_linear_gated_ada_rms_norm(rows, splits):
    batch = 2 if rows == 50 else 1                             # 2 items of 25 tokens
    x, w = _gemm(rows, 200, 72, seed=rows)
    res = _rand(1, rows, 72, scale=3.0, seed=7)
    gate, scale, shift = _modulation(batch, 72, seed=9)
    new_res, normed = se.linear_gated_ada_rms_norm(x, w, res, gate, scale, shift, None, 1e-6, splits=splits,
                                                   **TILES)
    r_ref, n_ref = se.linear_gated_ada_rms_norm_ref(x, w, res, gate, scale, shift, None, 1e-6)
    torch.testing.assert_close(new_res, r_ref, **TOL)
    torch.testing.assert_close(normed, n_ref, **TOL)


@needs_triton
@pytest.mark.parametrize("splits", [1, 3])
def test_skinny_epilogues_bf16(bf16_dot, splits):
    """bf16 operands: within a few bf16 roundings of the fp32 reference on the upcast operands (the interpreter
    also truncates where the GPU rounds to nearest)."""
    bf, rows, n = torch.bfloat16, 50, 72
    x, w = _gemm(rows, 200, 2 * n, seed=3, dtype=bf)
    loose = dict(rtol=2 ** -6, atol=2e-2)
    torch.testing.assert_close(se.linear_geglu(x, w, splits=splits, **TILES).float(),
                               se.linear_geglu_ref(x.float(), w.float()), **loose)
    w = w[:n].contiguous()
    res, norm_w = _rand(1, rows, n, scale=3.0, seed=7).to(bf), _rand(n, scale=0.5, seed=8)
    got = se.linear_add_rms_norm(x, w, res, norm_w, 1e-6, splits=splits, **TILES)
    want = se.linear_add_rms_norm_ref(x.float(), w.float(), res.float(), norm_w, 1e-6)
    for a, e in zip(got, want):
        assert a.dtype == bf
        torch.testing.assert_close(a.float(), e, **loose)
    gate, scale, shift = _modulation(2, n, seed=9)
    got = se.linear_gated_ada_rms_norm(x, w, res, gate, scale, shift, 25, 1e-6, splits=splits, **TILES)
    want = se.linear_gated_ada_rms_norm_ref(x.float(), w.float(), res.float(), gate, scale, shift, 25, 1e-6)
    for a, e in zip(got, want):
        assert a.dtype == bf
        torch.testing.assert_close(a.float(), e, **loose)


@needs_triton
def test_skinny_epilogues_reject_bad_inputs():
    x, w = _gemm(7, 64, 32, seed=0)
    res, norm_w = _rand(1, 7, 32), _rand(32)
    with pytest.raises(ValueError):
        se.linear_geglu(x, w[:31])                               # gate | up needs an even row count
    with pytest.raises(ValueError):
        se.linear_geglu(_rand(65, 64), w)                        # more rows than the skinny kernel takes
    with pytest.raises(ValueError):
        se.linear_add_rms_norm(x, w, res[:, :6], norm_w)         # residual rows differ from x's
    with pytest.raises(ValueError):
        se.linear_add_rms_norm(x, w, res, norm_w[:16])           # norm weight width
    gate, scale, shift = _modulation(2, 32, seed=1)
    with pytest.raises(ValueError):
        se.linear_gated_ada_rms_norm(x, w, res, gate, scale, shift)   # 7 rows are not 2 items


def test_programmatic_dependent_launch_only_where_it_exists(monkeypatch):
    """PDL keywords come as a pair (flag + launch_pdl) and only for CUDA devices of sm_90+; never on the CPU
    or under the interpreter, and PHYAI_PDL=0 turns them off."""
    assert common.pdl(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("PHYAI_PDL", "0")
    assert common.pdl(torch.device("cuda", 0)) == {"PDL": False}


# --------------------------------------------------------------------------- GR00T N1.7 (DiT 41 rows x 1536, Qwen3-VL)
from phyai_ros.kernels import rope as rp  # noqa: E402
from phyai_ros.kernels import skinny_linear as sl  # noqa: E402

DIT_ROWS, DIT_W = 41, 1536   # state token + 40 actions; the DiT's width (its MLP is 4x)


@needs_triton
@pytest.mark.parametrize("n,k,act,splits", [(DIT_W, DIT_W, None, None), (3 * DIT_W, DIT_W, None, 1),
                                            (4 * DIT_W, DIT_W, "gelu_tanh", None), (DIT_W, DIT_W, "gelu_tanh", 3)])
def test_skinny_linear_bias_and_gelu_at_dit_shapes(n, k, act, splits):
    """Bias (and GELU-tanh) as the epilogue of the GEMM (one split) or of the split-K sum (several)."""
    x, w = _gemm(DIT_ROWS, k, n, seed=n + k)
    b = _rand(n, scale=0.5, seed=5)
    out = sl.skinny_linear(x, w, b, act, splits=splits)
    assert out.shape == (1, DIT_ROWS, n)
    torch.testing.assert_close(out, sl.linear_ref(x, w, b, act), **TOL)


@needs_triton
@pytest.mark.parametrize("k,splits", [(DIT_W, None), (4 * DIT_W, None), (DIT_W, 1)])
def test_linear_add_layer_norm_at_dit_shapes(k, splits):
    """The DiT's to_out / ff.net.2: h + (x W^T + b), then the LayerNorm (unit affine there; a real one here)."""
    x, w = _gemm(DIT_ROWS, k, DIT_W, seed=k)
    h, b = _rand(1, DIT_ROWS, DIT_W, scale=3.0, seed=7), _rand(DIT_W, scale=0.5, seed=8)
    ln_w, ln_b = _rand(DIT_W, scale=0.5, seed=9) + 1, _rand(DIT_W, scale=0.5, seed=10)
    got = se.linear_add_layer_norm(h, x, w, b, ln_w, ln_b, 1e-5, splits=splits)
    want = se.linear_add_layer_norm_ref(h, x, w, b, ln_w, ln_b, 1e-5)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **TOL)


@needs_triton
def test_skinny_bias_epilogues_reject_bad_inputs():
    x, w = _gemm(7, 64, 32, seed=0)
    with pytest.raises(ValueError, match="bias"):
        sl.skinny_linear(x, w, _rand(31))
    with pytest.raises(ValueError, match="act"):
        sl.skinny_linear(x, w, None, "relu")
    h, v = _rand(1, 7, 32), _rand(32)
    with pytest.raises(ValueError, match="ln_b"):
        se.linear_add_layer_norm(h, x, w, v, v, v[:16])
    with pytest.raises(ValueError, match="residual"):
        se.linear_add_layer_norm(h[:, :6], x, w, v, v, v)


@needs_triton
@pytest.mark.parametrize("rows,width", [(103, 2048), (5, 128)])
def test_qwen_rms_norm_plain_weight(rows, width):
    """weight_offset=0: Qwen's RMSNorm (times w), the LLM's width and its per-head q / k width."""
    x, w = _rand(rows, width, scale=2.0), _rand(width, scale=0.5, seed=3)
    got = rn.rms_norm(x, w, 1e-6, weight_offset=0.0)
    xf = x.double()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).float()
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(rn.rms_norm_ref(x, w, 1e-6, weight_offset=0.0), want, **TOL)
    with pytest.raises(ValueError, match="weight_offset"):
        rn.rms_norm(x, w, 1e-6, weight_offset=0.5)


def _mrope_tables(b, t, d, seed):
    """cos / sin [B, T, d] from three position rows interleaved as Qwen3-VL's mRoPE does."""
    from phyai_ros.models.groot_n17.config import TextConfig
    from phyai_ros.models.groot_n17.qwen3vl import mrope_cos_sin
    cfg = TextConfig(vocab_size=0, width=0, mlp_dim=0, num_heads=16, num_kv_heads=8, head_dim=d, depth=0,
                     rms_eps=1e-6, rope_theta=5e6, mrope_section=(24, 20, 20))   # Cosmos-Reason2-2B's RoPE
    pos = torch.randint(0, 300, (3, b, t), generator=torch.Generator().manual_seed(seed))
    return (x.to(DEVICE) for x in mrope_cos_sin(cfg, pos))


@needs_triton
@pytest.mark.parametrize("b,t", [(1, 7), (2, 5)])
def test_qkv_norm_rope_qwen3_llm(b, t):
    """The LLM's QKV output (16 q, 8 kv heads of 128): per-head RMSNorm (plain weights) then interleaved-mRoPE
    rotation, against the fp32 reference and against normalising and rotating by hand."""
    hq, hkv, d = 16, 8, 128
    qkv = _rand(b, t, (hq + 2 * hkv) * d, scale=2.0, seed=t)
    cos, sin = _mrope_tables(b, t, d, seed=b)
    qn, kn = _rand(d, scale=0.5, seed=1) + 1, _rand(d, scale=0.5, seed=2) + 1
    q, k, v = rp.qkv_rope(qkv, cos, sin, hq, hkv, d, qn, kn, 1e-6)
    rq, rk, rv = rp.qkv_rope_ref(qkv, cos, sin, hq, hkv, d, qn, kn, 1e-6)
    torch.testing.assert_close(q, rq, **TOL)
    torch.testing.assert_close(k, rk, **TOL)
    assert torch.equal(v, rv) and q.shape == (b, hq, t, d) and k.shape == (b, hkv, t, d)
    k0 = qkv[0, 0, hq * d:(hq + 1) * d]                           # kv head 0 of token 0 by hand
    k0 = k0 * torch.rsqrt(k0.pow(2).mean() + 1e-6) * kn
    rot = torch.cat((-k0[d // 2:], k0[:d // 2]))
    torch.testing.assert_close(k[0, 0, 0], k0 * cos[0, 0] + rot * sin[0, 0], **TOL)


@needs_triton
@pytest.mark.parametrize("rows", [1, 4, 64])
@pytest.mark.parametrize("norm", [False, True])
def test_qkv_rope_programs_span_tokens_batches_and_strides(norm, rows):
    """Each program rotates a block of (batch, token, head) rows: blocks that end mid-token and mid-batch, a
    strided qkv (a slice of a wider buffer) and per-batch tables land every head where the reference puts it."""
    b, t, hq, hkv, d = 3, 11, 4, 2, 64                      # 198 rows: 64-row blocks end inside tokens and items
    wide = _rand(b, t, (hq + 2 * hkv) * d + 24, seed=21)
    qkv = wide[..., 8:8 + (hq + 2 * hkv) * d]
    ang = _rand(b, t, d // 2, scale=3.0, seed=22)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    qn, kn = (_rand(d, scale=0.3, seed=s) + 1 for s in (23, 24)) if norm else (None, None)
    q, k, v = rp.qkv_rope(qkv, cos, sin, hq, hkv, d, qn, kn, 1e-6, rows=rows, num_warps=4)
    rq, rk, rv = rp.qkv_rope_ref(qkv, cos, sin, hq, hkv, d, qn, kn, 1e-6)
    torch.testing.assert_close(q, rq, **TOL)
    torch.testing.assert_close(k, rk, **TOL)
    assert torch.equal(v, rv)


def test_rope_plan_blocks_rows_only_where_there_are_many():
    assert rp.rope_plan(450, 128) == (1, 2)                  # pi0.5's expert: a row per program, as measured
    assert rp.rope_plan(968 * 9, 128) == (4, 4)              # its prefix
    assert rp.rope_plan(256 * 32, 32) == (16, 4)             # GR00T's vision tower
    assert rp.rope_plan(103 * 24, 64) == (8, 4)              # Qwen3's LLM


@needs_triton
def test_qkv_rope_qwen3_vision_fp32_tables_bf16():
    """The vision tower: 16 heads of 64, no norm, 2-D RoPE tables in float32 for bf16 activations: one
    rounding of the fp32 rotation."""
    n_img, t, h, d = 2, 16, 16, 64
    qkv = _rand(n_img, t, 3 * h * d, seed=4).to(torch.bfloat16)
    ang = _rand(n_img, t, d // 2, scale=3.0, seed=6)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    q, k, v = rp.qkv_rope(qkv, cos, sin, h, h, d)
    rq, rk, _ = rp.qkv_rope_ref(qkv.float(), cos, sin, h, h, d)
    assert q.dtype == torch.bfloat16
    torch.testing.assert_close(q.float(), rq, rtol=2 ** -8, atol=1e-2)
    torch.testing.assert_close(k.float(), rk, rtol=2 ** -8, atol=1e-2)
    with pytest.raises(ValueError, match="q_norm"):
        rp.qkv_rope(qkv, cos, sin, h, h, d, _rand(d).to(torch.bfloat16), None)


@needs_triton
@pytest.mark.parametrize("n", [DIT_W, 32])
def test_depth_tiling_of_the_dit_candidates(n):
    """The DiT GEMMs' launch where no profile has an entry (depth_tiling, one rule with the pi family's): one K
    split where the N blocks fill half the device, split-K otherwise (here 4 'SMs': N = 1536 and N = 32); both
    agree with fp32 torch."""
    from phyai_ros.layers import linears
    x, w = _gemm(DIT_ROWS, DIT_W, n, seed=n)
    b, h = _rand(n, scale=0.5, seed=2), _rand(1, DIT_ROWS, n, scale=3.0, seed=3)
    torch.testing.assert_close(linears._depth_tiling(linears._triton_linear_gelu_tanh, x, w, b),
                               sl.linear_ref(x, w, b, "gelu_tanh"), **TOL)
    torch.testing.assert_close(linears._depth_tiling(linears._triton_linear, x, w, b), sl.linear_ref(x, w, b), **TOL)
    one, zero = torch.ones(n, device=DEVICE), torch.zeros(n, device=DEVICE)
    got = linears._depth_tiling(linears._triton_skinny_add_layer_norm, h, x, w, b, one, zero, 1e-5)
    for a, e in zip(got, se.linear_add_layer_norm_ref(h, x, w, b, one, zero, 1e-5)):
        torch.testing.assert_close(a, e, **TOL)


@needs_triton
@pytest.mark.parametrize("splits", [None, 1])
def test_dit_attention_through_the_selector_is_token_major(splits):
    """GR00T's DiT attention through the selector's Triton candidate: q / k / v as views of one fused QKV
    projection (head width 48), cross-attention with the additive pad mask; the output is written token-major,
    so the [B, T, H*d] the output projection reads is a view (no copy kernel), and equals the fp32 reference."""
    from phyai_ros.layers import attention, ops
    b, h, t, d, keys = 2, 4, 9, 48, 13
    qkv = _rand(b, t, 3 * h * d, seed=11)
    q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.chunk(3, dim=-1))
    tiling = {} if splits is None else {"num_splits": splits}
    out = attention._triton_attention(q, k, v, None, **tiling)
    assert out.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(out, ops.attention(q, k, v, None), rtol=1e-4, atol=1e-4)
    kv = _rand(b, h, keys, d, seed=12), _rand(b, h, keys, d, seed=13)
    allowed = torch.ones(b, 1, keys, dtype=torch.bool, device=DEVICE)
    allowed[1, :, 9:] = False
    mask = ops.bool_to_additive_mask(allowed, torch.float32)
    out = attention._triton_attention(q, *kv, mask, **tiling)
    assert out.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(out, ops.attention(q, *kv, mask), rtol=1e-4, atol=1e-4)
