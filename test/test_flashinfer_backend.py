"""flashinfer backend, host side: registration without the package, the additive mask -> packed custom mask
mapping on the masks the models really build, and what the candidates decline.

The mapping is pure torch, so it is checked here bit for bit; the kernels themselves run in
test_flashinfer_gpu.py. ``emulate`` is the custom-mask contract written out in torch (a key takes part where its
bit is set, the query as given): attention through it must equal ops.attention on every row, fully masked rows
included, which is what the candidate relies on.
"""
import sys

import numpy as np
import pytest
import torch

from phyai_ros.layers import dispatch, ops
from phyai_ros.layers import flashinfer_backend as fb
from phyai_ros.layers.ops import MASK_VALUE
from phyai_ros.models.pi.modeling.suffix import suffix_context

P_SLOTS, P_TOKENS = 3 * 256, 200          # pi0.5 prefix: 3 camera slots of 256 tokens, a 200-token prompt budget
P = P_SLOTS + P_TOKENS


@pytest.fixture
def fresh_detection():
    """installed() is cached per process; clear it around tests that change what it sees."""
    fb.installed.cache_clear()
    yield
    fb.installed.cache_clear()


def prefix_pad(batch: int, missing_camera: bool = True) -> torch.Tensor:
    """[B, P] as embed_prefix builds it: camera slots then prompt tokens; item 0 has all cameras and 40 prompt
    tokens, the others fewer tokens and (missing_camera) camera 1 absent, so padding sits mid-prefix."""
    pad = torch.zeros(batch, P, dtype=torch.bool)
    for i in range(batch):
        pad[i, :P_SLOTS] = True
        if i and missing_camera:
            pad[i, 256:512] = False
        pad[i, P_SLOTS:P_SLOTS + 40 - 7 * i] = True
    return pad


def unpack(packed: torch.Tensor, q_len: int, kv_len: int) -> np.ndarray:
    """[B, nbytes] -> bool [B, Tq, Tk] (little-endian bits, row-major per request); asserts the padding is 0."""
    bits = np.unpackbits(packed.cpu().numpy(), axis=-1, bitorder="little").astype(bool)
    assert not bits[:, q_len * kv_len:].any()
    return bits[:, :q_len * kv_len].reshape(-1, q_len, kv_len)


def emulate(q, k, v, packed, keep):
    """Attention as the custom-mask kernel defines it: softmax over the keys whose bit is set, fp32."""
    b, hq, tq, d = q.shape
    allowed = torch.from_numpy(unpack(packed, tq, k.shape[2]))[:, None]
    g = hq // k.shape[1]
    q = q * keep.unsqueeze(1).to(q.dtype)
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / d ** 0.5
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v


# ----------------------------------------------------------------------------- registration
def test_no_candidates_where_flashinfer_is_missing_or_switched_off(monkeypatch, fresh_detection, tmp_path):
    monkeypatch.setitem(sys.modules, "flashinfer", None)           # what an image without the package looks like
    assert fb.candidates() == [] and not fb.available()
    # Installed (a package of that name on the path) but switched off for an A/B run.
    monkeypatch.delitem(sys.modules, "flashinfer")
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PHYAI_FLASHINFER", "0")
    fb.installed.cache_clear()
    assert fb.candidates() == []


def test_dispatch_offers_flashinfer_only_where_installed():
    names = {op: [c.name for c in cands] for op, cands in dispatch.SELECTOR.candidates.items()}
    offered = {op for op, n in names.items() if fb.NAME in n}
    assert offered == ({op for op, _ in fb.candidates()} if fb.installed() else set())
    for op in offered:   # inserted before the reference, never the reference itself
        assert names[op][-1] != fb.NAME


