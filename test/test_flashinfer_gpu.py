"""flashinfer candidates on a CUDA device (``gpu`` marker; skipped without CUDA or without flashinfer): each
against the fp32 reference at production shapes, under CUDA-graph capture with fresh inputs copied in before
each replay, and chosen by the selector where a profile names it.

The first plan / first norm call JIT-compiles flashinfer's kernels (about a minute per module on a fresh
machine, then cached under ~/.cache/flashinfer).

Tolerances (inputs bf16; the reference is ops.attention / ops.rms_norm in fp32 on the same values upcast)
------------------------------------------------------------------------------------------------------
* attention: out = sum_j p_j v_j. q.k is exact bf16 products summed in fp32; the kernel rounds the
  probabilities p to bf16 before the PV product (relative error <= 2^-8 each, and sum p = 1, so at most
  2^-8 max|v|), where it splits the keys it stores each split's normalised partial output in bf16 (another
  <= 2^-8 max|v|, the merge weights summing to 1), and it rounds the output once (<= 2^-8 max|v|):
  |out - ref| <= 3 * 2^-8 max|v| elementwise. The norm-relative error is also held to < 1e-2 (what
  test_kernels_gpu asks of the Triton attention).
* RMSNorm: fp32 math rounded once: one bf16 rounding (rtol 2^-7, a full ulp at worst, as test_kernels_gpu).
* GeGLU: one rounding (2^-8 relative) plus the tanh.approx.f32 error (<= 2^-10.987 relative to tanh, PTX ISA),
  i.e. |d gelu| <= 0.5 |g| 2^-10.987 < 2.6e-4 |g|: |out - ref| <= 2^-8 |ref| + 2.6e-4 |g u| + 1e-6.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (gpu marker)", allow_module_level=True)
pytest.importorskip("flashinfer")

from phyai_ros.layers import dispatch, ops  # noqa: E402
from phyai_ros.layers import flashinfer_backend as fb  # noqa: E402
from phyai_ros.layers import profiling  # noqa: E402
from phyai_ros.layers.selector import device_signature, shape_key  # noqa: E402
from phyai_ros.models.pi.modeling.suffix import suffix_context  # noqa: E402

if not fb.available():
    pytest.skip("flashinfer switched off (PHYAI_FLASHINFER=0)", allow_module_level=True)

DEV = torch.device("cuda")
BF16 = torch.bfloat16
P_SLOTS, P_TOKENS = 3 * 256, 200
P = P_SLOTS + P_TOKENS                      # 968: the pi0.5 prefix of 3 cameras and a 200-token budget
HQ, HKV, D = 8, 1, 256                      # Gemma 2B / the action expert


def prefix_pad(batch: int, tokens: int = 40, missing_camera: int = -1) -> torch.Tensor:
    """[B, P] as embed_prefix builds it (camera slots, then prompt tokens); item i has tokens - 5 i prompt
    tokens, and items > 0 lack camera `missing_camera` where given (padding in the middle)."""
    pad = torch.zeros(batch, P, dtype=torch.bool, device=DEV)
    for i in range(batch):
        pad[i, :P_SLOTS] = True
        if i and missing_camera >= 0:
            pad[i, 256 * missing_camera:256 * (missing_camera + 1)] = False
        pad[i, P_SLOTS:P_SLOTS + tokens - 5 * i] = True
    return pad


def inv_freq() -> torch.Tensor:
    return 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float32, device=DEV) / D)


def rand(*shape, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEV).to(BF16)


def expert_inputs(b: int, n_state: int = 0, seed: int = 0, **pad_kw):
    """(q, k_prefix, v_prefix, k_suffix, v_suffix, mask) at the expert's shapes, mask from suffix_context."""
    t = n_state + 50
    mask = suffix_context(prefix_pad(b, **pad_kw), 50, n_state, inv_freq(), BF16).mask
    return (rand(b, HQ, t, D, seed=seed), rand(b, HKV, P, D, seed=seed + 1), rand(b, HKV, P, D, seed=seed + 2),
            rand(b, HKV, t, D, seed=seed + 3), rand(b, HKV, t, D, seed=seed + 4), mask)


