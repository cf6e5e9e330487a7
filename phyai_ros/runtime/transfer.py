"""Host -> device copies that do not stall the GPU stream.

A copy from pageable host memory is synchronous for the host, and the driver first waits for the stream's
queued work (CUDA's documented behaviour for pageable host-to-device copies). In a preprocessing sequence
(upload a frame, resize it, upload the next one, ...) every upload then waits for every kernel queued before
it, so host and device work run one after the other. Staged through pinned memory the copy is queued like a
kernel. The staging blocks come from PyTorch's caching host allocator, which reuses a block only once the copy
that read it has finished, so a block is never overwritten while in flight.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

Tensor = torch.Tensor


def _pinned(shape, np_dtype) -> Tensor:
    """A pinned host block (the caching host allocator's) of numpy dtype ``np_dtype``."""
    return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, np_dtype)).dtype, pin_memory=True)


def to_device(x, device, dtype: Optional[torch.dtype] = None) -> Tensor:
    """numpy array or tensor -> tensor on ``device`` (cast to ``dtype`` there when given). To a CUDA device from
    the host it goes through a pinned staging block and returns before the copy has run; the source may be a
    read-only or strided numpy view (the staging copy makes it contiguous). On the CPU a writable contiguous
    array is shared, not copied (a read-only or strided one is copied)."""
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
        a = np.asarray(x)
        staged = _pinned(a.shape, a.dtype)
        staged.numpy()[...] = a
    out = staged.to(device, non_blocking=True)
    return out if dtype is None else out.to(dtype)


def stack_to_device(items: Sequence, device) -> Tensor:
    """Arrays (or tensors) of one shape and dtype -> one tensor [len(items), *shape] on ``device``: on the host
    they are written straight into one pinned staging block and go over in one copy (one upload for all of a
    robot's same-size cameras instead of one each)."""
    device = torch.device(device)
    if device.type != "cuda" or any(isinstance(x, Tensor) for x in items):
        return torch.stack([to_device(x, device) for x in items])
    arrays = [np.asarray(x) for x in items]
    staged = _pinned((len(arrays), *arrays[0].shape), arrays[0].dtype)
    view = staged.numpy()
    for i, a in enumerate(arrays):
        view[i] = a
    return staged.to(device, non_blocking=True)
