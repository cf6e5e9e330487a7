"""Quantized execution on a CUDA device (``gpu`` marker; skipped without CUDA): the quantized kernels at pi0.5's
production shapes in bf16, the fp8 tensor-core path, capture in CUDA graphs, and a full-size quantized model
through the runner's graphs against its eager run.

Tolerances: the kernels dequantize exactly (8-bit and int4 values and fp8 activations are exact in bf16) and
sum in fp32, so against the fp32 reference on the same quantized values the error is the bf16 rounding of the
activations' products plus one rounding of the output: relative norm error <= 1e-2 (one bf16 rounding alone
gives ~3e-3). The fp8 GEMM (cuBLASLt) sums in its own order: same bound.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu

from phyai_ros.kernels import quant_linear as ql  # noqa: E402
from phyai_ros.layers import dispatch  # noqa: E402
from phyai_ros.layers.quant_dispatch import QUANT_REGISTRY, _scaled_mm_qlinear  # noqa: E402
from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme  # noqa: E402
from phyai_ros.layers.selector import SELECTOR, OperatorSelector  # noqa: E402

SCHEMES = {"w8a16-int8": QuantScheme.make("w8a16"), "w8a16-fp8": QuantScheme.make("w8a16", "fp8"),
           "w8a8": QuantScheme.make("w8a8"), "w4a16": QuantScheme.make("w4a16")}
# pi0.5's expert GEMMs at batch 1 (N, K): qkv, o, gate_up, down
EXPERT = [(2560, 1024), (1024, 2048), (8192, 1024), (1024, 4096)]


def _rand(*shape, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda") * scale


def _rel(a, ref):
    a, ref = a.float(), ref.float()
    return ((a - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("nk", EXPERT)
def test_quantized_skinny_kernels_at_expert_shapes(scheme, nk):
    n, k = nk
    qw = QuantizedWeight.from_float(_rand(n, k, scale=0.02), SCHEMES[scheme])
    x = _rand(1, 50, k).bfloat16()
    ref = ql.quant_linear_ref(x, qw.q, qw.scale, qw.group, qw.act_quant)
    for name, tiling in (("default", {}), ("n32_s1", {"block_n": 32, "splits": 1}), ("n16_k256", {"block_n": 16,
                                                                                                  "block_k": 256})):
        y = ql.quant_linear(x, qw.q, qw.scale, qw.group, qw.act_quant, **tiling)
        assert y.dtype == torch.bfloat16 and y.shape == (1, 50, n)
        assert _rel(y, ref) < 1e-2, name
    # fp32 activations: the kernel's fp32 dots match the reference to fp32 rounding
    x32 = x.float()
    torch.testing.assert_close(ql.quant_linear(x32, qw.q, qw.scale, qw.group, qw.act_quant),
                               ql.quant_linear_ref(x32, qw.q, qw.scale, qw.group, qw.act_quant), rtol=1e-4, atol=1e-4)


def test_activation_rows_and_scaled_mm_at_prefix_shapes():
    """The prefix's GEMMs (968 tokens) on fp8 tensor cores: activations quantized by the row kernel exactly as
    the reference, the product as the reference within the bf16 bound."""
    x = _rand(968, 2048).bfloat16()
    xq, xs = ql.quantize_rows(x)
    ref_q, ref_s = ql.quantize_activations_ref(x)
    assert torch.equal(xs, ref_s) and torch.equal(xq.float(), ref_q)
    for n, k in ((2560, 2048), (32768, 2048), (2048, 16384)):
        qw = QuantizedWeight.from_float(_rand(n, k, scale=0.02, seed=n), SCHEMES["w8a8"])
        xx = _rand(968, k, seed=k).bfloat16()
        ref = ql.quant_linear_ref(xx, qw.q, qw.scale, 0, "dynamic")
        assert _rel(_scaled_mm_qlinear(xx, qw), ref) < 1e-2
        bias = _rand(n, seed=3).bfloat16()
        assert _rel(_scaled_mm_qlinear(xx, qw, bias), ref + bias.float()) < 1e-2


def test_quantized_ops_capture_in_a_cuda_graph():
    """One pi0.5 expert layer's quantized ops (skinny GEMMs with their epilogues) replayed on fresh inputs."""
    w = {nm: QuantizedWeight.from_float(_rand(n, k, scale=0.02, seed=i), SCHEMES["w8a16-int8"])
         for i, (nm, (n, k)) in enumerate(zip(("qkv", "o", "gate_up", "down"), EXPERT))}
    x, h = _rand(1, 50, 1024).bfloat16(), _rand(1, 50, 1024).bfloat16()
    a = _rand(1, 50, 2048).bfloat16()
    gate, scale, shift = (_rand(1, 1, 1024, seed=s) for s in (5, 6, 7))
    sel = OperatorSelector(candidates=SELECTOR.candidates)

    def layer():
        qkv = dispatch.linear(x, w["qkv"])
        h2, x2 = dispatch.linear_gated_ada_rms_norm(a, w["o"], h, gate, scale, shift, 1e-6)
        m = dispatch.linear_geglu(x2, w["gate_up"])
        return qkv, dispatch.linear_gated_ada_rms_norm(m, w["down"], h2, gate, scale, shift, 1e-6)

    with sel.active():
        eager = layer()
        chosen = sel.choose("qlinear_geglu", "k", x.device, (x, w["gate_up"]))
        assert chosen.name.startswith("triton"), chosen.name   # the fused quantized kernel, not the fallback
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            layer()   # warm-up outside capture (compiles the kernels)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer()
    for seed in range(3):
        for t, s in ((x, 10), (h, 11), (a, 12)):
            t.copy_(_rand(*t.shape, seed=seed * 10 + s).bfloat16())
        graph.replay()
        with sel.active():
            want = layer()
        torch.testing.assert_close(out[0], want[0], rtol=0, atol=0)
        for g, e in zip(out[1], want[1]):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert all(bool(torch.isfinite(t).all()) for t in (eager[0], *eager[1]))


