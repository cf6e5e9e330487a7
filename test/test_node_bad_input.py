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

from node_harness import (FakeRobot, NodeProcess, command_action, diagnostics_status, make_small_checkpoint,
                          paced_dt, require_tokenizer)

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path_factory.mktemp("pi05_small"))
    # 50 Hz, or slower on a machine too slow to keep chunks ahead of the timer (the stale-camera case needs a chunk
    # executing when the camera goes)
    node = NodeProcess(ckpt, tokenizer, overrides={"control.dt": paced_dt(ckpt, tokenizer)})
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
    """No inference on stale data (counted); the chunk runs out (one run-out), the deadline policy
    (hold_last) repeats the last action on every following tick (deadline-policy ticks), the
    watchdog says ERROR once no chunk came for a horizon; chunks resume with the camera."""
    robot, node = live
    assert robot.wait_chunks_after(robot.last_seq(), timeout=30)   # a fresh chunk is executing
    before = robot.fresh_counters()
    robot.enabled_cameras.discard("base_0_rgb")
    try:
        t_off, n_commands, seq_off = time.monotonic(), len(robot.commands), robot.last_seq()
        # After max_observation_age (0.5 s) the frame is stale: no inference starts; one started just
        # before has finished well within the next 0.7 s (on a loaded machine it may deliver after
        # the first run-out, and its chunk runs out once more).
        robot.spin_for(1.2)
        assert robot.wait_counter("deadline_policy_ticks", before["deadline_policy_ticks"] + 3, timeout=20), \
            robot.counters()
        late = sum(r.msg.seq > seq_off for r in robot.chunks)
        assert 1 <= robot.counters()["run_outs"] - before["run_outs"] <= 1 + late, (robot.counters(), late)
        seq, n_chunks = robot.last_seq(), len(robot.chunks)
        robot.spin_for(0.5)
        assert len(robot.chunks) == n_chunks, "inference ran on a stale observation"
        assert robot.counters()["stale_snapshots"] > before["stale_snapshots"]
        # No chunk comes any more, so once ten more deadline-policy ticks are counted (a late chunk may still have
        # been executing a moment ago, at a slow paced dt) the last ten commands are all held ones.
        dt, horizon = robot.params["control.dt"], robot.params["control.horizon"]
        ticks = robot.fresh_counters()["deadline_policy_ticks"]
        assert robot.wait_counter("deadline_policy_ticks", ticks + 9, timeout=20 + 10 * dt), robot.counters()
        held = [command_action(r.msg) for r in robot.commands[n_commands:]][-10:]
        assert len(held) == 10 and all(np.array_equal(held[0], a) for a in held), "hold_last did not hold"
        assert any("stale_snapshots" in m for m in robot.input_warnings(since=t_off))
        # a horizon (horizon actions x dt) after the last chunk: the watchdog says why it is ERROR
        def margin():
            return [st for r in robot.diagnostics[-3:] for st in [diagnostics_status(r.msg, "control margin")] if st]
        assert robot.spin_until(lambda: margin() and margin()[-1].level == b"\x02", 10 + 2 * horizon * dt), margin()
        assert "base_0_rgb" in margin()[-1].message, margin()
    finally:
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


def until_logged(live, publish, *texts, timeout=20.0) -> str:
    """Publish bad input every 0.25 s until the node has logged a line holding all ``texts`` (it logs each
    kind of event at most every 2 s); returns that line."""
    robot, node = live
    start = len(node.output())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        publish()
        robot.spin_for(0.25)
        lines = [ln for ln in node.output()[start:].splitlines() if all(t in ln for t in texts)]
        if lines:
            return lines[0]
    raise AssertionError(f"the node never logged {texts}\n{node.output()[start:]}")


def optional_slot(robot):
    return next(s for s, req in zip(robot.slots, robot.params["cameras.required"]) if not req)


def test_elongated_image_on_optional_camera_is_refused_and_the_camera_masked(live):
    """A valid 1x2000 rgb8 frame cannot be resized to the model's 224x224: refused at intake, naming the
    camera; the optional camera is then masked and chunks keep coming, no inference fails."""
    robot, node = live
    slot = optional_slot(robot)
    assert not robot.compressed[slot]
    thin = image(robot, slot, height=1, width=2000, step=6000, data=bytes(6000))
    robot.enabled_cameras.discard(slot)  # only the bad frames arrive on it
    try:
        before = inject(live, "bad_image", lambda: robot.publish_camera(slot, thin))
        line = until_logged(live, lambda: robot.publish_camera(slot, thin), f"camera '{slot}'", "too elongated")
        assert "224:1" in line, line
        robot.spin_for(0.6)  # past max_observation_age: its last good frame is stale, the slot masked
        still_alive(live, robot.last_seq())
        assert robot.fresh_counters()["inference_errors"] == before["inference_errors"]
    finally:
        robot.enabled_cameras.add(slot)


def test_elongated_image_on_required_camera_is_refused(live):
    robot, _ = live
    tall = image(robot, height=3000, width=2, step=6, data=bytes(18000))
    before = inject(live, "bad_image", lambda: robot.publish_camera("base_0_rgb", tall))
    until_logged(live, lambda: robot.publish_camera("base_0_rgb", tall), "camera 'base_0_rgb'", "too elongated")
    assert robot.fresh_counters()["inference_errors"] == before["inference_errors"]


def test_uppercase_encoding_is_refused_with_a_hint(live):
    robot, _ = live
    upper = image(robot, encoding="BGR8")
    inject(live, "bad_image", lambda: robot.publish_camera("base_0_rgb", upper))
    until_logged(live, lambda: robot.publish_camera("base_0_rgb", upper), "'BGR8'", "did you mean 'bgr8'")


