"""The expert_stack op (layers/expert_stack.py) through the models.

Its reference is the per-op path pi0.5 and pi0 ran before the op existed, bit for bit; its fused forms (run
here on the CPU through Triton's interpreter, the selector's CUDA-only candidates made CPU-usable) give the
same velocity through ``denoise_velocity`` within fp32 rounding; the selector offers them only where they apply.
"""
import copy
import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from phyai_ros.kernels import common  # noqa: E402
from phyai_ros.layers import dispatch, ops  # noqa: E402
from phyai_ros.layers.expert_stack import FUSED_FORMS, ExpertNorms, fits  # noqa: E402
from phyai_ros.layers.selector import OperatorSelector  # noqa: E402
from phyai_ros.models.pi.modeling.config import GemmaConfig, SiglipConfig  # noqa: E402
from phyai_ros.models.pi.pi0 import Pi0Config  # noqa: E402
from phyai_ros.models.pi.pi0 import checkpoint as pi0_checkpoint  # noqa: E402
from phyai_ros.models.pi.pi0.modeling import Pi0Model  # noqa: E402
from phyai_ros.models.pi.pi05 import Pi05Config  # noqa: E402
from phyai_ros.models.pi.pi05.checkpoint import make_random_model, random_state_dict  # noqa: E402

needs_interpreter = pytest.mark.skipif(not (common.HAVE_TRITON and common.interpret_mode()),
                                       reason="Triton interpreter check for CPU-only machines")
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")]
B, P, H = 2, 23, 5      # batch, prefix keys, actions
FORMS = [name for name, *_ in FUSED_FORMS]   # the prefetching forms run on a GPU only (test_l2_prefetch*.py)


def config(cls):
    """A two-layer expert with the real layout at toy width: 4 heads of 32 on one KV head, MLP 96."""
    g = GemmaConfig(width=64, depth=2, mlp_dim=96, num_heads=4, num_kv_heads=1, head_dim=32)
    return cls(vlm=g, expert=g, siglip=SiglipConfig(width=32, depth=1, num_heads=2, mlp_dim=64, image_size=28),
               vocab_size=64, chunk_size=H, num_steps=3)


def case(policy, dtype=torch.float32, seed=0):
    """(model, velocity inputs): a random model, a prefix cache per layer, the second item's prompt shorter."""
    g = torch.Generator().manual_seed(seed)
    if policy == "pi05":
        m = make_random_model(config(Pi05Config), seed=seed + 1, std=0.1, dtype=dtype)
    else:
        m = Pi0Model(config(Pi0Config), dtype=dtype)
        pi0_checkpoint.load_state_dict(m, random_state_dict(pi0_checkpoint.lerobot_key_shapes(config(Pi0Config)),
                                                            seed + 1, 0.1, torch.float32))
    kv = [tuple(torch.randn(B, 1, P, 32, generator=g).to(dtype) for _ in range(2)) for _ in range(2)]
    pad = torch.ones(B, P, dtype=torch.bool)
    pad[1, 15:] = False
    x_t = torch.randn(B, H, m.cfg.max_action_dim, generator=g)
    return m, dict(kv=kv, ctx=m.suffix_context(pad), x_t=x_t,
                   state=m.embed_state(torch.randn(B, 32, generator=g)) if policy == "pi0" else None)


def velocity(m, c, t=(0.7,)):
    if c["state"] is None:
        mod = m.time_modulation(torch.tensor(t))
        return m.denoise_velocity(c["x_t"], c["kv"], ctx=c["ctx"], modulation=mod if len(t) > 1 else mod[0])
    return m.denoise_velocity(c["x_t"], c["kv"], c["state"], ctx=c["ctx"], time_bias=m.time_bias(torch.tensor(t)))


