"""The instruction reaches the node through two subscriptions (latched and volatile) and a latched
publisher matches both; the executor may serve their queues interleaved. Each publication must be
taken once: the task never flaps back to an older one, and a long task is counted once.

The node is built in this process with the real small pi0.5 adapter; the two deliveries are fed
to its instruction callback in the interleaved order the executor can produce.
"""
import time

import pytest

from node_harness import make_small_checkpoint, node_ros_args, require_tokenizer, with_test_defaults

pytestmark = pytest.mark.ros


@pytest.fixture
def node(tmp_path):
    import rclpy

    from phyai_ros.node.main import PolicyNode, start

    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05_small")
    context = rclpy.Context()
    rclpy.init(context=context)
    node = PolicyNode(context=context,
                      cli_args=["--ros-args", *node_ros_args(ckpt, tokenizer, overrides=with_test_defaults())])
    start(node)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def deliver(node, text, stamp):
    from std_msgs.msg import String
    node._on_instruction(String(data=text), {"source_timestamp": stamp, "received_timestamp": stamp + 1})


def test_one_publication_seen_by_both_subscriptions_is_taken_once(node):
    long_task = ("put the cup in the sink " * 420)[:10_000]
    tasks = []
    # Latched queue: A then B; the volatile queue: the same two publications, served after.
    for text, stamp in [("stack the blocks", 100), (long_task, 200), ("stack the blocks", 100), (long_task, 200)]:
        deliver(node, text, stamp)
        tasks.append(node.loop.buffer.instruction)
    assert tasks == ["stack the blocks", long_task, long_task, long_task]
    deadline = time.monotonic() + 10
    while not node._task_fitter.idle() and time.monotonic() < deadline:   # the prompt check runs off the executor
        time.sleep(0.01)
    assert node.loop.counters()["truncated_instructions"] == 1


def test_a_task_published_again_later_is_taken_again(node):
    for text, stamp in [("stack the blocks", 100), ("open the drawer", 200), ("stack the blocks", 300)]:
        deliver(node, text, stamp)
    assert node.loop.buffer.instruction == "stack the blocks"


def test_without_source_stamps_the_text_alone_decides(node):
    """A middleware that gives no source stamp (0): a repeat of the current task is still skipped,
    and a change of task is still taken."""
    for text in ["stack the blocks", "stack the blocks", "open the drawer"]:
        deliver(node, text, 0)
    assert node.loop.buffer.instruction == "open the drawer"