def test_every_quantized_op_has_a_cuda_candidate():
    for op, cands in QUANT_REGISTRY.items():
        assert any("cuda" in c.devices and c.name != cands[-1].name for c in cands), op


@pytest.mark.parametrize("scheme", ["w8a16-int8", "w8a8", "w4a16"])
def test_full_size_quantized_pi05_graphs_match_eager(scheme):
    """The full pi0.5 with quantized parts through the runner's CUDA graphs equals its eager run (same kernels,
    same inputs), and stays near the bf16 model."""
    from phyai_ros.models.pi.pi05 import Pi05Config
    from phyai_ros.models.pi.pi05.checkpoint import lerobot_key_shapes, load_state_dict
    from phyai_ros.models.pi.pi05.modeling import Pi05Model
    from phyai_ros.models.pi.quantization import quantize_model
    from phyai_ros.models.quantized_checkpoint import DEFAULT_PARTS
    from phyai_ros.models.pi.runner import FlowRunner
    cfg = Pi05Config()
    model = Pi05Model(cfg, torch.bfloat16, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    load_state_dict(model, {k: torch.randn(s, generator=g, device="cuda") * 0.02
                            for k, s in sorted(lerobot_key_shapes(cfg).items())})
    images = torch.rand(1, 3, 3, 224, 224, generator=g, device="cuda") * 2 - 1
    masks = torch.ones(1, 3, dtype=torch.bool, device="cuda")
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.token_budget), generator=g, device="cuda")
    tmask = torch.zeros(1, cfg.token_budget, dtype=torch.bool, device="cuda")
    tmask[:, :30] = True
    noise = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=g, device="cuda")

    def run(m, graphs):
        r = FlowRunner(m, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=graphs)
        return r.sample(r.set_observation(images, masks, tokens, tmask), noise).float().clone()

    with torch.no_grad():
        ref = run(model, False)
        s = SCHEMES[scheme]
        quantize_model(model, s, DEFAULT_PARTS[s.name])
        eager = run(model, False)
        graphed = run(model, True)
    assert torch.isfinite(graphed).all()
    assert (graphed - eager).abs().max().item() <= 1e-6 * max(1.0, eager.abs().max().item()) or \
        _rel(graphed, eager) < 1e-3
    bound = {"w8a16-int8": 0.02, "w8a8": 0.05, "w4a16": 0.15}[scheme]
    assert (eager - ref).abs().max().item() / ref.abs().max().item() < bound


@pytest.mark.parametrize("scheme", [["w8a16"], ["w8a8", "--parts", "vision,prefix,expert"]])
def test_groot_quantized_runner_graphs_match_eager(tmp_path, scheme):
    """A quantized GR00T N1.7 fixture checkpoint in bf16 on the GPU: its DiT's few-row GEMMs with bias and
    GELU / LayerNorm epilogues on the quantized kernels, the observation runner's CUDA graphs equal to its eager
    run, and the actions near the float model's."""
    from fixture_sets import groot_fixture_dir, load_groot_fixture
    from phyai_ros.models.groot_n17 import GrootAdapter
    from phyai_ros.quant.__main__ import main as quantize
    from phyai_ros.runtime.stage_runner import StageRunner
    g = groot_fixture_dir()
    if not (g / "checkpoint").is_dir():
        pytest.skip("no GR00T N1.7 fixture")
    fx = load_groot_fixture(g)
    assert quantize(["--checkpoint", str(g / "checkpoint"), "--output", str(tmp_path / "q"), "--scheme", *scheme,
                     "--device", "cuda"]) == 0
    outs = {}
    for name, folder in (("float", g / "checkpoint"), ("quantized", tmp_path / "q")):
        pol = GrootAdapter.from_files(folder, device="cuda", dtype=torch.bfloat16, resize_mode="float")
        x = pol.prepare(fx["images"], fx["inp"]["raw.observation.state"], fx["meta"]["tasks"],
                        fx["inp"]["embodiment_id"].tolist())
        for graphs in (False, True):
            runner = StageRunner(pol.model, use_graphs=graphs)
            outs[name, graphs] = runner.run(runner.model.observation(x), fx["inp"]["noise"].cuda()).float().clone()
    q_eager, q_graph, ref = outs["quantized", False], outs["quantized", True], outs["float", False]
    assert torch.isfinite(q_graph).all()
    assert _rel(q_graph, q_eager) < 1e-3
    assert (q_eager - ref).abs().max().item() / ref.abs().max().item() < 0.1
