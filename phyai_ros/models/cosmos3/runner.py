"""The Cosmos3 runner: per-observation conditioning kept in static buffers, the whole denoising loop replayed as
one CUDA graph per shape bucket (bounded: graphs.BucketCache).

Ownership as for every runner (phyai_ros/runtime/runner.py): the stage object (phyai_ros/models/cosmos3/stages.py) says what to
compute, the runner owns how: one bucket per observation shape (batch, padded prompt length, canvas and
latent grid, chunk), holding static observation buffers, the conditioning (VAE latent of the conditioning
frame, computed once per observation by `set_observation`; the text pathway's keys / values of every guidance
pass, computed again only when the prompt rows change: a robot keeps its instruction for many chunks) and the
noise buffers of the loop. Three graphs per bucket: text, conditioning (reading the text graph's outputs) and
loop. On the CPU, with graphs off, or when a trace of intermediates is asked for, the same stage functions run
eagerly on the same buffers, so every path computes the same thing.

Why not StageRunner: its loop noise has one shape per batch size and it carries RTC tensors; Cosmos3's noise
(a video latent and an action chunk) takes its shape from the observation's canvas, and it has no RTC.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from phyai_ros.runtime.graphs import CapturedCall
from phyai_ros.runtime.runner import Runner

Tensor = torch.Tensor
# Observation shapes kept (buffers and the three graphs each): a canvas and a padded prompt length per camera
# setup and instruction length; more than a robot needs, few enough to bound the memory a stream of new shapes takes.
MAX_BUCKETS = 8


@dataclass
class _Bucket:
    key: tuple
    layout: object
    obs: Dict[str, Tensor]
    vision_noise: Tensor
    action_noise: Tensor
    text: Optional[CapturedCall] = None
    condition: Optional[CapturedCall] = None
    loop: Optional[CapturedCall] = None
    text_out: object = None                 # the text keys / values the conditioning reads
    text_key: Optional[tuple] = None        # the prompt rows they were computed for; None = recompute
    context: object = None
    observation_for: Optional[int] = None   # id of the observation the conditioning holds; None = invalid


class Cosmos3Runner(Runner):
    """Conditioning once per observation, the captured loop once per chunk, on one device (per rank)."""

    stages = ("text", "condition", "loop")

    def __init__(self, model, use_graphs: bool = True, max_buckets: int = MAX_BUCKETS):
        super().__init__(model.device, use_graphs, max_buckets)
        self.model = model
        self.text_runs = 0          # how often the text pathway ran (a kept instruction does not run it again)

    @staticmethod
    def bucket_key(obs: Dict[str, Tensor], layout) -> tuple:
        return (layout,) + tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(obs.items()))

    def _bucket(self, obs: Dict[str, Tensor], layout) -> _Bucket:
        key = self.bucket_key(obs, layout)
        b = self._buckets.get(key)
        if b is None:
            vshape, ashape = self.model.noise_shapes(obs, layout)
            b = _Bucket(key, layout, {k: torch.empty_like(v, device=self.device) for k, v in obs.items()},
                        torch.zeros(vshape, device=self.device), torch.zeros(ashape, device=self.device))
            self._buckets.add(key, b)
        return b

    @torch.no_grad()
    def set_observation(self, obs: Dict[str, Tensor], layout, text_key: Optional[tuple] = None) -> _Bucket:
        """Copy a new observation into its bucket and compute its conditioning, invalidating the one held.
        ``text_key`` (``stages.text_key`` of the inputs): where it equals the key the bucket's text keys / values
        were computed for, they are kept; None recomputes them."""
        b = self._bucket(obs, layout)
        b.observation_for = None
        for k, v in obs.items():
            b.obs[k].copy_(v, non_blocking=True)
        keep_text = text_key is not None and text_key == b.text_key and b.text_out is not None
        b.text_key = None
        if self.use_graphs:
            if b.text is None:
                b.text = self.registry.capture(("text",) + b.key, self.model.text, (b.obs,))
                keep_text = False
            if not keep_text:
                b.text_out = b.text.replay()
            if b.condition is None:
                b.condition = self.registry.capture(("condition",) + b.key, self.model.condition,
                                                    (b.obs, layout, b.text_out))
            b.context = b.condition.replay()
        else:
            if not keep_text:
                b.text_out = self.model.text(b.obs)
            b.context = self.model.condition(b.obs, layout, b.text_out)
        self.text_runs += not keep_text
        b.text_key = text_key
        b.observation_for = self.new_observation()
        return b

    @torch.no_grad()
    def sample(self, bucket: _Bucket, vision_noise: Tensor, action_noise: Tensor,
               trace: Optional[dict] = None) -> Tuple[Tensor, Tensor]:
        """All steps from this noise against the bucket's conditioning -> (actions, vision latents). Under graphs
        the outputs are the bucket's static tensors: the next call overwrites them. A trace runs eagerly."""
        if bucket.observation_for is None:
            raise RuntimeError("the conditioning is invalid: call set_observation() for the new observation first")
        bucket.vision_noise.copy_(vision_noise, non_blocking=True)
        bucket.action_noise.copy_(action_noise, non_blocking=True)
        args = (bucket.context, bucket.vision_noise, bucket.action_noise, bucket.layout)
        if not self.use_graphs or trace is not None:
            return self.model.loop(*args, trace=trace)
        if bucket.loop is None:
            bucket.loop = self.registry.capture(("loop",) + bucket.key, self.model.loop, args)
        return bucket.loop.replay()

    def run(self, obs: Dict[str, Tensor], layout, vision_noise: Tensor, action_noise: Tensor,
            trace: Optional[dict] = None, text_key: Optional[tuple] = None) -> Tuple[Tensor, Tensor]:
        """One chunk for a new observation: set_observation, then sample."""
        return self.sample(self.set_observation(obs, layout, text_key), vision_noise, action_noise, trace)


__all__ = ["Cosmos3Runner"]
