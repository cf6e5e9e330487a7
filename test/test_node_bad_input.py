"""Bad input never kills the node: each case is sent over real DDS to the node process, and the
test checks that the event was counted and reported (/diagnostics counters, WARN naming it)
and that the node is still producing chunks and commands afterwards.

One node serves the whole module (cases run in file order against the same process); every
case compares against the counters it saw just before injecting.
"""
import math
import time

import numpy as np
import pytest

from node_harness import FakeRobot, NodeProcess, command_action, make_small_checkpoint, require_tokenizer

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("pi05_small"))
    node = NodeProcess(ckpt, tokenizer)
    robot = FakeRobot(node.params)
    try:
        assert robot.wait_for_node(timeout=90), node.output()
        robot.set_instruction("stack the blocks")
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, timeout=60), node.output()
        yield robot, node
    finally:
        robot.close()
        print(node.stop())  # shown by pytest when a case fails


def inject(live, counter, publish, repeat=3):
    """Publish bad input (a few times: camera QoS is best effort), then require the counter to grow,
    a WARN naming it, and the node to go on publishing chunks and commands. Returns the counters seen
    before the injection."""
    robot, node = live
    assert robot.wait_counter("ticks", 0, timeout=10)
    before = robot.fresh_counters()
    seq, t_inject = robot.last_seq(), time.monotonic()
    for _ in range(repeat):
        publish()
        robot.spin_for(0.05)
    assert robot.wait_counter(counter, before.get(counter, 0), timeout=20), \
        f"{counter} not reported; counters {robot.counters()}\n{node.output()}"
    assert robot.spin_until(lambda: any(counter in m for m in robot.input_warnings(since=t_inject)), timeout=10), \
        robot.input_warnings(since=t_inject)
    still_alive(live, seq)
    return before


def still_alive(live, seq):
    robot, node = live
    assert node.alive, node.output()
    assert robot.wait_chunks_after(seq, count=2, timeout=30), f"no new chunks after #{seq}\n{node.output()}"
    assert robot.wait_commands(count=10, timeout=10), "the action timer stopped"


def image(robot, slot="base_0_rgb", **fields):
    msg = robot.camera_msg(slot)
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def test_malformed_image(live):
    robot, _ = live
    short = image(robot)
    short.data = bytes(short.data)[:-7]  # buffer does not match step * height
    empty = image(robot, height=0, width=0, step=0, data=b"")
    inject(live, "bad_image", lambda: (robot.publish_camera("base_0_rgb", short),
                                       robot.publish_camera("base_0_rgb", empty)))


def test_wrongly_encoded_image(live):
    robot, _ = live
    depth = image(robot, encoding="16UC1")  # a depth image on a colour camera topic
    yuv = image(robot, encoding="yuv422")
    inject(live, "bad_image", lambda: (robot.publish_camera("base_0_rgb", depth),
                                       robot.publish_camera("base_0_rgb", yuv)))


def test_undecodable_compressed_image(live):
    robot, _ = live
    slot = next(s for s, c in robot.compressed.items() if c)
    garbage = image(robot, slot, data=b"\xff\xd8 this is not a jpeg " * 20)
    inject(live, "bad_image", lambda: robot.publish_camera(slot, garbage))


def test_state_with_wrong_length(live):
    robot, _ = live
    msg = robot.joint_state_msg()
    msg.position = list(msg.position)[:-1]  # one position short of the names
    inject(live, "bad_state", lambda: robot.publish_state(msg))


def test_state_missing_a_joint(live):
    robot, _ = live
    names = robot.joint_names[:-1]
    msg = robot.joint_state_msg(names=names, positions=[0.0] * len(names))
    inject(live, "missing_joint", lambda: robot.publish_state(msg))


def test_state_with_nan(live):
    robot, _ = live
    positions = [0.0] * len(robot.joint_names)
    positions[2] = math.nan
    msg = robot.joint_state_msg(positions=positions)
    inject(live, "bad_state", lambda: robot.publish_state(msg))


def test_out_of_order_and_future_stamps(live):
    robot, _ = live
    inject(live, "out_of_order",
           lambda: robot.publish_camera("base_0_rgb", robot.camera_msg("base_0_rgb", robot.now_ns() - 10**9)))
    inject(live, "future_stamp",
           lambda: robot.publish_state(robot.joint_state_msg(robot.now_ns() + 60 * 10**9)))


def test_missing_required_camera_is_stale_and_the_timer_holds(live):
    """No inference on stale data (counted); the chunk runs out, the deadline policy (hold_last)
    repeats the last action and every missed slot is counted; chunks resume with the camera."""
    robot, node = live
    before = robot.fresh_counters()
    robot.enabled_cameras.discard("base_0_rgb")
    t_off, n_commands = time.monotonic(), len(robot.commands)
    # After max_observation_age (0.5 s) the frame is stale: no inference starts; one started just
    # before has finished well within the next 0.7 s.
    robot.spin_for(1.2)
    assert robot.wait_counter("deadline_misses", before["deadline_misses"] + 3, timeout=20), robot.counters()
    seq, n_chunks = robot.last_seq(), len(robot.chunks)
    robot.spin_for(0.5)
    assert len(robot.chunks) == n_chunks, "inference ran on a stale observation"
    assert robot.counters()["stale_snapshots"] > before["stale_snapshots"]
    held = [command_action(r.msg) for r in robot.commands[n_commands:]][-10:]
    assert len(held) == 10 and all(np.array_equal(held[0], a) for a in held), "hold_last did not hold"
    assert any("stale_snapshots" in m for m in robot.input_warnings(since=t_off))
    robot.enabled_cameras.add("base_0_rgb")
    still_alive(live, seq)


def test_missing_optional_camera_is_masked(live):
    robot, node = live
    optional = [s for s, req in zip(robot.slots, robot.params["cameras.required"]) if not req]
    assert optional
    # The previous case's stale snapshots stop once a chunk is made from fresh frames; the baseline is
    # a report sent after that chunk, so counts still in flight from that case are in it.
    assert robot.wait_chunks_after(robot.last_seq(), count=1, timeout=30), node.output()
    before = robot.fresh_counters()
    robot.enabled_cameras.discard(optional[0])
    try:
        seq = robot.last_seq()
        assert robot.wait_chunks_after(seq, count=4, timeout=30), node.output()
        robot.spin_for(0.6)  # past max_observation_age: the optional frame is now too old and masked
        assert robot.wait_chunks_after(robot.last_seq(), count=2, timeout=30), node.output()
        after = robot.fresh_counters()
        assert after["stale_snapshots"] == before["stale_snapshots"]
        assert after["inference_errors"] == before["inference_errors"]
    finally:
        robot.enabled_cameras.add(optional[0])


def test_the_node_survived_everything(live):
    robot, node = live
    counters = robot.counters()
    assert counters["callback_errors"] == 0 and counters["worker_crashes"] == 0, counters
    assert counters["inference_errors"] == 0 and counters["bad_chunks"] == 0, counters
    still_alive(live, robot.last_seq())
