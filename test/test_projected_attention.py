"""An attention block's input projection and its attention in one kernel (kernels/candidates/projected_attention.py;
dispatch.projected_attention, GR00T's DiT): against the fp32 reference and against the two selector ops it
replaces. Interpreter on the CPU (fp32, small shapes); GR00T's real shapes in bf16 under the ``gpu`` marker."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from phyai_ros.kernels import common  # noqa: E402
from phyai_ros.kernels.candidates import projected_attention as pa  # noqa: E402
from phyai_ros.layers import attention  # noqa: E402

DEVICE = "cpu" if common.interpret_mode() else "cuda"
needs_triton = pytest.mark.skipif(not common.available(), reason="triton not usable here")
# the interpreter turns 0-d index tensors into ints through a numpy path that warns; a masked key's finfo.min
# times log2(e) overflows to -inf in fp32 on purpose (numpy says so)
pytestmark = [pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")]


def _rand(*shape, scale=1.0, seed=0, device=DEVICE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _key_mask(b, n_keys, valid, device=DEVICE, dtype=torch.float32):
    """Additive [B, 1, 1, L]: item i sees its first valid[i] keys."""
    allowed = torch.arange(n_keys, device=device)[None] < torch.tensor(valid, device=device)[:, None]
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[:, None, None, :]


def _cross(b=2, t=9, k=96, heads=3, d=16, n_keys=21, seed=0, **kw):
    y = _rand(b, t, k, seed=seed, **kw)
    w, bias = _rand(heads * d, k, scale=0.1, seed=seed + 1, **kw), _rand(heads * d, scale=0.1, seed=seed + 2, **kw)
    kc = _rand(b, n_keys, heads, d, seed=seed + 3, **kw).transpose(1, 2)     # [B, H, L, d] views, as heads() makes
    vc = _rand(b, n_keys, heads, d, seed=seed + 4, **kw).transpose(1, 2)
    return y, w, bias, kc, vc


@needs_triton
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_self_attention_block_matches_its_reference(splits):
    """The fused to_qkv projection split over K (the last split sums, in order) then attention over the rows."""
    y = _rand(2, 9, 96, seed=1)
    w, bias = _rand(3 * 3 * 16, 96, scale=0.1, seed=2), _rand(3 * 3 * 16, scale=0.1, seed=3)
    got = pa.projected_attention(y, w, bias, 3, splits=splits, block_k=32)
    want = pa.projected_attention_ref(y, w, bias, 3)
    assert got.shape == (2, 9, 48)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    again = pa.projected_attention(y, w, bias, 3, splits=splits, block_k=32)   # counters were reset
    assert torch.equal(got, again)


@needs_triton
@pytest.mark.parametrize("splits", [1, 4])
def test_cross_attention_block_with_a_key_mask_matches_its_reference(splits):
    y, w, bias, kc, vc = _cross(seed=10)
    mask = _key_mask(2, 21, [21, 13])
    got = pa.projected_attention(y, w, bias, 3, kc, vc, mask, splits=splits, block_k=32)
    torch.testing.assert_close(got, pa.projected_attention_ref(y, w, bias, 3, kc, vc, mask), rtol=1e-4, atol=1e-5)
    no_bias = pa.projected_attention(y, w, None, 3, kc, vc, None, splits=splits, block_k=32)
    torch.testing.assert_close(no_bias, pa.projected_attention_ref(y, w, None, 3, kc, vc), rtol=1e-4, atol=1e-5)


@needs_triton
def test_a_row_whose_keys_are_all_masked_gives_zero_and_the_others_are_unchanged():
    y, w, bias, kc, vc = _cross(seed=20)
    mask = _key_mask(2, 21, [0, 21])
    got = pa.projected_attention(y, w, bias, 3, kc, vc, mask, splits=2, block_k=32)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    torch.testing.assert_close(got[1:], pa.projected_attention_ref(y[1:], w, bias, 3, kc[1:], vc[1:], mask[1:]),
                               rtol=1e-4, atol=1e-5)


def test_the_reference_is_the_two_ops_it_replaces():
    """projected_attention_ref (the kernel's yardstick) is the projection, the heads and attention as the DiT ran
    them before the op existed (the op's unfused candidate, here on the CPU)."""
    y, w, bias, kc, vc = _cross(seed=30, device="cpu")
    mask = _key_mask(2, 21, [17, 21], device="cpu")
    unfused = attention._unfused_projected_attention(y, w, bias, 3, kc, vc, mask)
    torch.testing.assert_close(unfused, pa.projected_attention_ref(y, w, bias, 3, kc, vc, mask), rtol=1e-5, atol=1e-6)
    w3, b3 = _rand(3 * 48, 96, scale=0.1, seed=31, device="cpu"), _rand(3 * 48, seed=32, device="cpu")
    torch.testing.assert_close(attention._unfused_projected_attention(y, w3, b3, 3),
                               pa.projected_attention_ref(y, w3, b3, 3), rtol=1e-5, atol=1e-6)


def test_shapes_it_does_not_take_go_to_the_unfused_ops():
    y, w, bias, kc, vc = _cross(seed=40, device="cpu")
    assert pa.fits(y, w, 3, kc, _key_mask(2, 21, [3, 4], device="cpu"))
    assert not pa.fits(_rand(1, 65, 96, device="cpu"), w, 3, kc)                   # more rows than one tile
    assert not pa.fits(y, w, 3, _rand(2, 3, 257, 16, device="cpu"))                # more keys than one block
    assert not pa.fits(y, w, 3, kc, torch.zeros(2, 1, 9, 21))                      # a mask per query
    assert not pa.fits(y, w[:47], 3, kc)                                           # heads do not split the width
    assert not pa.fits(y, _rand(3 * 48, 96, device="cpu"), 3, None, torch.zeros(2, 21))   # self: no mask
    with pytest.raises(ValueError, match="does not take"):
        pa.projected_attention(_rand(1, 65, 96), _rand(48, 96), None, 3, _rand(1, 3, 21, 16), _rand(1, 3, 21, 16))


# ----------------------------------------------------------------------------- GR00T's shapes on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch", [1, 2, 8, 32])
@pytest.mark.parametrize("cross", [False, True])
def test_groot_dit_blocks_in_bf16_match_fp32_and_graph_replay(batch, cross):
    """41 rows, 32 heads of 48, width 1536; cross-attention over 103 cached keys with a per-item key mask. Bound:
    bf16 rounding of q / k / v and p, relative to fp32 as the unfused ops reach it (1.5x theirs + 2e-3). Under a
    CUDA graph replayed on new inputs (counters reset by the kernel itself)."""
    bf = torch.bfloat16
    y = _rand(batch, 41, 1536, seed=50, device="cuda", dtype=bf)
    n = 1536 if cross else 3 * 1536
    w, bias = _rand(n, 1536, scale=0.02, seed=51, device="cuda", dtype=bf), _rand(n, scale=0.02, seed=52,
                                                                                  device="cuda", dtype=bf)
    kc = vc = mask = None
    if cross:
        kc = _rand(batch, 103, 32, 48, seed=53, device="cuda", dtype=bf).transpose(1, 2)
        vc = _rand(batch, 103, 32, 48, seed=54, device="cuda", dtype=bf).transpose(1, 2)
        mask = _key_mask(batch, 103, [97 - i % 40 for i in range(batch)], device="cuda", dtype=bf)
    want = pa.projected_attention_ref(y.float(), w.float(), bias.float(), 32,
                                      None if kc is None else kc.float(), None if vc is None else vc.float(),
                                      None if mask is None else mask.float())
    unfused = attention._unfused_projected_attention(y, w, bias, 32, kc, vc, mask).float()
    bound = 1.5 * float((unfused - want).norm() / want.norm()) + 2e-3
    got = pa.projected_attention(y, w, bias, 32, kc, vc, mask)
    assert float((got.float() - want).norm() / want.norm()) < bound
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = pa.projected_attention(y, w, bias, 32, kc, vc, mask)
    for seed in (60, 61):
        y.copy_(_rand(batch, 41, 1536, seed=seed, device="cuda", dtype=bf))
        graph.replay()
        torch.testing.assert_close(replayed, pa.projected_attention(y, w, bias, 32, kc, vc, mask), rtol=0, atol=0)