# ----------------------------------------------------------------------------- the reference is the old path
def old_pi05_velocity(m, c, t):
    """pi0.5's expert loop as it was written before the expert_stack op (the oracle)."""
    eps = m.cfg.expert.rms_eps
    mod = m.time_modulation(torch.tensor(t))
    mod = (mod if len(t) > 1 else mod[0][None]).unsqueeze(3)
    h = m.embed_actions(c["x_t"])
    x = dispatch.ada_rms_norm(h, mod[:, 0, 0], mod[:, 0, 1], eps)
    for i, layer in enumerate(m.expert_layers):
        a = _old_attention(x, layer, c["kv"][i], c["ctx"])
        m_attn, m_post, m_next = mod[:, 2 * i], mod[:, 2 * i + 1], mod[:, 2 * i + 2]
        h, x = dispatch.linear_gated_ada_rms_norm(a, layer.o_w, h, m_attn[:, 2], m_post[:, 0], m_post[:, 1], eps)
        h, x = dispatch.linear_gated_ada_rms_norm(dispatch.linear_geglu(x, layer.gate_up_w), layer.down_w, h,
                                                  m_post[:, 2], m_next[:, 0], m_next[:, 1], eps)
    return ops.linear(x.to(torch.float32), m.action_out_w, m.action_out_b)


def old_pi0_velocity(m, c, t):
    """pi0's expert loop as it was written before the expert_stack op (the oracle)."""
    eps = m.cfg.expert.rms_eps
    h = m.embed_suffix(c["x_t"], c["state"], m.time_bias(torch.tensor(t))).to(m.dtype)
    layers = m.expert_layers
    x = dispatch.rms_norm(h, layers[0].in_norm_w, eps)
    for i, layer in enumerate(layers):
        a = _old_attention(x, layer, c["kv"][i], c["ctx"])
        x, h = dispatch.linear_add_rms_norm(a, layer.o_w, h, layer.post_norm_w, eps)
        mm = dispatch.linear_geglu(x, layer.gate_up_w)
        if i + 1 < len(layers):
            x, h = dispatch.linear_add_rms_norm(mm, layer.down_w, h, layers[i + 1].in_norm_w, eps)
        else:
            h = h + dispatch.linear(mm, layer.down_w)
    x = dispatch.rms_norm(h[:, -m.cfg.chunk_size:], m.final_norm_w, eps)
    return ops.linear(x.to(torch.float32), m.action_out_w, m.action_out_b)


