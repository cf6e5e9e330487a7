"""The package's Python log records in the node's ROS log, while the node configures.

Loading, the operator profile's choice and the start-up autotune (its progress lines, a stale cache's warning)
log through Python's ``logging`` (they run in any process: predict, the benches, serve). A node has no handler
for it: without one, INFO is dropped and a warning reaches stderr without the node's name. ``forwarded_logs`` hands
the ``phyai_ros`` records of INFO and above to the node's rclpy logger for the time it is held.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager


class RosLogHandler(logging.Handler):
    """A ``logging`` handler writing into an rclpy logger at the record's level."""

    def __init__(self, ros_logger):
        super().__init__(logging.INFO)
        self.ros_logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            elif record.levelno >= logging.WARNING:
                self.ros_logger.warning(text)
            else:
                self.ros_logger.info(text)
        except Exception:  # noqa: BLE001 - a log line never fails the configure it describes
            self.handleError(record)


@contextmanager
def forwarded_logs(ros_logger, name: str = "phyai_ros"):
    """Forward ``name``'s records (INFO and above) to ``ros_logger`` while held."""
    logger = logging.getLogger(name)
    handler = RosLogHandler(ros_logger)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
