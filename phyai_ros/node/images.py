"""Camera messages to RGB uint8 arrays, with clear errors for bad frames.

cv_bridge does the decoding (the distro's on the robot, the PyPI port here); this
module checks what cv_bridge would otherwise turn into a crash or a garbled image:
unknown encodings, a data buffer that does not match width/height/step, and
undecodable compressed payloads; rows padded beyond width (step > width * channels) are
packed before conversion.
"""
from __future__ import annotations

import numpy as np

from phyai_ros import needs_ros

# Encodings whose conversion to rgb8 is well defined for a policy camera.
_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}


class ImageDecodeError(ValueError):
    """A camera frame that cannot be turned into an RGB image."""


def _tight(msg, channels: int):
    """A copy of an 8-bit Image with rows packed (step = width * channels) and is_bigendian cleared:
    the PyPI cv_bridge port ignores ``step`` (padded rows come out sheared) and fails on the
    big-endian flag with NumPy 2, although byte order means nothing for 8-bit channels."""
    from sensor_msgs.msg import Image
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)[:, :msg.width * channels]
    return Image(header=msg.header, height=msg.height, width=msg.width, encoding=msg.encoding, is_bigendian=0,
                 step=msg.width * channels, data=np.ascontiguousarray(rows).tobytes())


def _compressed_failure(msg, exc: Exception) -> str:
    """Why a compressed frame failed, in words: cv_bridge passes OpenCV's failed decode on as an
    assertion from cvtColor (``!_src.empty()``), which says nothing about the data."""
    import cv2
    data = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    if cv2.imdecode(data, cv2.IMREAD_UNCHANGED) is None:
        return (f"compressed image (format '{msg.format}', {len(data)} bytes starting {bytes(data[:4]).hex(' ')}) "
                "is corrupt or truncated: OpenCV cannot decode it")
    return f"could not convert compressed image (format '{msg.format}') to rgb8: {type(exc).__name__}: {exc}"


class ImageConverter:
    """Converts sensor_msgs Image / CompressedImage to HxWx3 uint8 RGB."""

    def __init__(self) -> None:
        with needs_ros(__name__):  # cv_bridge comes with ROS; the error types above need none
            from cv_bridge import CvBridge
        self._bridge = CvBridge()

    def from_image(self, msg) -> np.ndarray:
        encoding = msg.encoding
        channels = _CHANNELS.get(encoding)
        if channels is None:
            # ROS encodings are case-sensitive (sensor_msgs/image_encodings.hpp): 'BGR8' is no encoding
            # cv_bridge or any other ROS tool knows, so it is refused with the spelling that is meant.
            hint = f"did you mean '{encoding.lower()}'? encodings are case-sensitive; " \
                if encoding.lower() in _CHANNELS else ""
            raise ImageDecodeError(
                f"unsupported image encoding '{encoding}' ({hint}supported: {', '.join(sorted(_CHANNELS))})")
        if msg.width == 0 or msg.height == 0:
            raise ImageDecodeError(f"empty image {msg.width}x{msg.height}")
        if msg.step < msg.width * channels:
            raise ImageDecodeError(f"step {msg.step} too small for {msg.width} px of {encoding}")
        if len(msg.data) != msg.step * msg.height:
            raise ImageDecodeError(
                f"image data has {len(msg.data)} bytes, expected step*height = {msg.step}*{msg.height}")
        if msg.step != msg.width * channels or msg.is_bigendian:
            msg = _tight(msg, channels)
        try:
            rgb = self._bridge.imgmsg_to_cv2(msg, desired_encoding="rgb8")
        except Exception as exc:  # cv_bridge raises several unrelated types
            raise ImageDecodeError(f"cv_bridge could not convert {encoding}: {exc}") from exc
        return np.ascontiguousarray(rgb)

    def from_compressed(self, msg) -> np.ndarray:
        if len(msg.data) == 0:
            raise ImageDecodeError("empty compressed image")
        try:
            rgb = self._bridge.compressed_imgmsg_to_cv2(msg, desired_encoding="rgb8")
        except Exception as exc:
            raise ImageDecodeError(_compressed_failure(msg, exc)) from exc
        if rgb is None or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ImageDecodeError(f"compressed image (format '{msg.format}') did not decode to RGB")
        return np.ascontiguousarray(rgb)
