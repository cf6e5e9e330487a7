"""A family's camera frames held to the one frame rule (control.observation.FrameLimits), whatever they arrive as:
numpy or torch, one frame [H, W, 3] or a batch [B, H, W, 3]. The rule's words name the camera; the families add
only what is theirs (a side range, a batch size shared by the cameras)."""
from __future__ import annotations

from phyai_ros.control.observation import FrameLimits

FRAME = FrameLimits()   # the rule with no model-specific limit: uint8 RGB [H, W, 3], not empty, at most MAX_IMAGE_PIXELS


def check_frames_layout(image, camera: str, batched: bool = False) -> int:
    """``image`` (numpy array or torch tensor) is one frame, or with ``batched`` one or a batch of frames, that the
    frame rule accepts (BadImageError, a ValueError, naming ``camera``). Returns its batch size (1 for one frame)."""
    shape = tuple(getattr(image, "shape", ()))
    dtype = str(getattr(image, "dtype", type(image).__name__)).replace("torch.", "")
    if batched and len(shape) == 4:
        FRAME.check_layout(shape[1:], dtype, camera)
        return int(shape[0])
    if len(shape) != 3 and dtype == "uint8":
        wanted = "[H, W, 3] or [B, H, W, 3]" if batched else "one [H, W, 3]"
        raise FRAME.error(f"image shape must be {wanted}, got {list(shape)}", camera)
    FRAME.check_layout(shape, dtype, camera)
    return 1
