"""rosbags type store with the package's own messages, and name helpers for bags.

rosbags ships the standard ROS 2 Jazzy types; ``phyai_ros/msg/ActionChunk`` and
``ControlMargin`` are registered from the package's ``.msg`` text, found in the source
tree (``<repo>/msg``) or in an installed prefix (``share/phyai_ros/msg``).  Bags written
here carry the definitions, so any ROS 2 tool (``ros2 bag info``, Foxglove) can read them.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Iterable, Optional

from rosbags.typesys import Stores, get_typestore, get_types_from_msg

PACKAGE = "phyai_ros"
CUSTOM_MESSAGES = ("ActionChunk", "ControlMargin")
NS = 1_000_000_000


def _candidate_msg_dirs() -> Iterable[Path]:
    yield Path(__file__).resolve().parents[2] / "msg"              # source tree
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes += [sys.prefix]
    for prefix in prefixes:
        yield Path(prefix) / "share" / PACKAGE / "msg"


def msg_dir() -> Path:
    """The folder holding the package's ``.msg`` files."""
    for d in _candidate_msg_dirs():
        if all((d / f"{name}.msg").is_file() for name in CUSTOM_MESSAGES):
            return d
    raise FileNotFoundError(f"{PACKAGE} message definitions not found in any of: "
                            + ", ".join(str(d) for d in _candidate_msg_dirs()))


@functools.lru_cache(maxsize=1)
def typestore():
    """Jazzy type store + phyai_ros messages (cached; treat as read-only)."""
    store = get_typestore(Stores.ROS2_JAZZY)
    d = msg_dir()
    types = {}
    for name in CUSTOM_MESSAGES:
        types.update(get_types_from_msg((d / f"{name}.msg").read_text(), f"{PACKAGE}/msg/{name}"))
    store.register(types)
    return store


def absolute_topic(name: str) -> str:
    """'cameras/base/image' -> '/cameras/base/image' (the node runs in the root namespace)."""
    name = name.strip()
    return name if name.startswith("/") else "/" + name


def parse_remaps(items: Optional[Iterable[str]]) -> dict:
    """['from:=to', ...] -> {'/from': '/to'} (also accepts 'from=to')."""
    out = {}
    for item in items or ():
        sep = ":=" if ":=" in item else "="
        src, _, dst = item.partition(sep)
        if not src or not dst:
            raise ValueError(f"bad remap {item!r}: expected FROM:=TO")
        out[absolute_topic(src)] = absolute_topic(dst)
    return out


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * NS + int(stamp.nanosec)


__all__ = ["typestore", "msg_dir", "absolute_topic", "parse_remaps", "stamp_ns", "NS"]