def prefix_inputs(b: int, seed: int = 0, **pad_kw):
    pad = prefix_pad(b, **pad_kw)
    mask = ops.bool_to_additive_mask(pad[:, :, None] & pad[:, None, :])
    return rand(b, HQ, P, D, seed=seed), rand(b, HKV, P, D, seed=seed + 1), rand(b, HKV, P, D, seed=seed + 2), mask


def expert_reference(q, kp, vp, ks, vs, mask):
    cat = lambda a, b: torch.cat([a, b], dim=2).float()  # noqa: E731
    return ops.attention(q.float(), cat(kp, ks), cat(vp, vs), mask)


def check_attention(out, ref, v):
    assert out.shape == ref.shape and out.dtype == BF16 and torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item()
    assert err <= 3 * 2 ** -8 * v.float().abs().max().item(), err
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


# ----------------------------------------------------------------------------- attention vs fp32
@pytest.mark.parametrize("b,n_state,missing", [(1, 0, -1), (4, 0, 1), (1, 1, -1), (4, 1, 2)],
                         ids=["pi05_b1", "pi05_b4_missing_camera", "pi0_b1", "pi0_b4_missing_camera"])
def test_expert_attention_matches_fp32(b, n_state, missing):
    args = expert_inputs(b, n_state, missing_camera=missing)
    out = fb.attention_with_prefix(*args)
    assert out.transpose(1, 2).is_contiguous()          # token-major, as the Triton candidate writes it
    check_attention(out, expert_reference(*args), torch.cat([args[2], args[4]], 2))


@pytest.mark.parametrize("b", [1, 2])
def test_prefix_self_attention_matches_fp32_padding_rows_included(b):
    q, k, v, mask = prefix_inputs(b, missing_camera=1)
    out = fb.attention(q, k, v, mask)
    # Padding queries (fully masked rows) attend uniformly, as the reference does: all rows compared.
    check_attention(out, ops.attention(q.float(), k.float(), v.float(), mask), v)


def test_unmasked_grouped_attention_matches_fp32():
    """Several kv heads (16 q, 8 kv, as Qwen3-VL; head dim 256 to reuse the compiled module), no mask, batch 2:
    q, k and v copied to the ragged layout rather than viewed."""
    q, k, v = rand(2, 16, 300, D, seed=5), rand(2, 8, 300, D, seed=6), rand(2, 8, 300, D, seed=7)
    check_attention(fb.attention(q, k, v, None), ops.attention(q.float(), k.float(), v.float()), v)