def test_candidates_are_profiled_only_cuda_and_before_each_reference(monkeypatch, fresh_detection, tmp_path):
    """With a package named flashinfer on the path (it is not imported: registration only looks it up)."""
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("raise ImportError('never imported by registration')")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PHYAI_FLASHINFER", raising=False)
    pairs = fb.candidates()
    assert sorted(op for op, _ in pairs) == ["attention", "attention_with_prefix", "geglu", "rms_norm"]
    for op, c in pairs:
        assert op in dispatch.SELECTOR.candidates and c.name == fb.NAME
        assert c.profiled_only and c.devices == ("cuda",) and c.capture_safe and c.supports is not None
        assert c.available()


# ----------------------------------------------------------------------------- the mask mapping
@pytest.mark.parametrize("n_state", [0, 1], ids=["pi05", "pi0"])
def test_packed_suffix_mask_is_the_additive_mask_bit_for_bit(n_state):
    b, n_actions = 3, 50
    pad = prefix_pad(b)
    ctx = suffix_context(pad, n_actions, n_state, ops_inv_freq(), torch.float32)
    t = n_state + n_actions
    assert ctx.mask.shape == (b, 1, t, P + t)
    # Padding is not a contiguous tail of the keys (a missing camera's slots): per-request KV lengths could not
    # express it, hence the custom mask.
    blocked = ~pad[1]
    assert blocked[256:512].all() and not blocked[512:P_SLOTS].any()
    packed, keep = fb.pack_mask(ctx.mask, b, t, P + t)
    assert packed.shape == (b, fb.packed_bytes(t, P + t)) and packed.dtype == torch.uint8
    assert keep.all()                                   # every suffix query sees at least itself
    bits = unpack(packed, t, P + t)
    np.testing.assert_array_equal(bits, (ctx.mask[:, 0] == 0).numpy())
    # What the bits say, spelled out: padded prefix keys blocked for every query; pi0.5's action tokens see each
    # other; pi0's state token does not see the actions.
    assert (bits[:, :, :P] == pad[:, None, :].numpy()).all()
    assert bits[:, n_state:, P:].all()
    if n_state:
        assert bits[:, 0, P].all() and not bits[:, 0, P + 1:].any()


def test_prefix_self_attention_mask_blocks_padding_rows_entirely():
    pad = prefix_pad(2)
    mask = ops.bool_to_additive_mask(pad[:, :, None] & pad[:, None, :])
    packed, keep = fb.pack_mask(mask, 2, P, P)
    bits = unpack(packed, P, P)
    assert torch.equal(keep[..., 0], pad)               # padding queries: no allowed key, query to be zeroed
    valid = pad.numpy()
    assert (bits[valid] == np.broadcast_to(valid[:, None, :], (2, P, P))[valid]).all()
    assert bits[~valid].all()                           # ... and every key open, so the kernel stays finite


