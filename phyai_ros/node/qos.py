"""The QoS profiles of the node's topics, in one home for the node, the replay and the tests.

Sensors (cameras, joint states) use ROS's sensor-data profile (best effort, keep last 5); every output
and the replay's publishers are reliable; the instruction is latched (transient local), so a node
that starts later still gets the last one.
"""
from __future__ import annotations

from phyai_ros import needs_ros

with needs_ros(__name__):
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

SENSOR = qos_profile_sensor_data
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)


def reliable_depth(depth: int) -> QoSProfile:
    """A reliable keep-last profile of another depth (/clock: 1; recording the node's outputs: a deep queue)."""
    return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


__all__ = ["SENSOR", "RELIABLE", "LATCHED", "reliable_depth"]
