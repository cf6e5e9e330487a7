"""The flow-policy runner: static buffers, the prefix cache and CUDA-graph replay.

Ownership (design.md §1): the model says *what* to compute (stage functions), the adapter which solver
request (the RTC tensors); the runner owns *how*, and the stage order, once: per-bucket static input
buffers, the prefix KV cache and its validity, precomputed time tables, and three captured graphs: the
vision stage per camera shape (frames only, so that it starts while the host still builds the prompt:
``set_images``, then ``set_language``), and per bucket the prefix KV and the whole denoising loop with its RTC
guidance. The adapters sample through it on every device: on the CPU, or with graphs off, the same functions
run eagerly on the same buffers, so both paths compute the same thing. Requests the captured loop does not hold (training-time RTC,
the paper's VJP form, a per-step trace) run the reference solver loop eagerly against the same prefix state.

The model object must provide the pi-family stage API (pi0.5 and pi0 both do)::

    embed_images(images) -> image_embs
    join_prefix(image_embs, image_masks, tokens, token_masks) -> (embs, pad)
    prefix_state(embs, pad, state_padded) -> what every step of one observation reuses (KV, masks, ...)
    step_tables(t_table) -> per-step time conditioning, indexable by step (per token for training-time RTC:
        solver.per_token mixes step k's table with the t = 0 one)
    velocity(x_t, prefix_state, table_k) -> v
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from phyai_ros.models.pi.modeling import solver
from phyai_ros.runtime.graphs import CapturedCall
from phyai_ros.runtime.runner import Runner

Tensor = torch.Tensor
# Batch sizes captured for served batches: a batch is padded to the next one (a bounded set of graphs).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


@dataclass
class _Frames:
    """Static camera buffers of one (batch, camera slots, size) shape, and the vision stage over them."""

    images: Tensor
    image_masks: Tensor
    vision: Optional[CapturedCall] = None
    embs: Optional[Tensor] = None          # the vision stage's output for the frames last set


@dataclass
class _Bucket:
    """Static buffers of one (batch, camera slots, prompt length) shape bucket, and its graphs."""

    frames: _Frames
    tokens: Tensor
    token_masks: Tensor
    state: Tensor
    noise: Tensor
    rtc_y: Tensor
    rtc_weights: Tensor
    rtc_guidance: Tensor
    prefix: Optional[CapturedCall] = None
    loop: Optional[CapturedCall] = None
    prefix_for: Optional[int] = None   # id of the observation the prefix state holds, None = invalid


class FlowRunner(Runner):
    """Runs prefix + Euler loop (+ identity-form RTC guidance) for one model on one device."""

    stages = ("vision", "prefix", "loop")
    max_buckets = None   # unbounded: the shapes are the token budget's lengths and the camera counts, a few

    def __init__(self, model, num_steps: int, chunk_size: int, action_dim: int, use_graphs: bool = True,
                 token_bucket: int = 0, state_dim: int = 32, skip_absent_cameras: bool = True):
        super().__init__(model.device, use_graphs)
        self.model = model
        # Camera slots absent from every row of a batch sit at the end (the adapter puts present cameras
        # first); their 256 tokens are masked keys that do not advance positions, so not computing them
        # changes no valid result and saves their vision pass and prefix rows. Under graphs only into a
        # bucket captured at start-up (capture_all_buckets' min_slots): control never pays a capture for it.
        self.skip_absent_cameras = bool(skip_absent_cameras)
        # Language tokens are right-padded to the budget; pad tokens are masked keys whose own outputs
        # nothing reads, so cutting them changes no valid result. token_bucket > 0 keeps the prompt's
        # valid tokens rounded up to a multiple of it (one graph bucket per length).
        self.token_bucket = int(token_bucket)
        self.num_steps, self.chunk_size, self.action_dim = num_steps, chunk_size, action_dim
        self.state_dim = state_dim
        with torch.no_grad():
            self.t_table, self.dt = solver.euler_schedule(num_steps, device=self.device)
            self.tables = model.step_tables(self.t_table)   # before the loop, once per model
            self.clean_table = model.step_tables(torch.zeros(1, device=self.device))[0]   # flow time 0
        self._frames: dict[tuple, _Frames] = {}
        self._buckets: dict[tuple, _Bucket] = {}

    # ---------------------------------------------------------------- stages as capture-safe functions
    def vision_stage(self, images):
        return self.model.embed_images(images)

    def prefix_stage(self, image_embs, image_masks, tokens, token_masks, state):
        return self.model.prefix_state(*self.model.join_prefix(image_embs, image_masks, tokens, token_masks), state)

    def loop_stage(self, prefix_state, noise, y, weights, guidance):
        x = noise
        for k in range(self.num_steps):
            t = self.t_table[k]
            v = self.model.velocity(x, prefix_state, self.tables[k])
            # Zero weights (RTC off) make this exactly v: one graph serves both.
            v = solver.rtc_guided_velocity(x, v, t, y, weights, guidance[k])
            x = solver.euler_step(x, v, self.dt)
        return x

    def _reference_loop(self, prefix_state, noise: Tensor, guide: Optional[solver.RtcTensors], trace) -> Tensor:
        """The solver's reference loop over the same stages (eager): every RTC form, and a per-step trace."""
        def velocity(x, k, frozen=None):
            table = self.tables[k] if frozen is None else solver.per_token(self.tables[k], self.clean_table,
                                                                             frozen, x.shape[0])
            return self.model.velocity(x, prefix_state, table)

        return solver.sample(velocity, noise, self.num_steps, guide, trace, self.t_table)

    # ---------------------------------------------------------------- buffers
    @staticmethod
    def _bucket_key(batch: int, n_slots: int, size: int, n_tokens: int) -> tuple:
        return (batch, n_slots, n_tokens, size)

    def _frames_for(self, batch: int, n_slots: int, size: int) -> _Frames:
        f = self._frames.get((batch, n_slots, size))
        if f is None:
            f = _Frames(images=torch.zeros(batch, n_slots, 3, size, size, device=self.device, dtype=torch.float32),
                        image_masks=torch.zeros(batch, n_slots, device=self.device, dtype=torch.bool))
            self._frames[(batch, n_slots, size)] = f
        return f

    def _bucket(self, frames: _Frames, n_tokens: int) -> _Bucket:
        batch, n_slots, _, size, _ = frames.images.shape
        key = self._bucket_key(batch, n_slots, size, n_tokens)
        b = self._buckets.get(key)
        if b is None:
            dev, f32 = self.device, torch.float32
            b = _Bucket(
                frames=frames,
                tokens=torch.zeros(batch, n_tokens, device=dev, dtype=torch.long),
                token_masks=torch.zeros(batch, n_tokens, device=dev, dtype=torch.bool),
                state=torch.zeros(batch, self.state_dim, device=dev, dtype=f32),
                noise=torch.zeros(batch, self.chunk_size, self.action_dim, device=dev, dtype=f32),
                rtc_y=torch.zeros(batch, self.chunk_size, self.action_dim, device=dev, dtype=f32),
                rtc_weights=torch.zeros(batch, self.chunk_size, device=dev, dtype=f32),   # per row: served batches
                rtc_guidance=torch.zeros(self.num_steps, device=dev, dtype=f32),
            )
            self._buckets[key] = b
        return b

    def bucket_length(self, token_masks) -> int:
        """Language length kept under bucketing: the longest prompt rounded up to the bucket size. token_masks:
        a tensor, or the host copy (numpy) that spares a read from the device (which waits for its queue)."""
        n_valid = int(token_masks.sum(1).max())
        step = self.token_bucket
        return min(token_masks.shape[1], max(step, -(-n_valid // step) * step))

    def slots_kept(self, image_masks) -> int:
        """Camera slots computed: up to the last one present in any row (all of them when none is, or when
        skipping is off). image_masks: a tensor, or its host copy (numpy), as for the tokens."""
        n_slots = image_masks.shape[1]
        present = np.flatnonzero(np.asarray(image_masks.any(0).cpu() if isinstance(image_masks, Tensor)
                                            else image_masks.any(0)))
        if not self.skip_absent_cameras or present.size == 0:
            return n_slots
        return int(present.max()) + 1

    @torch.no_grad()
    def capture_all_buckets(self, images: Tensor, image_masks: Tensor, tokens: Tensor, token_masks: Tensor,
                            noise: Tensor, min_slots: Optional[int] = None) -> list:
        """Capture every token-length bucket up front (start-up), so no new prompt length ever pays a
        capture during control; with ``min_slots`` also every camera count from it to all slots (the
        trailing cameras absent), so that a camera that may go missing (an optional one) is skipped
        rather than computed masked."""
        budget = tokens.shape[1]
        lengths = sorted({min(budget, n) for n in range(max(self.token_bucket, 1), budget + self.token_bucket,
                                                          max(self.token_bucket, 1))}) if self.token_bucket else [budget]
        n_slots = images.shape[1]
        counts = range(max(1, min(min_slots, n_slots)), n_slots + 1) if min_slots and self.skip_absent_cameras \
            else [self.slots_kept(image_masks)]
        for n_present in counts:
            present = image_masks.clone()
            present[:, n_present:] = False
            for n in lengths:
                masks = torch.zeros_like(token_masks)
                masks[:, :n] = True
                self.sample(self.set_observation(images, present, tokens, masks, new_bucket=True), noise)
        return self.buckets()

    def buckets(self) -> list:
        return list(self._buckets)

    def _drop_buckets(self) -> None:
        self._frames.clear()
        self._buckets.clear()

    # ---------------------------------------------------------------- execution
    @torch.no_grad()
    def set_images(self, images: Tensor, image_masks: Tensor, new_bucket: bool = False,
                   host_image_masks=None) -> _Frames:
        """Copy a new observation's frames into their buffers and start the vision stage on them: under graphs
        its graph is launched here, so the host can build the prompt while it runs (``set_language`` next).
        new_bucket: under graphs, the absent cameras may be skipped into a shape not captured yet (start-up).
        host_image_masks: image_masks as a host array, when the caller has it (no read from the device)."""
        batch, n_slots, _, size, _ = images.shape
        kept = self.slots_kept(image_masks if host_image_masks is None else host_image_masks)
        if kept < n_slots and (not self.use_graphs or new_bucket or (batch, kept, size) in self._frames):
            images, image_masks = images[:, :kept], image_masks[:, :kept]
        f = self._frames_for(batch, images.shape[1], size)
        f.images.copy_(images, non_blocking=True)
        f.image_masks.copy_(image_masks, non_blocking=True)
        if not self.use_graphs:
            f.embs = self.vision_stage(f.images)
            return f
        if f.vision is None:
            f.vision = self.registry.capture(("vision", batch, f.images.shape[1]), self.vision_stage, (f.images,))
        f.embs = f.vision.replay()
        return f

    @torch.no_grad()
    def set_language(self, frames: _Frames, tokens: Tensor, token_masks: Tensor, state: Optional[Tensor] = None,
                     host_token_masks=None) -> _Bucket:
        """The prompt (and state) of the observation whose frames ``set_images`` last took: computes its prefix
        state (invalidating the bucket's old one). state: normalized, zero-padded [B, state_dim] (models that
        take the state in the prompt ignore it). host_token_masks: token_masks as a host array, when the caller
        has it."""
        if self.token_bucket:
            keep = self.bucket_length(token_masks if host_token_masks is None else host_token_masks)
            tokens, token_masks = tokens[:, :keep], token_masks[:, :keep]
        b = self._bucket(frames, tokens.shape[1])
        b.prefix_for = None
        b.tokens.copy_(tokens, non_blocking=True)
        b.token_masks.copy_(token_masks, non_blocking=True)
        if state is None:
            b.state.zero_()
        else:
            b.state.copy_(state, non_blocking=True)
        args = (frames.embs, frames.image_masks, b.tokens, b.token_masks, b.state)
        if not self.use_graphs:
            b.prefix = CapturedCall(graph=None, inputs=(), outputs=self.prefix_stage(*args))
        else:
            if b.prefix is None:
                b.prefix = self.registry.capture(("prefix",) + self._key(b), self.prefix_stage, args)
            b.prefix.replay()
        b.prefix_for = self.new_observation()
        return b

    @torch.no_grad()
    def set_observation(self, images: Tensor, image_masks: Tensor, tokens: Tensor, token_masks: Tensor,
                        state: Optional[Tensor] = None, new_bucket: bool = False,
                        host_masks: Optional[tuple] = None) -> _Bucket:
        """A whole new observation: ``set_images``, then ``set_language``. host_masks: (image_masks, token_masks)
        as host arrays, when the caller has them: the bucket is chosen from them without reading the device."""
        host_images, host_tokens = host_masks if host_masks is not None else (None, None)
        frames = self.set_images(images, image_masks, new_bucket, host_images)
        return self.set_language(frames, tokens, token_masks, state, host_tokens)

    @torch.no_grad()
    def sample(self, bucket: _Bucket, noise: Tensor, guide: Optional[solver.RtcTensors] = None,
               trace: Optional[dict] = None) -> Tensor:
        """Denoise from ``noise`` (x at t=1) against the bucket's prefix state; returns x at t=0.

        The returned tensor is the bucket's static output under graphs: the next call overwrites it.
        trace, if given, collects the solver's per-step tensors (see solver.sample).
        """
        if bucket.prefix_for is None:
            raise RuntimeError("prefix state is invalid: call set_observation() for the new observation first")
        bucket.noise.copy_(noise, non_blocking=True)
        if trace is not None or (guide is not None and not guide.graphable):
            return self._reference_loop(bucket.prefix.outputs, bucket.noise, guide, trace)
        if guide is None:
            bucket.rtc_weights.zero_()
            bucket.rtc_guidance.zero_()
            bucket.rtc_y.zero_()
        else:
            bucket.rtc_y.copy_(guide.y, non_blocking=True)
            bucket.rtc_weights.copy_(guide.weights, non_blocking=True)
            bucket.rtc_guidance.copy_(guide.guidance, non_blocking=True)
        args = (bucket.prefix.outputs, bucket.noise, bucket.rtc_y, bucket.rtc_weights, bucket.rtc_guidance)
        if not self.use_graphs:
            return self.loop_stage(*args)
        if bucket.loop is None:
            bucket.loop = self.registry.capture(("loop",) + self._key(bucket), self.loop_stage, args)
        return bucket.loop.replay()

    @staticmethod
    def _key(b: _Bucket) -> tuple:
        """Graph key: batch, camera slots, language tokens."""
        return (b.frames.images.shape[0], b.frames.images.shape[1], b.tokens.shape[1])
