"""rosbags type store with the package's own messages, and name helpers for bags.

rosbags ships the standard ROS 2 Jazzy types; ``phyai_ros/msg/ActionChunk`` and
``ControlMargin`` are registered from the package's ``.msg`` text, found by ``phyai_ros.share_dirs``
(the wheel's package data, the source tree's ``msg/``, an installed prefix's ``share/phyai_ros/msg``).  Bags written
here carry the definitions, so any ROS 2 tool (``ros2 bag info``, Foxglove) can read them.

``open_bag`` reads a rosbag2 folder whose mcap file was cut short (a recording killed, a disk
full, a partial copy): the complete records before the cut, as ``ros2 bag reindex`` would.
"""
from __future__ import annotations

import contextlib
import importlib
import functools
import os
import re
import struct
import sys
from pathlib import Path
from typing import Iterable, Iterator, List, Optional

from phyai_ros import needs_extra, needs_ros, share_dirs

PACKAGE = "phyai_ros"
CUSTOM_MESSAGES = ("ActionChunk", "ControlMargin")


def msg_dir() -> Path:
    """The folder holding the package's ``.msg`` files."""
    for d in share_dirs("msg"):
        if all((d / f"{name}.msg").is_file() for name in CUSTOM_MESSAGES):
            return d
    raise FileNotFoundError(f"{PACKAGE} message definitions not found in any of: "
                            + ", ".join(str(d) for d in share_dirs("msg")))


@functools.lru_cache(maxsize=1)
def typestore():
    """Jazzy type store + phyai_ros messages (cached; treat as read-only)."""
    with needs_extra("bags", "reading and writing bags"):   # here: the name helpers need no rosbags
        from rosbags.typesys import Stores, get_typestore, get_types_from_msg
    store = get_typestore(Stores.ROS2_JAZZY)
    d = msg_dir()
    types = {}
    for name in CUSTOM_MESSAGES:
        types.update(get_types_from_msg((d / f"{name}.msg").read_text(), f"{PACKAGE}/msg/{name}"))
    store.register(types)
    return store


class UnknownMessageType(LookupError):
    """A bag names a message type that no registered interface package provides."""


_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def _index_prefixes() -> List[Path]:
    """Prefixes whose ament index is searched: AMENT_PREFIX_PATH, then this environment's prefix
    (the venv, where rosidl installed the interfaces, when no ROS setup was sourced)."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    return [Path(p) for p in prefixes + [sys.prefix]]


def registered_msgtype(msgtype: str) -> bool:
    """Whether ``pkg/msg/Name`` is one of the project's messages or listed by a registered interface
    package (ament index resource ``rosidl_interfaces``).  Reads index files only, imports nothing:
    a bag's type names are chosen by whoever wrote the file."""
    with needs_ros(__name__):
        from ament_index_python.constants import RESOURCE_INDEX_SUBFOLDER
    parts = msgtype.split("/")
    if len(parts) != 3 or parts[1] != "msg" or not all(_IDENTIFIER.match(p) for p in parts):
        return False
    pkg, _, name = parts
    if pkg == PACKAGE and name in CUSTOM_MESSAGES:
        return True
    wanted = {f"msg/{name}.msg", f"msg/{name}.idl"}
    for prefix in _index_prefixes():
        listing = prefix / RESOURCE_INDEX_SUBFOLDER / "rosidl_interfaces" / pkg
        if listing.is_file() and wanted & {line.strip() for line in listing.read_text().splitlines()}:
            return True
    return False


MCAP_MAGIC = b"\x89MCAP0\r\n"
_MCAP_DATA_END, _MCAP_FOOTER = 0x0F, 0x02


