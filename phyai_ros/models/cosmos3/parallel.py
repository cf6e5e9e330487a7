"""Cosmos3's parallel degrees over torch.distributed (gloo on the CPU, NCCL on GPUs): classifier-free-guidance
parallel x tensor parallel. Data parallel is the serving path's replicas, not this.

Ranks form a grid world = cfg x tp, rank = cfg_rank * tp + tp_rank:
- CFG-parallel (cfg = 2): the conditional pass runs on cfg_rank 0, the unconditional one on cfg_rank 1; after
  every step's transformer call the velocities are all-gathered over the CFG group, so every rank applies the
  same guidance and the same UniPC step to the same latents (which therefore stay equal on every rank).
- Tensor-parallel (tp > 1): each rank holds its slice of the attention heads and MLP columns of both pathways
  (transformer.shard_weights); the output projections' partial sums are all-reduced over the TP group.
Every collective here is capture-safe under NCCL (fixed shapes, no host sync).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


@dataclass
class Parallel:
    """This rank's place in the cfg x tp grid and its process groups (None on one device)."""

    cfg_size: int = 1
    tp_size: int = 1
    cfg_rank: int = 0
    tp_rank: int = 0
    cfg_group: object = None
    tp_group: object = None
    world_group: object = None

    @property
    def distributed(self) -> bool:
        return self.cfg_size * self.tp_size > 1

    def passes(self, cfg_on: bool) -> Tuple[str, ...]:
        """Which guidance passes this rank computes: ("cond", "uncond") on one CFG rank, one of them each on two."""
        if self.cfg_size == 1:
            return ("cond", "uncond") if cfg_on else ("cond",)
        if not cfg_on:
            raise ValueError("CFG-parallel needs classifier-free guidance (guidance != 1: the unconditional pass "
                             "is skipped at guidance 1, leaving the second CFG rank nothing to do)")
        return (("cond",), ("uncond",))[self.cfg_rank]

    def reduce(self, x: Tensor) -> Tensor:
        """Sum of the tensor-parallel partial outputs (identity without TP)."""
        if self.tp_size > 1:
            import torch.distributed as dist
            dist.all_reduce(x, group=self.tp_group)
        return x

    def gather_passes(self, x: Tensor) -> Tensor:
        """[R, ...] of this CFG rank -> [cfg * R, ...] in CFG-rank order (cond rows first)."""
        if self.cfg_size == 1:
            return x
        import torch.distributed as dist
        out = x.new_empty((self.cfg_size * x.shape[0], *x.shape[1:]))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # renamed in torch 2.13
        gather(out, x.contiguous(), group=self.cfg_group)
        return out

    def broadcast(self, x: Tensor) -> Tensor:
        """Make x equal on every rank (rank 0's): the VAE's latent, computed on each rank, must not differ by a
        nondeterministic kernel before ranks start to combine their work."""
        if self.distributed:
            import torch.distributed as dist
            dist.broadcast(x, src=0, group=self.world_group)
        return x

    @classmethod
    def from_world(cls, cfg_size: int = 1, tp_size: Optional[int] = None) -> "Parallel":
        """The grid over the initialized default process group (every rank must call this, in the same order:
        it creates the groups). tp_size defaults to world / cfg_size."""
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (init_process_group first)")
        world, rank = dist.get_world_size(), dist.get_rank()
        if cfg_size not in (1, 2):
            raise ValueError(f"CFG-parallel degree must be 1 or 2, got {cfg_size}")
        tp_size = world // cfg_size if tp_size is None else tp_size
        if cfg_size * tp_size != world:
            raise ValueError(f"cfg {cfg_size} x tp {tp_size} != world size {world}")
        cfg_groups = [dist.new_group([c * tp_size + t for c in range(cfg_size)]) for t in range(tp_size)]
        tp_groups = [dist.new_group([c * tp_size + t for t in range(tp_size)]) for c in range(cfg_size)]
        cfg_rank, tp_rank = divmod(rank, tp_size)
        return cls(cfg_size, tp_size, cfg_rank, tp_rank, cfg_groups[tp_rank], tp_groups[cfg_rank], dist.group.WORLD)


SINGLE = Parallel()

__all__ = ["Parallel", "SINGLE"]
