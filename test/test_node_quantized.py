"""A quantized checkpoint in the onboard node over real DDS: the node takes the folder the quantizer wrote as it
takes any checkpoint (its manifest sets the scheme), says which scheme it runs, and publishes chunks whose
actions are finite and within the reach of the float model's.
"""
import numpy as np
import pytest

from node_harness import FakeRobot, NodeProcess, make_small_checkpoint, require_tokenizer
from phyai_ros.messages import msg_to_chunk

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("policy,scheme", [("pi05", ["w8a8", "--parts", "vision,prefix,expert"]),
                                           ("pi0", ["w8a16", "--weight-format", "int8"])])
def test_node_runs_a_quantized_checkpoint(tmp_path, policy, scheme):
    from phyai_ros.quant.__main__ import main as quantize
    tokenizer = require_tokenizer()
    src = make_small_checkpoint(tmp_path / "float", policy=policy)
    assert quantize(["--checkpoint", str(src), "--output", str(tmp_path / "q"), "--scheme", *scheme,
                     "--dtype", "float32"]) == 0
    node = NodeProcess(tmp_path / "q", tokenizer)
    robot = FakeRobot(node.params)
    try:
        robot.set_instruction("pick up the red cup")
        assert robot.wait_for_node(timeout=90), node.output()
        assert robot.spin_until(lambda: len(robot.chunks) >= 4, timeout=90), node.output()
        assert node.alive, node.output()
    finally:
        robot.close()
        out = node.stop()
    assert f"quantization {scheme[0]}" in out, out
    # The package's own log lines reach the node's log (node/logs.py): the measured plan's, no profile on the CPU.
    assert "quantized plan: 0 of" in out and "[phyai_policy]" in out.split("quantized plan:")[0].splitlines()[-1], out
    assert out.count("no operator profile for cpu") == 1, out   # the profile's choice said once
    chunks = [msg_to_chunk(r.msg) for r in robot.chunks]
    assert [c.seq for c in chunks] == list(range(chunks[0].seq, chunks[0].seq + len(chunks)))
    for c in chunks:
        assert np.isfinite(c.actions).all() and c.actions.shape[0] == node.params["control.horizon"]
