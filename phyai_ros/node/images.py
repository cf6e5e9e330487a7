"""Camera messages to RGB uint8 arrays, with clear errors for bad frames.

cv_bridge does the decoding (the distro's on the robot, the PyPI port here); this
module checks what cv_bridge would otherwise turn into a crash or a garbled image:
unknown encodings, a data buffer that does not match width/height/step, and
undecodable compressed payloads; rows padded beyond width (step > width * channels) are
packed before conversion. The frame a message decodes to is held to the intake's one frame
rule (control.observation.FrameLimits) before anything of its size is made: from a raw message's
fields, and from a PNG's or JPEG's header (a 105 KB PNG can decode to 6000x6000, 108 MB); other
compressed formats are refused, as their size cannot be read before decoding. The decoded array is
held to the same rule again.
"""
from __future__ import annotations

import struct
from typing import Optional, Tuple

import numpy as np

from phyai_ros import needs_ros
from phyai_ros.control.observation import MAX_IMAGE_PIXELS, BadImageError, FrameLimits

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


_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless, ...): C0-CF but DHT (C4), JPG (C8), DAC (CC)
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def compressed_size(data) -> Optional[Tuple[str, int, int]]:
    """(format, width, height) from a PNG's IHDR or a JPEG's start-of-frame segment (``data``: bytes or a byte
    memoryview), read without decoding; None when the data is neither (or its header is cut short)."""
    if data[:8] == _PNG and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return "png", width, height
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:   # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:   # markers without a length
            i += 2
            continue
        if marker in _SOF:
            if i + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return "jpeg", width, height
        if marker == 0xDA:   # scan data before any frame header
            return None
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return None


class ImageConverter:
    """Converts sensor_msgs Image / CompressedImage to HxWx3 uint8 RGB; frames larger than ``max_pixels``
    (width x height) are refused before decoding (the node's ``cameras.max_pixels``)."""

    def __init__(self, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        with needs_ros(__name__):  # cv_bridge comes with ROS; the error types above need none
            from cv_bridge import CvBridge
        self._bridge = CvBridge()
        self.limits = FrameLimits(max_pixels=int(max_pixels), max_pixels_name="cameras.max_pixels")

    def _check_size(self, width: int, height: int, what: str) -> None:
        """The rgb8 frame [height, width, 3] a message declares, held to the frame rule before it is decoded."""
        try:
            self.limits.check_layout((height, width, 3))
        except BadImageError as exc:
            raise ImageDecodeError(f"{what}: {exc}, not decoded") from None

    def _checked(self, rgb, what: str) -> np.ndarray:
        """What cv_bridge decoded, held to the frame rule (a header that understated the size is caught here)."""
        try:
            return np.ascontiguousarray(self.limits.check(rgb))
        except BadImageError as exc:
            raise ImageDecodeError(f"{what} did not decode to a usable RGB frame: {exc}") from None

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
        self._check_size(msg.width, msg.height, encoding)
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
        return self._checked(rgb, encoding)

    def from_compressed(self, msg) -> np.ndarray:
        if len(msg.data) == 0:
            raise ImageDecodeError("empty compressed image")
        data = memoryview(msg.data)   # the header is all that is read here: no copy of the frame
        size = compressed_size(data)
        if size is None:
            raise ImageDecodeError(f"compressed image (format '{msg.format}', {len(data)} bytes starting "
                                   f"{data[:4].hex(' ')}) is neither PNG nor JPEG with a readable header: its size "
                                   "cannot be checked before decoding")
        self._check_size(size[1], size[2], f"compressed {size[0]} (format '{msg.format}')")
        try:
            rgb = self._bridge.compressed_imgmsg_to_cv2(msg, desired_encoding="rgb8")
        except Exception as exc:
            raise ImageDecodeError(_compressed_failure(msg, exc)) from exc
        return self._checked(rgb, f"compressed image (format '{msg.format}')")