# ----------------------------------------------------------------------------- CUDA graphs
def _capture(fn, static):
    """Warm up eagerly on a side stream (plans, JIT), then capture one call, as runtime/graphs.capture does."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*static)
    return g, out


def test_expert_attention_replays_with_fresh_inputs_and_masks():
    """The mask is re-packed inside the graph: each replay sees the padding of the inputs copied in (another
    prompt length, a camera going missing), not the one present at capture."""
    static = [a.clone() for a in expert_inputs(1, seed=10)]
    g, out = _capture(fb.attention_with_prefix, static)
    for i, pad_kw in enumerate([dict(tokens=12), dict(tokens=60, missing_camera=0), dict(tokens=40)]):
        fresh = expert_inputs(2, seed=20 + 10 * i, **pad_kw)
        fresh = [a[1:] for a in fresh]                  # item 1: the one with the missing camera, if any
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        g.replay()
        check_attention(out, expert_reference(*fresh), torch.cat([fresh[2], fresh[4]], 2))


def test_prefix_attention_replays_with_fresh_inputs_and_masks():
    static = [a.clone() for a in prefix_inputs(1, seed=30)]
    g, out = _capture(fb.attention, static)
    for i, tokens in enumerate([7, 120]):
        fresh = prefix_inputs(1, seed=40 + 10 * i, tokens=tokens)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        g.replay()
        q, k, v, mask = fresh
        check_attention(out, ops.attention(q.float(), k.float(), v.float(), mask), v)


def test_unplanned_shape_is_declined_during_capture_then_taken_after_an_eager_call():
    q, kp, vp, ks, vs, mask = expert_inputs(1)
    args = (q[:, :, :7], kp, vp, ks[:, :, :7], vs[:, :, :7], mask[:, :, :7, :P + 7].contiguous())
    x = torch.zeros(4, device=DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
        declined = not fb.supports_attention_with_prefix(*args)
    assert declined
    fb.attention_with_prefix(*args)                      # eager: plans
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        x.add_(1)
        accepted = fb.supports_attention_with_prefix(*args)
    assert accepted


# ----------------------------------------------------------------------------- the selector and the profiler
def test_selector_runs_flashinfer_where_the_profile_names_it():
    args = expert_inputs(1, seed=50)
    key = shape_key(args[0], args[1])
    sel = dispatch.SELECTOR.derive()
    assert sel.choose("attention_with_prefix", key, DEV, args).name != fb.NAME    # profiled-only: not by default
    sel.profile.setdefault(device_signature(DEV), {})["attention_with_prefix"] = {key: fb.NAME}
    assert sel.choose("attention_with_prefix", key, DEV, args).name == fb.NAME
    with sel.active():
        out = dispatch.attention_with_prefix(*args)
    assert torch.equal(out, fb.attention_with_prefix(*args))   # same plan, same kernels: bit for bit
    assert ("attention_with_prefix", key, fb.NAME) not in sel.disabled


def test_profiler_times_and_accepts_the_flashinfer_candidate():
    """What scripts/profile_ops.py does per recorded call: time every usable candidate in a CUDA graph and check
    it against the reference; flashinfer must be among them, correct, with a time."""
    args = expert_inputs(1, seed=60)
    key = shape_key(args[0], args[1])
    _, timings = profiling.profile_calls(dispatch.SELECTOR.derive(), {("attention_with_prefix", key): (args, {})},
                                         DEV, reps=4, replays=3)
    entry = timings["attention_with_prefix"][key][fb.NAME]
    assert isinstance(entry, dict) and entry["ok"] and entry["us"] > 0, entry


# ----------------------------------------------------------------------------- norm and activation
@pytest.mark.parametrize("offset", [1.0, 0.0], ids=["gemma", "plain"])
@pytest.mark.parametrize("rows,width", [(968, 2048), (50, 1024)])
def test_rms_norm_matches_fp32_and_replays(rows, width, offset):
    x, w = rand(rows, width, seed=70) * 4, rand(width, seed=71)
    ref = lambda x: ops.rms_norm(x.float(), w.float(), 1e-6, offset)  # noqa: E731
    torch.testing.assert_close(fb.rms_norm(x, w, 1e-6, offset).float(), ref(x), rtol=2 ** -7, atol=1e-5)
    static = x.clone()
    g, out = _capture(lambda a: fb.rms_norm(a, w, 1e-6, offset), [static])
    static.copy_(rand(rows, width, seed=72))
    g.replay()
    torch.testing.assert_close(out.float(), ref(static), rtol=2 ** -7, atol=1e-5)


@pytest.mark.parametrize("rows,m", [(968, 16384), (50, 4096)])
def test_geglu_matches_fp32_within_the_tanh_approximation(rows, m):
    gate_up = rand(rows, 2 * m, seed=80) * 3
    g32, u32 = gate_up.float().split(m, -1)
    ref = torch.nn.functional.gelu(g32, approximate="tanh") * u32
    out = fb.geglu(gate_up)
    assert out.shape == (rows, m) and out.dtype == BF16
    bound = 2 ** -8 * ref.abs() + 2.6e-4 * (g32 * u32).abs() + 1e-6
    assert ((out.float() - ref).abs() <= bound).all()
    static = gate_up.clone()
    graph, gout = _capture(fb.geglu, [static])
    static.copy_(rand(rows, 2 * m, seed=81))
    graph.replay()
    torch.testing.assert_close(gout, fb.geglu(static), rtol=0, atol=0)