@functools.lru_cache(maxsize=1)
def _mcap_reader_class():
    from rosbags.rosbag2.errors import ReaderError
    from rosbags.rosbag2.storage_mcap import McapReader

    class RecoveringMcapReader(McapReader):
        """rosbags' mcap reader; every error names the file, and a file without its end (no footer:
        cut short) is read up to its last complete record, unindexed.  ``recovered`` then says how
        much: {'file', 'size', 'read', 'messages', 'start_ns', 'end_ns'}."""

        recovered: Optional[dict] = None

        def open(self) -> None:
            try:
                super().open()
            except ReaderError as exc:
                if "end magic" not in str(exc):
                    raise ReaderError(f"{self.path}: {exc}") from None
                self._open_cut()

        def _open_cut(self) -> None:
            self.bio = self.path.open("rb")
            try:
                size = os.fstat(self.bio.fileno()).st_size
                self.data_start, self.data_end = _complete_mcap_records(self.bio, size, self.path)
                self.meta_scan()
            except BaseException as exc:
                self.close()
                if isinstance(exc, (ReaderError, struct.error, ValueError)):
                    raise ReaderError(f"{self.path}: truncated mcap, unreadable: {exc}") from None
                raise
            st = self.statistics
            self.connections = [c._replace(msgcount=st.channel_message_counts.get(c.id, 0)) for c in self.connections]
            n = st.message_count
            self.metadata = self.metadata._replace(
                duration=st.end_time - st.start_time + 1 if n else 0, start_time=st.start_time if n else 2**63 - 1,
                end_time=st.end_time + 1 if n else 0, message_count=n)
            self.recovered = {"file": str(self.path), "size": size, "read": self.data_end, "messages": n,
                              "start_ns": st.start_time if n else None, "end_ns": st.end_time if n else None}

    return RecoveringMcapReader


def _complete_mcap_records(bio, size: int, path) -> tuple:
    """(data start, end of the last complete record of the data section) of an mcap file without
    its end: records are walked by their length fields up to the first one the file cuts off."""
    bio.seek(0)
    if bio.read(8) != MCAP_MAGIC:
        raise ValueError("not an mcap file (bad start magic)")
    op, length = struct.unpack("<BQ", bio.read(9))
    start = pos = 8 + 9 + length
    while pos + 9 <= size:
        bio.seek(pos)
        op, length = struct.unpack("<BQ", bio.read(9))
        if op in (_MCAP_DATA_END, _MCAP_FOOTER) or pos + 9 + length > size:
            break
        pos += 9 + length
    return min(start, size), pos


@contextlib.contextmanager
def open_bag(path) -> Iterator:
    """An open rosbags AnyReader on a rosbag2 folder (this package's types as the default store) whose
    mcap files may be cut short; ``recovered_files(reader)`` lists what was recovered from those."""
    with needs_extra("bags", "reading bags"):
        from rosbags.highlevel import AnyReader
    reader = AnyReader([Path(path)], default_typestore=typestore())
    recovering = _mcap_reader_class()
    for sub in reader.readers:
        storage = getattr(sub, "storage", None)
        plugins = getattr(storage, "STORAGE_PLUGINS", None)
        if plugins is not None and "mcap" in plugins:
            storage.STORAGE_PLUGINS = {**plugins, "mcap": recovering}   # this reader only
    with reader:
        yield reader


def recovered_files(reader) -> List[dict]:
    """For each mcap file of an ``open_bag`` reader that was cut short: what could be read."""
    return [st.recovered for sub in reader.readers for st in getattr(getattr(sub, "storage", None), "storages", [])
            if getattr(st, "recovered", None)]


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


__all__ = ["typestore", "msg_dir", "registered_msgtype", "UnknownMessageType", "open_bag", "recovered_files",
           "absolute_topic", "parse_remaps"]


def ros_type(msgtype: str):
    """'sensor_msgs/msg/Image' -> the rclpy message class.  Only a registered interface package is
    imported (the name comes from a bag, and importing runs code): anything else raises
    UnknownMessageType; ImportError/AttributeError if registered but not importable here."""
    if not registered_msgtype(msgtype):
        raise UnknownMessageType(f"{msgtype}: unknown message type (no registered interface package provides it; "
                                 "not imported)")
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
