"""GR00T N1.7 as the node's adapter (the registry's "groot_n17"): GrootPolicy behind the bridge contract of
phyai_ros/models/__init__.py, sampling through the observation runner (runtime/groot_runner.py: CUDA graphs on
the GPU, the same stages eagerly on the CPU).

What differs from the pi family, and why:
- Files: the tokenizer, chat template and statistics live in the checkpoint's own folders (backbone, pipelines),
  so the node's tokenizer / statistics file parameters are not read (``needs_files`` is empty).
- Cameras: GR00T has no masked slots: the node's camera slots must be exactly the checkpoint's cameras, all
  required (``masks_cameras``). Frames are squashed to a square, so any aspect ratio is usable (``image_size``
  None).
- RTC: GR00T's own ("native"): the loop's request (Y in robot units, d frozen, n = len(Y)) becomes the adapter's
  GrootRtc (prev_left_over = Y, inference delay d, execution horizon n): rows < d stay Y exactly, a ramp up to n,
  free beyond. Relative-action checkpoints have no inverse action normalization, so they do RTC "off" only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import numpy as np
import torch

from phyai_ros.runtime.groot_runner import GrootRunner

from .adapter import GrootPolicy, GrootRtc
from .processor import IMAGE_PREFIX
from .stages import GrootStages

if TYPE_CHECKING:
    from phyai_ros.control.rtc import RtcRequest

Tensor = torch.Tensor


class GrootNodePolicy(GrootPolicy):
    rtc_modes = ("native", "off")
    rtc_max_guidance = 10.0           # set by the bridge; native RTC has no guidance
    rtc_jacobian = "identity"
    needs_files = ()
    masks_cameras = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.relative:
            self.rtc_modes = ("off",)
        self.stages = GrootStages(self)
        self.use_runner(use_graphs=False)

    @classmethod
    def from_files(cls, checkpoint_dir, tokenizer=None, norm_stats=None, camera_names: Optional[Sequence[str]] = None,
                   device="cpu", dtype: torch.dtype = torch.float32, **kwargs) -> "GrootNodePolicy":
        """The bridge's call (tokenizer / norm_stats are the checkpoint's own: given ones are an error);
        camera_names, when given, must be the checkpoint's cameras (any order)."""
        for what, given in (("tokenizer", tokenizer), ("statistics", norm_stats)):
            if given:
                raise ValueError(f"GR00T N1.7 reads its {what} from the checkpoint's folders; got a separate {what} "
                                 f"file '{given}' (leave it empty)")
        policy = super().from_files(checkpoint_dir, device=device, dtype=dtype, **kwargs)
        if camera_names is not None:
            wanted = [c[len(IMAGE_PREFIX):] if c.startswith(IMAGE_PREFIX) else c for c in camera_names]
            if sorted(wanted) != sorted(policy.camera_names):
                raise ValueError(f"camera slots {list(camera_names)} must be the checkpoint's cameras "
                                 f"{policy.camera_names} (GR00T N1.7 takes every one of them; no slot is masked)")
        return policy

    # ---------------------------------------------------------------- bridge contract
    @property
    def image_size(self) -> None:
        """None: frames are squashed to the model's square, so every aspect ratio is usable."""
        return None

    def select_embodiment(self, value: str) -> None:
        self.use_embodiment(value)

    def fit_task(self, task: str, state=None):
        """(the text the model reads, False): GR00T's prompt has no token budget, nothing is ever cut."""
        return self.processor.language(task), False

    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> GrootRunner:
        """The runner every sample goes through (graphs only on CUDA). token_bucket does not apply: the runner
        keeps one bucket per observation shape (batch, token length, image grid)."""
        self.runner = GrootRunner(self.stages, use_graphs=use_graphs)
        return self.runner

    def capture_buckets(self, images: Mapping[str, object], state, eager: bool = False,
                        min_cameras: Optional[int] = None) -> list:
        """Capture the warm-up observation's graphs at start-up (nothing to do without graphs, unless eager: the
        operator autotune records what the same observation calls). min_cameras: unused, every camera is
        required here."""
        if not self.runner.use_graphs and not eager:
            return []
        inputs = self.prepare(images, np.asarray(state, dtype=np.float32)[None], ["warm up"])
        self.runner.run(self.stages.observation(inputs), self._noise(None, 1))
        return self.runner.buckets()

    @torch.no_grad()
    def sample_actions(self, inputs, noise=None, rtc: Optional[GrootRtc] = None, trace=None) -> Tensor:
        """Through the runner (its output buffer under graphs: decode it before the next call); with ``trace``
        the adapter's eager stage path, which records the intermediates."""
        if trace is not None:
            return super().sample_actions(inputs, noise, rtc, trace)
        noise = self._noise(noise, inputs.input_ids.shape[0])
        return self.runner.run(self.stages.observation(inputs), noise, rtc)

    def native_request(self, rtc: Optional["RtcRequest"]) -> Optional[GrootRtc]:
        """The loop's request (robot units) -> GrootRtc(Y, delay d, execution horizon n), checked."""
        if rtc is None:
            return None
        if rtc.mode not in self.rtc_modes or rtc.mode == "off":
            supported = ", ".join(m for m in self.rtc_modes if m != "off") or "none (RTC off only)"
            raise ValueError(f"RTC mode {rtc.mode!r} is not supported by this GR00T N1.7 checkpoint "
                             f"(it supports {supported})")
        prev = np.array(rtc.prefix, dtype=np.float32)      # a writable copy (the request's is read-only)
        if prev.ndim != 2 or prev.shape[1] != self.action_dim:
            raise ValueError(f"RTC prefix must be [n, {self.action_dim}], got {list(prev.shape)}")
        if not np.isfinite(prev).all():
            raise ValueError("RTC prefix contains NaN or inf")
        return GrootRtc(prev, int(rtc.d), rtc.n)

    def predict(self, images: Mapping[str, object], state: np.ndarray, task: str, noise=None,
                rtc: Optional["RtcRequest"] = None) -> np.ndarray:
        """One observation -> np.float32 [chunk_size, action_dim] in robot units; rtc: the control loop's
        RtcRequest (phyai_ros.control.rtc) or None."""
        if np.ndim(state) != 1:
            raise ValueError(f"state must be a vector of length {self.state_dim}, got shape {list(np.shape(state))}")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        return super().predict(images, state, task, noise, self.native_request(rtc))


__all__ = ["GrootNodePolicy"]
