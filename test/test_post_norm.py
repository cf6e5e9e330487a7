"""A norm applied after the next GEMM's dot (kernels/candidates/post_norm.py) against fp32 references: GR00T's DiT (the
residual GEMM's per-block statistics, their merge into each row's mean and rstd, the normalised GELU
up-projection; dispatch.linear_add_norm_gelu) and the pi expert ((ada)RMSNorm between the output GEMM and the
GeGLU gate_up; dispatch.linear_gated_norm_geglu), each op against its two-op reference. Interpreter on the CPU
(fp32, small shapes); the models' real shapes in bf16 under the ``gpu`` marker."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from phyai_ros.kernels import common  # noqa: E402
from phyai_ros.kernels.candidates import post_norm as pn  # noqa: E402
from phyai_ros.layers import dispatch, ops  # noqa: E402

DEVICE = "cpu" if common.interpret_mode() else "cuda"
needs_triton = pytest.mark.skipif(not common.available(), reason="triton not usable here")
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _rand(*shape, scale=1.0, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + offset).to(DEVICE)


def test_merged_block_statistics_are_the_rows_layer_norm():
    """Chan's merge of equal-width blocks' (mean, squared deviations) gives the row's mean and 1 / std, also for
    a stream whose mean is far larger than its spread (no cancellation from sums of squares)."""
    h = _rand(2, 41, 256, seed=1, offset=300.0).cpu()
    _, stats = pn.residual_with_stats_ref(h, torch.zeros(2, 41, 8), torch.zeros(256, 8), None, 16)
    mean, rstd = pn.merge_stats_ref(stats, 16, 1e-6)
    want = torch.nn.functional.layer_norm(h, (256,), eps=1e-6)
    got = (h - mean.view(2, 41, 1)) * rstd.view(2, 41, 1)
    assert (got - want).abs().max() < 1e-3


@needs_triton
@pytest.mark.parametrize("block_n", [16, 32])
def test_residual_with_stats_matches_its_reference(block_n):
    h, x = _rand(1, 41, 64, seed=2), _rand(1, 41, 96, seed=3)
    w, b = _rand(64, 96, scale=0.1, seed=4), _rand(64, seed=5)
    got_h, got_stats = pn.residual_with_stats(h, x, w, b, block_n=block_n, block_k=32)
    want_h, want_stats = pn.residual_with_stats_ref(h, x, w, b, block_n)
    torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_stats, want_stats, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="multiple of block_n"):
        pn.residual_with_stats(h, x, w[:60], b[:60], block_n=block_n)


@needs_triton
@pytest.mark.parametrize("stat_width,block_n", [(16, 32), (32, 16)])
def test_norm_linear_gelu_is_the_layer_norm_then_the_gelu_up_projection(stat_width, block_n):
    """From the producer's statistics and the weight's column sums: gelu(LN(h) W^T + b) within fp32 rounding,
    including rows whose mean dominates their spread."""
    h = _rand(1, 41, 64, seed=6, offset=5.0)
    w, b = _rand(80, 64, scale=0.1, seed=7), _rand(80, seed=8)
    _, stats = pn.residual_with_stats_ref(h, torch.zeros(1, 41, 8, device=DEVICE), torch.zeros(64, 8, device=DEVICE),
                                          None, stat_width)
    got = pn.norm_linear_gelu(h, stats, w, b, pn.column_sums(w), 1e-6, block_n=block_n, block_k=32)
    want = pn.norm_linear_gelu_ref(h, w, b, 1e-6)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    with pytest.raises(ValueError, match="colsum"):
        pn.norm_linear_gelu(h, stats, w, b, pn.column_sums(w)[:-1], 1e-6)


@needs_triton
def test_the_op_equals_its_two_op_reference_through_the_fused_candidate():
    """dispatch.linear_add_norm_gelu forced onto its fused candidate against the reference candidate (the
    residual GEMM + LayerNorm op, then the GELU up-projection op) on the same inputs."""
    h, x = _rand(1, 41, 64, seed=9), _rand(1, 41, 96, seed=10)
    w, b, wu, bu = (_rand(64, 96, scale=0.1, seed=11), _rand(64, seed=12), _rand(128, 64, scale=0.1, seed=13),
                    _rand(128, seed=14))
    cands = {c.name: c for c in dispatch.SELECTOR.candidates["linear_add_norm_gelu"]}
    assert list(cands)[-1] == "unfused" and all(c.profiled_only for n, c in cands.items() if n != "unfused")
    want_h, want_f = cands["unfused"].fn(h, x, w, b, wu, bu, dispatch.up_column_sums(wu), 1e-6)
    for name in ("post_norm", "post_norm_n32"):
        got_h, got_f = cands[name].fn(h, x, w, b, wu, bu, dispatch.up_column_sums(wu), 1e-6)
        torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
        assert ((got_f - want_f).norm() / want_f.norm()).item() < 1e-5, name


def test_without_column_sums_the_op_runs_the_two_ops():
    """A quantized up-projection (or a model loaded without the sums) takes the reference path, whatever a
    profile says: the fused candidate needs the sums."""
    h, x = _rand(1, 5, 32, seed=15), _rand(1, 5, 16, seed=16)
    w, b, wu, bu = _rand(32, 16, seed=17), _rand(32, seed=18), _rand(48, 32, seed=19), _rand(48, seed=20)
    got_h, got_f = dispatch.linear_add_norm_gelu(h.cpu(), x.cpu(), w.cpu(), b.cpu(), wu.cpu(), bu.cpu(), None, 1e-6)
    one, zero = ops.unit_affine(32, h.cpu())
    want_h = h.cpu() + torch.nn.functional.linear(x.cpu(), w.cpu(), b.cpu())
    normed = torch.nn.functional.layer_norm(want_h, (32,), one, zero, 1e-6)
    torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_f, torch.nn.functional.gelu(torch.nn.functional.linear(normed, wu.cpu(), bu.cpu()),
                                                               approximate="tanh"), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["post_norm", "post_norm_n32"])
def test_fused_candidate_at_the_dit_shapes_in_bf16(name):
    """GR00T's DiT (41 rows, width 1536, MLP 6144) in bf16: against fp32 of the same bf16 inputs the fused
    candidate is as close as the two-op path (both within one bf16 rounding of the output), graph replay equal
    to eager."""
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda", generator=g) * sc).bfloat16()  # noqa: E731
    h, x = r(1, 41, 1536), r(1, 41, 1536)
    w, b, wu, bu = r(1536, 1536, sc=0.02), r(1536, sc=0.1), r(6144, 1536, sc=0.02), r(6144, sc=0.1)
    cs = dispatch.up_column_sums(wu)
    cands = {c.name: c for c in dispatch.SELECTOR.candidates["linear_add_norm_gelu"]}
    want_h, _ = pn.residual_with_stats_ref(h.float(), x.float(), w.float(), b.float(), 16)
    want_f = pn.norm_linear_gelu_ref(want_h, wu.float(), bu.float(), 1e-6)
    ref_h, ref_f = cands["unfused"].fn(h, x, w, b, wu, bu, cs, 1e-6)
    got_h, got_f = cands[name].fn(h, x, w, b, wu, bu, cs, 1e-6)
    rel = lambda a: ((a.float() - want_f).norm() / want_f.norm()).item()  # noqa: E731
    assert ((got_h.float() - ref_h.float()).norm() / ref_h.float().norm()).item() < 4e-3
    assert rel(got_f) < max(1.25 * rel(ref_f), 4e-3), (rel(got_f), rel(ref_f))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_h, out_f = cands[name].fn(h, x, w, b, wu, bu, cs, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_h, got_h) and torch.equal(out_f, got_f)


@needs_triton
@pytest.mark.parametrize("adaptive", [True, False])
def test_gated_residual_rms_then_geglu_match_their_references(adaptive):
    """pi0.5's adaRMS (gate, scale, shift: shift rides as one more row of xs) and pi0's plain RMSNorm."""
    h, x = _rand(1, 50, 64, seed=21), _rand(1, 50, 96, seed=22)
    w, wgu = _rand(64, 96, scale=0.1, seed=23), _rand(96, 64, scale=0.1, seed=24)
    gate, scale, shift = _rand(64, seed=25), _rand(64, scale=0.1, seed=26), _rand(64, scale=0.1, seed=27)
    if not adaptive:
        gate = shift = None
    got = pn.gated_residual_rms(h, x, w, gate, scale, shift, block_n=16, block_k=32)
    want = pn.gated_residual_rms_ref(h, x, w, gate, scale, shift, 16)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert got[1].shape[0] == 50 + adaptive
    y = pn.rms_linear_geglu(got[1], got[2], wgu, 1e-6, block_n=16, block_k=32)
    ref = pn.rms_linear_geglu_ref(want[0], scale, shift, wgu, 1e-6).reshape(50, 48)
    assert ((y - ref).norm() / ref.norm()).item() < 1e-5


@needs_triton
@pytest.mark.parametrize("adaptive", [True, False])
def test_the_expert_op_equals_its_two_op_reference_through_the_fused_candidates(adaptive):
    h, x = _rand(1, 50, 64, seed=28), _rand(1, 50, 96, seed=29)
    w, wgu = _rand(64, 96, scale=0.1, seed=30), _rand(128, 64, scale=0.1, seed=31)
    mod = _rand(3, 64, scale=0.1, seed=32)
    gate, scale, shift = (mod[0][None, None], mod[1][None, None], mod[2][None, None]) if adaptive else \
        (None, mod[1], None)
    cands = {c.name: c for c in dispatch.SELECTOR.candidates["linear_gated_norm_geglu"]}
    assert list(cands)[-1] == "unfused" and all(c.profiled_only for n, c in cands.items() if n != "unfused")
    want_h, want_m = cands["unfused"].fn(x, w, h, gate, scale, shift, wgu, 1e-6)
    for name in ("post_norm", "post_norm_n16"):
        assert cands[name].supports(x, w, h, gate, scale, shift, wgu, 1e-6)
        got_h, got_m = cands[name].fn(x, w, h, gate, scale, shift, wgu, 1e-6)
        torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
        assert got_m.shape == want_m.shape and ((got_m - want_m).norm() / want_m.norm()).item() < 1e-5, name


def test_the_expert_op_leaves_per_token_modulation_and_large_batches_to_the_reference():
    """Training-time RTC (a modulation per token) and more rows than one item's tile: the fused candidate
    declines, the reference runs."""
    fused = next(c for c in dispatch.SELECTOR.candidates["linear_gated_norm_geglu"] if c.name == "post_norm")
    w, wgu = torch.zeros(64, 96), torch.zeros(128, 64)
    per_token = torch.zeros(1, 50, 64)
    assert not fused.supports(torch.zeros(1, 50, 96), w, torch.zeros(1, 50, 64), per_token, per_token, per_token,
                              wgu, 1e-6)
    one = torch.zeros(1, 1, 64)
    assert not fused.supports(torch.zeros(2, 50, 96), w, torch.zeros(2, 50, 64), one, one, one, wgu, 1e-6)
    assert fused.supports(torch.zeros(1, 50, 96), w, torch.zeros(1, 50, 64), one, one, one, wgu, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["post_norm", "post_norm_n16"])
@pytest.mark.parametrize("adaptive", [True, False])
def test_expert_fused_candidate_at_the_pi_shapes_in_bf16(name, adaptive):
    """pi0.5's (adaRMS, 50 rows) and pi0's (plain RMSNorm, 51 rows) o-proj 2048 -> 1024 and gate_up 1024 -> 2 x
    4096 in bf16: as close to fp32 as the two-op path, graph replay equal to eager."""
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda", generator=g) * sc).bfloat16()  # noqa: E731
    rows = 50 if adaptive else 51
    h, x = r(1, rows, 1024), r(1, rows, 2048)
    w, wgu = r(1024, 2048, sc=0.02), r(8192, 1024, sc=0.03)
    mod = torch.randn(3, 1024, device="cuda", generator=g) * 0.1
    gate, scale, shift = (mod[0][None, None], mod[1][None, None], mod[2][None, None]) if adaptive else \
        (None, mod[1].bfloat16(), None)
    cands = {c.name: c for c in dispatch.SELECTOR.candidates["linear_gated_norm_geglu"]}
    want_h, _, _ = pn.gated_residual_rms_ref(h.float(), x.float(), w.float(), gate, scale, None, 16)
    want_m = pn.rms_linear_geglu_ref(want_h, scale, shift, wgu.float(), 1e-6)
    ref_h, ref_m = cands["unfused"].fn(x, w, h, gate, scale, shift, wgu, 1e-6)
    got_h, got_m = cands[name].fn(x, w, h, gate, scale, shift, wgu, 1e-6)
    rel = lambda a: ((a.float() - want_m).norm() / want_m.norm()).item()  # noqa: E731
    assert ((got_h.float() - ref_h.float()).norm() / ref_h.float().norm()).item() < 4e-3
    assert rel(got_m) < max(1.25 * rel(ref_m), 6e-3), (rel(got_m), rel(ref_m))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_h, out_m = cands[name].fn(x, w, h, gate, scale, shift, wgu, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_h, got_h) and torch.equal(out_m, got_m)