def _old_attention(x, layer, kv, ctx):
    qkv = dispatch.linear(x, layer.qkv_w)
    a = dispatch.rope_attention_with_prefix(qkv, ctx.cos, ctx.sin, *kv, ctx.mask)
    b, h, t, d = a.shape
    return a.transpose(1, 2).reshape(b, t, h * d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("policy,t", [("pi05", (0.7,)), ("pi05", (0.7, 0.2)), ("pi0", (0.4,))])
def test_the_reference_is_the_old_per_op_path_bitwise(policy, t, dtype):
    m, c = case(policy, dtype)
    old = (old_pi05_velocity if policy == "pi05" else old_pi0_velocity)(m, c, t)
    assert torch.equal(velocity(m, c, t), old)
    assert dispatch.SELECTOR.choose("expert_stack", "k", torch.device("cpu")).name == "unfused"


# ----------------------------------------------------------------------------- fused forms through the models
def forcing(name: str) -> OperatorSelector:
    """A selector forced to candidate ``name`` of expert_stack, made usable on the CPU (the interpreter) and for
    any number of rows."""
    cands = [dataclasses.replace(c, devices=("cpu", "cuda"), supports=fits) if c.name == name else c
             for c in dispatch.SELECTOR.candidates["expert_stack"]]
    return OperatorSelector(candidates={**dispatch.SELECTOR.candidates, "expert_stack": cands}, forced=name)


@needs_interpreter
@pytest.mark.parametrize("name", FORMS)
@pytest.mark.parametrize("policy,t", [("pi05", (0.7,)), ("pi05", (0.7, 0.2)), ("pi0", (0.4,))])
def test_fused_forms_give_the_reference_velocity(policy, t, name):
    """fp32: the fused stack through denoise_velocity equals the per-op path within fp32 rounding (pi0.5 with
    one modulation for the batch and one per item; pi0 with its state token's own mask row)."""
    m, c = case(policy)
    want = velocity(m, c, t)
    calls = []
    sel = forcing(name)
    real = sel.call

    def spy(op, *a, **kw):
        calls.append((op, sel.choose(op, a[0], a[1], a[2:]).name))
        return real(op, *a, **kw)

    sel.call = spy
    with sel.active():
        got = velocity(m, c, t)
    assert ("expert_stack", name) in calls and not sel.disabled
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@needs_interpreter
def test_training_time_rtc_runs_the_reference():
    """Modulation per token (training-time RTC) is not what the kernels take: even a forced fused form falls
    back to the per-op path, bit for bit."""
    m, c = case("pi05")
    mod = m.time_modulation(torch.tensor([0.7, 0.3]))                    # [2, 5, 3, W]
    per_token = mod[:, :, :, None].expand(-1, -1, -1, H, -1).clone()     # [B, 5, 3, H, W]
    per_token[:, :, :, 0] = m.time_modulation(torch.tensor([0.0, 0.0]))  # the frozen action's t = 0
    want = m.denoise_velocity(c["x_t"], c["kv"], ctx=c["ctx"], modulation=per_token)
    with forcing("kernels").active():
        got = m.denoise_velocity(c["x_t"], c["kv"], ctx=c["ctx"], modulation=per_token)
    assert torch.equal(got, want)


def test_fused_forms_decline_what_the_kernels_cannot_take(monkeypatch):
    from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme
    m, c = case("pi05")
    h = torch.zeros(B, H, 64)
    mod = m.time_modulation(torch.tensor([0.7]))
    norms = ExpertNorms(mod=mod[:, :, :, None])
    layers, kv, ctx = m.expert_layers, c["kv"], c["ctx"]
    assert fits(h, layers, kv, ctx, norms, 1e-6)
    assert not fits(h, layers, kv, ctx, norms, 1e-6, max_rows=B * H - 1)      # the wide form's row range
    per_token = ExpertNorms(mod=mod[:, :, :, None].expand(-1, -1, -1, H, -1))
    assert per_token.per_token and not fits(h, layers, kv, ctx, per_token, 1e-6)
    assert not fits(h.bfloat16(), layers, kv, ctx, norms, 1e-6)              # weights of another dtype
    assert not fits(h, layers[:1], kv, ctx, norms, 1e-6)                     # norms of a deeper stack
    quantized = copy.deepcopy(layers)
    quantized[0].qkv_w = QuantizedWeight.from_float(layers[0].qkv_w, QuantScheme.make("w8a16"))
    assert not fits(h, quantized, kv, ctx, norms, 1e-6)                      # the quantized twin ops' job
    small = [tuple(t[..., :16] for t in p) for p in kv]                       # head_dim 16: no RoPE pairs
    assert not fits(h, layers, small, ctx, norms, 1e-6)
    cuda = torch.device("cuda")
    names = [cand.name for cand in dispatch.SELECTOR.candidates["expert_stack"]]
    assert names[-1] == "unfused" and names[0] == "kernels"
    # every fused form is profiled-only (slower than today's path on the H200: docs/benchmarks.md, issue 21)
    assert [cand.name for cand in dispatch.SELECTOR.candidates["expert_stack"] if not cand.profiled_only] == \
        ["unfused"]
    args = (h, layers, kv, ctx, norms, 1e-6)
    if common.HAVE_TRITON:   # the reference by default; a profile naming a fused form that takes the rows, that one
        from phyai_ros.layers import selector   # a CPU-only torch here: no CUDA queries
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        monkeypatch.setattr(selector, "device_signature", lambda device: "cuda:test")
        assert dispatch.SELECTOR.choose("expert_stack", "k", cuda, args).name == "unfused"
        profiled = dispatch.SELECTOR.derive()
        profiled.profile["cuda:test"] = {"expert_stack": {"k": "kernels"}}
        assert profiled.choose("expert_stack", "k", cuda, args).name == "kernels"
        wide = (torch.zeros(B, 40, 64), layers, kv, ctx._replace(cos=torch.zeros(B, 40, 32)), norms, 1e-6)
        assert profiled.choose("expert_stack", "k", cuda, wide).name == "unfused"   # more rows than it takes