def test_corrupt_jpeg_is_refused_in_words(live):
    robot, _ = live
    slot = next(s for s, c in robot.compressed.items() if c)
    good = robot.camera_msg(slot)
    cut = image(robot, slot, data=bytes(good.data)[:len(good.data) // 2])  # a JPEG cut short in transit
    inject(live, "bad_image", lambda: robot.publish_camera(slot, cut))
    line = until_logged(live, lambda: robot.publish_camera(slot, cut), f"camera '{slot}'", "corrupt or truncated")
    assert "Assertion" not in line and "cvtColor" not in line, line


def test_state_with_duplicate_joint_names(live):
    robot, _ = live
    msg = robot.joint_state_msg()
    msg.name, msg.position = list(msg.name) + [msg.name[0]], list(msg.position) + [0.0]
    inject(live, "bad_state", lambda: robot.publish_state(msg))
    until_logged(live, lambda: robot.publish_state(msg), "duplicate joint names", repr(msg.name[0]))


@pytest.mark.parametrize("value", [1e30, 1e300])
def test_state_with_absurd_magnitude(live, value):
    """Finite but no physical pose: refused against the documented bound, and not called 'non-finite'."""
    robot, _ = live
    positions = [0.0] * len(robot.joint_names)
    positions[1] = value
    msg = robot.joint_state_msg(positions=positions)
    inject(live, "bad_state", lambda: robot.publish_state(msg))
    line = until_logged(live, lambda: robot.publish_state(msg), "MAX_ABS_STATE", f"{value:g}")
    assert "non-finite" not in line and repr(robot.joint_names[1]) in line, line


def test_blank_instruction_is_refused_and_the_task_kept(live):
    robot, node = live
    blank = robot._types["String"](data="  \n ")
    inject(live, "bad_input", lambda: robot.instruction_pub.publish(blank))
    until_logged(live, lambda: robot.instruction_pub.publish(blank), "instruction", "blank", "stack the blocks")
    robot.set_instruction("stack the blocks")  # what a late subscriber gets again


def test_long_instruction_is_cut_never_the_state(live):
    """A 10,000-character instruction: accepted (the policy cuts the task, never the state), counted
    once under truncated_instructions with a warning, and chunks keep coming."""
    robot, node = live
    start = len(node.output())
    before = inject(live, "truncated_instructions",
                    lambda: robot.set_instruction(("put the cup in the sink " * 420)[:10_000]))
    out = node.output()[start:]
    assert "10000 characters does not fit the 48-token prompt" in out and "state is kept" in out, out
    after = robot.fresh_counters()
    assert after["truncated_instructions"] == before["truncated_instructions"] + 1  # once, not per inference
    assert after["inference_errors"] == before["inference_errors"]
    robot.set_instruction("stack the blocks")


def _bomb(ext: str, side: int = 6000) -> bytes:
    """A side x side black frame, compressed: ~100 KB that decode to side * side * 3 bytes."""
    import cv2
    ok, buf = cv2.imencode(ext, np.zeros((side, side), np.uint8))
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_decompression_bomb_is_refused_from_its_header(live, ext):
    """A PNG / JPEG whose header says 6000x6000 (108 MB decoded, ~100 KB sent) is refused before decoding against
    cameras.max_pixels, counted as bad_image and named; the node keeps its rate."""
    robot, node = live
    slot = next(s for s, c in robot.compressed.items() if c)
    bomb = image(robot, slot, format=ext[1:], data=_bomb(ext))
    before = inject(live, "bad_image", lambda: robot.publish_camera(slot, bomb))
    until_logged(live, lambda: robot.publish_camera(slot, bomb), f"camera '{slot}'", "6000x6000",
                 "36,000,000 pixels", "not decoded")
    assert robot.fresh_counters()["inference_errors"] == before["inference_errors"]


def test_raw_frame_over_the_size_limit_is_refused(live):
    """A raw frame whose width and height say 4000x2500 (10 MP, over the 4096 x 2160 default) is refused from those
    fields first (its data is not even looked at: a best-effort topic rarely carries 10 MB whole; the converter's
    own test covers a full one)."""
    robot, _ = live
    big = image(robot, height=2500, width=4000, encoding="mono8", step=4000, data=bytes(4000))
    inject(live, "bad_image", lambda: robot.publish_camera("base_0_rgb", big))
    until_logged(live, lambda: robot.publish_camera("base_0_rgb", big), "camera 'base_0_rgb'", "4000x2500",
                 "10,000,000 pixels")


def test_instruction_over_the_size_limit_is_refused_naming_its_size(live):
    """A 1 MB instruction (over instruction.max_length) is refused at intake, its size in the message, and the task
    is kept; it used to be accepted and tokenised on the executor (~1 s without commands)."""
    robot, node = live
    huge = robot._types["String"](data="pick up the cup " * 62_500)
    before = inject(live, "bad_input", lambda: robot.instruction_pub.publish(huge), repeat=1)
    until_logged(live, lambda: robot.instruction_pub.publish(huge), "instruction of 1,000,000 characters",
                 "limit of 16,384", "stack the blocks")
    assert robot.fresh_counters()["truncated_instructions"] == before["truncated_instructions"]   # never taken
    robot.set_instruction("stack the blocks")


def test_the_node_survived_everything(live):
    robot, node = live
    counters = robot.counters()
    assert counters["callback_errors"] == 0 and counters["worker_crashes"] == 0, counters
    assert counters["inference_errors"] == 0 and counters["bad_chunks"] == 0, counters
    still_alive(live, robot.last_seq())
