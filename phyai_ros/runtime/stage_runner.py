"""The observation runner: static buffers per shape bucket, per-observation state and CUDA-graph replay for
policies whose inference is "encode the observation once, then a fixed-step loop" (GR00T N1.7 and MiniCPM-Robot).

Ownership as for every runner (phyai_ros/runtime/runner.py): the model object (its stage functions) says *what* to compute, the runner owns *how*: one
bucket per observation shape (batch, token length, image grid, ...), holding static input buffers, the step
tables of its batch size, the loop's noise / RTC buffers, and three captured graphs (backbone, per-observation
context, the whole loop with native RTC inside). The prompt's length varies with the task, so the buckets are
bounded: at most ``max_buckets`` (MAX_BUCKETS), the least recently used evicted with its graphs (a bucket made
again is captured again). On the CPU, or with graphs off, the same stage functions run
eagerly on the same buffers, so both paths compute the same thing.

The model object provides (phyai_ros/models/groot_n17/modeling.py)::

    observation(inputs) -> {name: tensor}     host side: everything data-dependent, as fixed-shape tensors
    batch_size(obs) -> int;  noise_shape(batch) -> shape;  step_tables(batch) -> per-step constants
    solver_tensors(rtc, batch) -> (seed, keep, weight)    the loop's RTC inputs (the model's own RTC request;
                                                          RTC off: rtc=None)
    backbone(obs) -> features;  context(obs, features) -> ctx       once per observation (capture-safe)
    loop(ctx, tables, noise, seed, keep, weight) -> actions             once per chunk (capture-safe)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from phyai_ros.runtime.graphs import CapturedCall
from phyai_ros.runtime.runner import MAX_BUCKETS, Runner

Tensor = torch.Tensor


@dataclass
class _Bucket:
    """Static buffers of one observation shape, its step tables and its graphs."""

    key: tuple
    obs: Dict[str, Tensor]
    tables: list
    noise: Tensor
    seed: Tensor
    keep: Tensor
    weight: Tensor
    backbone: Optional[CapturedCall] = None
    context: Optional[CapturedCall] = None
    loop: Optional[CapturedCall] = None
    observation_for: Optional[int] = None   # id of the observation the context holds, None = invalid


class StageRunner(Runner):
    """Runs backbone + context once per observation and the captured loop once per chunk, on one device."""

    stages = ("backbone", "context", "loop")

    def __init__(self, model, use_graphs: bool = True, max_buckets: int = MAX_BUCKETS):
        super().__init__(model.device, use_graphs, max_buckets)
        self.model = model

    @staticmethod
    def bucket_key(obs: Dict[str, Tensor]) -> tuple:
        """Every observation tensor's name, shape and dtype: one graph set per distinct key."""
        return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(obs.items()))

    def _bucket(self, obs: Dict[str, Tensor]) -> _Bucket:
        key = self.bucket_key(obs)
        b = self._buckets.get(key)
        if b is None:
            batch = self.model.batch_size(obs)
            seed, keep, weight = self.model.solver_tensors(None, batch)
            b = _Bucket(key, {k: torch.empty_like(v, device=self.device) for k, v in obs.items()},
                        self.model.step_tables(batch),
                        torch.zeros(self.model.noise_shape(batch), device=self.device, dtype=torch.float32),
                        seed.clone(), keep.clone(), weight.clone())
            self._buckets.add(key, b)
        return b

    # ---------------------------------------------------------------- execution
    @torch.no_grad()
    def set_observation(self, obs: Dict[str, Tensor]) -> _Bucket:
        """Copy a new observation (model.observation's tensors) into its bucket and compute its context
        (backbone + context stages), invalidating the one held before."""
        b = self._bucket(obs)
        b.observation_for = None
        for k, v in obs.items():
            b.obs[k].copy_(v, non_blocking=True)
        b.backbone = self.run_stage(b.key, "backbone", self.model.backbone, (b.obs,), b.backbone)
        b.context = self.run_stage(b.key, "context", self.model.context, (b.obs, b.backbone.outputs), b.context)
        b.observation_for = self.new_observation()
        return b

    @torch.no_grad()
    def sample(self, bucket: _Bucket, noise: Tensor, rtc=None) -> Tensor:
        """Run the loop from ``noise`` against the bucket's context; rtc: the model's RTC request or None.

        The returned tensor is the bucket's static output under graphs: the next call overwrites it.
        """
        if bucket.observation_for is None:
            raise RuntimeError("the observation context is invalid: call set_observation() for the new observation first")
        batch = bucket.noise.shape[0]
        for buf, value in zip((bucket.seed, bucket.keep, bucket.weight), self.model.solver_tensors(rtc, batch)):
            buf.copy_(value, non_blocking=True)
        bucket.noise.copy_(noise, non_blocking=True)
        args = (bucket.context.outputs, bucket.tables, bucket.noise, bucket.seed, bucket.keep, bucket.weight)
        if not self.use_graphs:
            return self.model.loop(*args)
        bucket.loop = self.run_stage(bucket.key, "loop", self.model.loop, args, bucket.loop)
        return bucket.loop.outputs

    def run(self, obs: Dict[str, Tensor], noise: Tensor, rtc=None) -> Tensor:
        """One chunk for a new observation: set_observation, then sample."""
        return self.sample(self.set_observation(obs), noise, rtc)
