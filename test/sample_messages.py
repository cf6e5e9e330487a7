"""Deterministic sample messages, and a peer process that publishes them.

Run as a script, it publishes the samples on /phyai_test/chunk and
/phyai_test/margin every 100 ms until interrupted; the test process rebuilds the
same samples locally and compares field by field.
"""
from __future__ import annotations

import numpy as np

from phyai_ros.control.chunk import ActionChunk
from phyai_ros.control.margin import MarginReport
from phyai_ros.messages import chunk_to_msg, margin_to_msg

H, D = 50, 32


def sample_chunk() -> ActionChunk:
    rng = np.random.default_rng(1234)
    return ActionChunk(
        seq=2**40 + 7,
        t0_ns=1_764_000_123_456_789_012,
        dt_ns=20_000_000,
        actions=rng.standard_normal((H, D)).astype(np.float32) * 3.0,
        d=5,
        observation_stamp_ns=1_764_000_123_400_000_001,
        model_id="pi05-test",
        action_names=tuple(f"joint_{i}" for i in range(D)),
        frame_id="base_link",
        inference_latency=0.0123,
    )


def sample_margin() -> MarginReport:
    return MarginReport(stamp_ns=1_764_000_124_000_000_500, chunk_seq=41, expired=True, budget=0.48,
                        latency_observe=0.011, latency_transfer=0.0021, latency_queue=0.0007,
                        latency_inference=0.083, latency_actuate=0.0004, margin=0.3828, margin_p50=0.39,
                        margin_p95=0.21, margin_p99=-0.05, window_size=123, p_nonnegative=0.987,
                        p_nonnegative_lower=0.961, confidence=0.9, target=0.99, level=1,
                        message="margin below target", roofline_x=12.5, roofline_y=0.93)


def main() -> None:
    import rclpy
    from rclpy.executors import ExternalShutdownException

    from phyai_ros.msg import ActionChunk, ControlMargin

    rclpy.init()
    node = rclpy.create_node("phyai_sample_publisher")
    chunk_pub = node.create_publisher(ActionChunk, "/phyai_test/chunk", 10)
    margin_pub = node.create_publisher(ControlMargin, "/phyai_test/margin", 10)
    chunk_msg = chunk_to_msg(sample_chunk())
    margin_msg = margin_to_msg(sample_margin())

    def publish():
        chunk_pub.publish(chunk_msg)
        margin_pub.publish(margin_msg)

    node.create_timer(0.1, publish)
    print("publisher ready", flush=True)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
