"""The L2 prefetch on a CUDA device (``gpu`` marker): every mode runs on tensors of any size, eagerly and from a
side branch of a captured CUDA graph, and the prefetching expert stack computes exactly what the reference does
(a prefetch moves no value: bit for bit, eager and replayed on fresh inputs). Whether it is faster is the
benchmark's question (scripts/bench_expert_layer.py), not a test's."""
import types

import pytest
import torch

from phyai_ros.kernels.candidates import l2_prefetch as kl2
from phyai_ros.layers import expert_stack as xs
from phyai_ros.layers import prefetch_branch as branch
from phyai_ros.models.pi.modeling.suffix import SuffixContext

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_expert_layer_gpu import inputs  # noqa: E402

MODES = [m for m in kl2.MODES if kl2.mode_supported(m, torch.device("cuda"))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("programs", [1, 3, 64])
def test_prefetch_runs_on_any_sizes(mode, programs):
    ts = [torch.randn(n, device="cuda") for n in (1, 33, 4096, 3 * 16384 + 5)]
    ts.append(torch.randn(1000, 7, device="cuda", dtype=torch.bfloat16))
    before = [t.clone() for t in ts]
    for seg in (128, 64 * 1024, 1 << 20):
        kl2.l2_prefetch(kl2.segment_table(ts, seg), programs=programs, mode=mode)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(ts, before))


def _stack_call(model, batch, seed):
    c = inputs(model, batch, seed)
    layers = [types.SimpleNamespace(qkv_w=q, o_w=o, gate_up_w=gu, down_w=dn)
              for q, o, gu, dn in zip(c["qkv_w"], c["o_w"], c["gate_up_w"], c["down_w"])]
    return c, (c["h"], layers, list(zip(c["k_prefix"], c["v_prefix"])), SuffixContext(c["mask"], c["cos"], c["sin"]),
               c["norms"], 1e-6)


@pytest.mark.parametrize("name,plan,reach", [f for f in xs.PREFETCH_FORMS if f[1].mode in MODES])
@pytest.mark.parametrize("model,batch", [("pi05", 1), ("pi0", 1), ("pi05", 32)])
def test_prefetching_stack_equals_the_reference_bitwise(name, plan, reach, model, batch):
    static, args = _stack_call(model, batch, seed=3)
    assert xs.prefetch_fits(*args, plan=plan)
    want = xs.unfused(*args)
    got = xs.unfused(*args, prefetch=plan, reach=reach)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                  # the side branch forks and joins inside the capture
        out = xs.unfused(*args, prefetch=plan, reach=reach)
    for rep in range(3):
        fresh, _ = _stack_call(model, batch, seed=50 + rep)
        static["h"].copy_(fresh["h"])
        for dst, src in zip(static["k_prefix"] + static["v_prefix"], fresh["k_prefix"] + fresh["v_prefix"]):
            dst.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        ref = xs.unfused(*args)
        torch.cuda.synchronize()
        assert torch.equal(out, ref), rep
    side = branch.side_stream(static["h"].device)
    assert side.query()                        # joined: nothing left pending on the side stream