@pytest.mark.parametrize("shape", [(1, 1, 6, 21), (3, 1, 1, 21), (1, 1, 1, 21)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_broadcast_masks_pack_per_request(shape, dtype):
    b, tq, tk = 3, 6, 21                                # 126 bits: each request's segment is padded to 16 bytes
    g = torch.Generator().manual_seed(0)
    mask = torch.where(torch.rand(shape, generator=g) < 0.6, 0.0, MASK_VALUE).to(dtype)
    mask[..., 0] = 0.0
    packed, keep = fb.pack_mask(mask, b, tq, tk)
    assert packed.shape == (b, 16) and keep.all()
    np.testing.assert_array_equal(unpack(packed, tq, tk), (mask[:, 0] == 0).expand(b, tq, tk).numpy())


@pytest.mark.parametrize("case", ["pi05", "prefix"])
def test_custom_mask_semantics_equal_the_reference_on_every_row(case):
    """The packed mask plus the zeroed queries, under the kernel's masking rule, is ops.attention exactly, fully
    masked rows (uniform attention in the reference) included."""
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, d = 2, 4, 1, 32
    if case == "pi05":
        pad = prefix_pad(b)
        mask = suffix_context(pad, 50, 0, ops_inv_freq(), torch.float32).mask
    else:
        pad = prefix_pad(b)[:, ::8]                      # a shorter prefix with the same padding pattern
        mask = ops.bool_to_additive_mask(pad[:, :, None] & pad[:, None, :])
    tq, tk = mask.shape[2], mask.shape[3]
    q = torch.randn(b, hq, tq, d, generator=g, dtype=torch.float32)
    k, v = (torch.randn(b, hkv, tk, d, generator=g, dtype=torch.float32) for _ in range(2))
    packed, keep = fb.pack_mask(mask, b, tq, tk)
    assert (case == "prefix") == (not keep.all())
    torch.testing.assert_close(emulate(q, k, v, packed, keep), ops.attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- what the candidates decline
def _expert_args(dtype=torch.bfloat16, d=256, hq=8, hkv=1, mask_shape=None, mask_dtype=torch.float32):
    b, t = 1, 50
    q = torch.zeros(b, hq, t, d, dtype=dtype)
    kp, vp = (torch.zeros(b, hkv, P, d, dtype=dtype) for _ in range(2))
    ks, vs = (torch.zeros(b, hkv, t, d, dtype=dtype) for _ in range(2))
    mask = torch.zeros(mask_shape or (b, 1, t, P + t), dtype=mask_dtype)
    return q, kp, vp, ks, vs, mask


def test_attention_candidates_decline_what_they_cannot_express():
    ok = fb.supports_attention_with_prefix
    assert ok(*_expert_args())                                        # the pi0.5 expert, bf16
    assert ok(*_expert_args()[:-1], None)
    assert ok(*_expert_args(mask_shape=(1, 1, 1, P + 50)))            # per-key mask, broadcast over queries
    assert not ok(*_expert_args(mask_dtype=torch.bool))               # bool: not the op's additive contract
    assert not ok(*_expert_args(mask_shape=(1, 8, 50, P + 50)))       # per head
    assert not ok(*_expert_args(mask_shape=(1, 50, P + 50)))          # 3-D
    assert not ok(*_expert_args(mask_shape=(1, 1, 50, P + 49)))       # not the key count
    assert not ok(*_expert_args(dtype=torch.float32))                 # the kernels take fp16 / bf16
    assert not ok(*_expert_args(d=72))                                # head dims 64, 128, 256
    assert not ok(*_expert_args(hq=6, hkv=4))                         # heads not grouped
    q, kp, vp, ks, vs, mask = _expert_args()
    assert not ok(q, kp, vp.half(), ks, vs, mask)                     # mixed dtypes
    assert not ok(q, kp, vp, ks[:, :, :, :128], vs, mask)
    sa = fb.supports_attention
    q = torch.zeros(1, 8, P, 256, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, P, 256, dtype=torch.bfloat16)
    assert sa(q, k, k, torch.zeros(1, 1, P, P)) and sa(q, k, k)
    assert not sa(q, k, k, torch.zeros(1, 1, P, P, dtype=torch.bool))
    assert not sa(q, k, k[:, :, :-1], torch.zeros(1, 1, P, P))


def test_norm_and_activation_candidates_take_only_the_reference_math():
    x = torch.zeros(968, 2048, dtype=torch.bfloat16)
    assert fb.supports_rms_norm(x, torch.zeros(2048, dtype=torch.bfloat16), 1e-6, 1.0)
    assert fb.supports_rms_norm(x, torch.zeros(2048, dtype=torch.bfloat16), 1e-6, 0.0)
    assert not fb.supports_rms_norm(x, torch.zeros(2048), 1e-6, 1.0)   # fp32 weight: the kernel reads x's dtype
    assert not fb.supports_rms_norm(x, torch.zeros(2048, dtype=torch.bfloat16), 1e-6, 0.5)
    assert not fb.supports_rms_norm(x.float(), torch.zeros(2048), 1e-6, 1.0)
    gate_up = torch.zeros(968, 2 * 16384, dtype=torch.bfloat16)
    assert fb.supports_geglu(gate_up)
    assert not fb.supports_geglu(gate_up[:, ::2])                      # rows must be contiguous
    assert not fb.supports_geglu(gate_up.float())


def ops_inv_freq(head_dim: int = 256) -> torch.Tensor:
    return 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
