"""Host -> device copies that do not stall the GPU stream.

A copy from pageable host memory is synchronous for the host, and the driver first waits for the stream's
queued work (CUDA's documented behaviour for pageable host-to-device copies). In a preprocessing sequence
(upload a frame, resize it, upload the next one, ...) every upload then waits for every kernel queued before
it, so host and device work run one after the other. Staged through pinned memory the copy is queued like a
kernel. The staging blocks come from PyTorch's caching host allocator, which reuses a block only once the copy
that read it has finished, so a block is never overwritten while in flight.

The staging copy itself is host time before the first kernel (a robot's three 480x640 frames: ~0.6 ms on the
H200 machine's host). A frame that already lives in such a block (``PinnedArray``, made by ``pinned_array`` where
the frame arrives, e.g. the node's camera callback) goes over as it is: no staging copy on the chunk's path.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

Tensor = torch.Tensor


class PinnedArray(np.ndarray):
    """A numpy array in a page-locked block of PyTorch's caching host allocator (``block``): uploads read it in
    place. Views keep the block (``__array_finalize__``); only one covering the whole block uploads in place,
    anything else is staged as an ordinary array. Never written after it is made (frames are read-only), so an
    upload in flight cannot see it change; the block goes back to the allocator once the array and its last
    copy are done."""

    block: Optional[Tensor]

    def __array_finalize__(self, obj) -> None:
        self.block = getattr(obj, "block", None)


def pinned_array(a) -> np.ndarray:
    """A read-only copy of ``a`` in a pinned block (a ``PinnedArray``) where CUDA is available; ``a`` itself elsewhere
    (a CPU policy has nothing to upload). The copy happens here, off the chunk's path."""
    if not torch.cuda.is_available():
        return a
    a = np.asarray(a)
    block = _pinned(a.shape, a.dtype)
    out = block.numpy().view(PinnedArray)
    out.block = block
    out[...] = a
    out.flags.writeable = False
    return out


def _in_place(a) -> Optional[Tensor]:
    """The pinned tensor that is exactly ``a``'s memory (``a`` a contiguous PinnedArray over its whole block, in any
    shape), or None."""
    block = getattr(a, "block", None)
    if block is None or not a.flags.c_contiguous or a.nbytes != block.nbytes \
            or a.__array_interface__["data"][0] != block.data_ptr():
        return None
    return block.view(a.shape)


def _pinned(shape, np_dtype) -> Tensor:
    """A pinned host block (the caching host allocator's) of numpy dtype ``np_dtype``."""
    return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, np_dtype)).dtype, pin_memory=True)


def to_device(x, device, dtype: Optional[torch.dtype] = None) -> Tensor:
    """numpy array or tensor -> tensor on ``device`` (cast to ``dtype`` there when given). To a CUDA device from
    the host it goes through a pinned staging block (a ``PinnedArray`` over its whole block goes over in place) and
    returns before the copy has run; the source may be a read-only or strided numpy view (the staging copy makes it
    contiguous). On the CPU a writable contiguous array is shared, not copied (a read-only or strided one is
    copied)."""
    device = torch.device(device)
    if isinstance(x, Tensor) and x.device.type != "cpu":
        return x.to(device, dtype)
    if device.type != "cuda":
        if not isinstance(x, Tensor):
            a = np.ascontiguousarray(x)
            x = torch.from_numpy(a if a.flags.writeable else a.copy())
        return x.to(device, dtype)
    if isinstance(x, Tensor):
        staged = x if x.is_pinned() else x.pin_memory()
    else:
        staged = _in_place(x)
        if staged is None:
            a = np.asarray(x)
            staged = _pinned(a.shape, a.dtype)
            staged.numpy()[...] = a
    out = staged.to(device, non_blocking=True)
    return out if dtype is None else out.to(dtype)


def stack_to_device(items: Sequence, device) -> Tensor:
    """Arrays (or tensors) of one shape and dtype -> one tensor [len(items), *shape] on ``device``: on the host
    they are written straight into one pinned staging block and go over in one copy (one upload for all of a
    robot's same-size cameras instead of one each); pinned frames (``PinnedArray``) go over as they are, one
    copy each into the stacked result."""
    device = torch.device(device)
    if device.type != "cuda" or any(isinstance(x, Tensor) for x in items):
        return torch.stack([to_device(x, device) for x in items])
    in_place = [_in_place(x) for x in items]
    if all(t is not None for t in in_place):
        out = torch.empty((len(items), *in_place[0].shape), dtype=in_place[0].dtype, device=device)
        for i, t in enumerate(in_place):
            out[i].copy_(t, non_blocking=True)
        return out
    arrays = [np.asarray(x) for x in items]
    staged = _pinned((len(arrays), *arrays[0].shape), arrays[0].dtype)
    view = staged.numpy()
    for i, a in enumerate(arrays):
        view[i] = a
    return staged.to(device, non_blocking=True)
