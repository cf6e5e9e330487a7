"""Weights prefetched into L2 on a side branch (kernels/candidates/l2_prefetch.py, layers/prefetch_branch.py): the
host side.

The kernel is inline PTX (no interpreter): it is compiled for sm_90 and Thor by test_kernels_compile.py and run
by test_l2_prefetch_gpu.py. Here: the segment plan covers exactly the bytes asked for, in rows the bulk form can
issue; each layer's attention overlaps the weights read after it; the prefetching forms are profiled-only and
decline what they cannot prefetch.
"""
import types

import pytest
import torch

from phyai_ros.kernels.candidates import l2_prefetch as kl2
from phyai_ros.layers import dispatch
from phyai_ros.layers import expert_stack as xs
from phyai_ros.layers import prefetch_branch as branch


@pytest.mark.parametrize("segment", [128, 4096, 64 * 1024])
def test_segments_cover_every_byte_in_aligned_rows(segment):
    spans = [(1 << 20, 64 * 1024 * 3 + 40), (5 << 20, 16), (7 << 20, 0), ((9 << 20) + 8, 1000), (11 << 20, 1)]
    rows = kl2.segment_rows(spans, segment)
    for addr, nbytes in rows:
        assert addr % 16 == 0 and nbytes % 16 == 0 and 0 < nbytes <= segment
    covered = set()
    for addr, nbytes in rows:
        covered.update(range(addr, addr + nbytes))
    for addr, nbytes in spans:
        assert set(range(addr, addr + nbytes)) <= covered
    # nothing beyond the 16-byte rounding of each span
    allowed = set()
    for addr, nbytes in spans:
        if nbytes:
            allowed.update(range(addr - addr % 16, addr + nbytes + (-(addr + nbytes)) % 16))
    assert covered == allowed
    assert len(rows) == sum(-(-(a + n + (-(a + n)) % 16 - (a - a % 16)) // segment) for a, n in spans if n)


def test_segment_plan_refuses_what_it_cannot_cover():
    with pytest.raises(ValueError, match="multiple of 128"):
        kl2.segment_rows([(0, 10)], 100)
    t = torch.zeros(8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        kl2.segment_table([t.t()])
    with pytest.raises(ValueError, match="nothing"):
        kl2.segment_table([])
    table = kl2.segment_table([t, torch.zeros(3)], 128)
    assert table.dtype == torch.int64 and table.shape == (2 + 1, 2)
    assert int(table[:, 1].sum()) == 256 + 16


def test_modes_need_a_gpu_and_bulk_needs_sm90():
    assert not kl2.mode_supported("bulk", torch.device("cpu"))
    assert not kl2.mode_supported("lines", torch.device("cpu"))
    with pytest.raises(ValueError, match="mode"):
        kl2.mode_supported("dma", torch.device("cpu"))


def _layers(n=3):
    return [types.SimpleNamespace(qkv_w=torch.zeros(6, 4) + i, o_w=torch.zeros(4, 4) + i,
                                  gate_up_w=torch.zeros(8, 4) + i, down_w=torch.zeros(4, 4) + i) for i in range(n)]


def test_each_attention_overlaps_the_weights_read_after_it():
    layers = _layers()
    got = xs.prefetched_weights(layers, 0, "layer")
    assert [id(t) for t in got] == [id(layers[0].o_w), id(layers[0].gate_up_w), id(layers[0].down_w),
                                    id(layers[1].qkv_w)]
    last = xs.prefetched_weights(layers, 2, "layer")       # no layer after the last
    assert [id(t) for t in last] == [id(layers[2].o_w), id(layers[2].gate_up_w), id(layers[2].down_w)]
    assert [id(t) for t in xs.prefetched_weights(layers, 1, "mlp")] == [id(layers[1].gate_up_w),
                                                                        id(layers[1].down_w)]
    with pytest.raises(ValueError, match="reach"):
        xs.prefetched_weights(layers, 0, "all")


def test_the_table_lives_on_its_layer_and_follows_its_weights():
    layer = types.SimpleNamespace()
    ws = [torch.zeros(64), torch.zeros(32)]
    t1 = branch.table_for(layer, ws, 128)
    assert branch.table_for(layer, ws, 128) is t1                     # made once
    moved = [torch.zeros(64), torch.zeros(32)]                        # new storage: a new table
    t2 = branch.table_for(layer, moved, 128)
    assert t2 is not t1 and int(t2[0, 0]) == moved[0].data_ptr() - moved[0].data_ptr() % 16
    assert len(layer._l2_prefetch_tables) == 2


def test_prefetching_forms_are_profiled_only_and_decline_the_cpu():
    cands = {c.name: c for c in dispatch.SELECTOR.candidates["expert_stack"]}
    names = [n for n, _, _ in xs.PREFETCH_FORMS]
    assert set(names) <= set(cands) and list(cands)[-1] == "unfused"
    for n in names:
        assert cands[n].profiled_only and cands[n].devices == ("cuda",)
        args = (torch.zeros(1, 5, 4), _layers(), [], None, xs.ExpertNorms(weights=()), 1e-6)
        assert not cands[n].supports(*args)                          # CPU tensors: nothing to prefetch
    assert not branch.usable([], branch.PrefetchPlan())
