"""kernels/gated_delta_prep.py against its torch references: Triton's interpreter on the CPU (CI), the device
on CUDA (gpu marker). Shapes: the released LM's heads (16 x 128), more V than K heads, fewer tokens than the conv
kernel, batch 2, bf16 and fp32 operands, z a strided view into the projection as the layer passes it."""
import pytest
import torch

from phyai_ros.kernels import gated_delta_prep as prep
from phyai_ros.kernels.common import interpret_mode

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else ["cpu"]
SHAPES = [(1, 20, 16, 16, 128, 128), (2, 3, 1, 3, 6, 10), (1, 130, 2, 2, 8, 8)]   # B, S, hk, hv, dk, dv


def _inputs(b, s, hk, hv, dk, dv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    conv = 2 * hk * dk + hv * dv
    proj = torch.randn(b, s, conv + hv * dv + 2 * hv, generator=gen).to(device, dtype)
    w = (torch.randn(conv, 1, 4, generator=gen) * 0.5).to(device, dtype)
    a_log = torch.randn(hv, generator=gen).to(device, dtype)
    dt_bias = torch.randn(hv, generator=gen).to(device, dtype)
    return proj, w, a_log, dt_bias


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cpu" and not (prep.available() and interpret_mode()):
        pytest.skip("CPU tensors run through Triton's interpreter only (TRITON_INTERPRET=1)")
    return request.param


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_qkv_gates_matches_torch(device, shape, dtype):
    b, s, hk, hv, dk, dv = shape
    args = _inputs(*shape, dtype, device)
    fused = prep.conv_qkv_gates(*args, hk, hv, dk, dv)
    # the reference on float32 copies of the same operands: the kernel computes in float32 from them
    ref = prep.conv_qkv_gates_ref(*(a.float() for a in args), hk, hv, dk, dv)
    for name, got, want in zip(("q", "k", "v", "beta", "g"), fused, ref):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        tol = 1e-5 * max(1.0, want.abs().max().item())
        assert (got.cpu() - want.cpu()).abs().max().item() <= tol, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_torch(device, dtype):
    b, s, h, d = 2, 9, 3, 128
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(b, s, h, d, generator=gen).to(device)
    proj = torch.randn(b, s, 5 * h * d, generator=gen).to(device, dtype)
    z = proj[..., 2 * h * d:3 * h * d]                 # a strided view, as the layer passes it
    w = torch.randn(d, generator=gen).to(device, dtype)
    got = prep.gated_rms_norm(x, z, w, 1e-6, dtype)
    want = prep.gated_rms_norm_ref(x, z.float(), w.float(), 1e-6, torch.float32)
    assert got.dtype == dtype and got.shape == (b, s, h * d)
    tol = (1e-5 if dtype == torch.float32 else 1e-2) * max(1.0, want.abs().max().item())
    assert (got.float().cpu() - want.cpu()).abs().max().item() <= tol
