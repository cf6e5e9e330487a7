"""The output bag a replay writes: one rosbags Writer, keyed by topic, safe from several threads.

The recording writes from the executor thread while the player writes inputs, events and the summary from
the main one.  ``close`` may come from the end of a replay or from an interrupt, once or twice: the first one
finishes the bag (metadata.yaml written, the mcap finished / the db committed) so what it holds stays readable."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Dict

from phyai_ros.replay.bagtypes import typestore

# rosbags' writer (the ``bags`` extra) is imported when a bag is opened: scans, reports and ``--help`` import the
# replay without it.


class OutputBag:
    """Thread-safe output bag (rosbags Writer) keyed by topic; writes after ``close`` are dropped."""

    def __init__(self, path: Path, storage: str):
        from rosbags.rosbag2 import StoragePlugin, Writer
        self.path = Path(path)
        self._writer = Writer(self.path, version=9,
                              storage_plugin=StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3)
        self._writer.open()
        self._conns: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self.closed = False

    def add(self, topic: str, msgtype: str) -> None:
        with self._lock:
            if topic not in self._conns:
                self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=typestore())

    def write(self, topic: str, t_ns: int, raw: bytes) -> None:
        with self._lock:
            if not self.closed:
                self._writer.write(self._conns[topic], int(t_ns), raw)

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self._writer.close()


__all__ = ["OutputBag"]
