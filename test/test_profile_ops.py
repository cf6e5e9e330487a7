"""The operator profile's timing method (scripts/profile_ops.py) on a CUDA device (``gpu`` marker)."""
import sys

import pytest
import torch

from ros_helpers import REPO

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(REPO / "scripts"))
import profile_ops  # noqa: E402

sys.path.pop(0)


def test_weights_are_timed_out_of_l2():
    """A few-row GEMM's 16 MB weight comes in enough copies that a round through them spans twice the L2, so
    every timed call streams its weight from HBM as in the model; the activation is shared (the producer just
    wrote it), small operands are not copied, and the first set is the recorded call itself."""
    x = torch.randn(1, 51, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    norm = torch.randn(1024, device="cuda")
    args = (x, w, norm, 1e-6)
    sets = profile_ops.cold_arg_sets(args)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert sets[0] is args and len(sets) * w.numel() * 2 >= 2 * l2
    assert len({s[1].data_ptr() for s in sets}) == len(sets) and all(torch.equal(s[1], w) for s in sets)
    assert all(s[0] is x and s[2] is norm for s in sets)
    us = profile_ops.graph_time_us(torch.nn.functional.linear, (x, w))
    assert 0 < us < 1000
