"""Cosmos3 served by the node like the other families: a tiny random pipeline folder as model.checkpoint (the
family found from its model_index.json), one camera, the embodiment domain from model.embodiment, its run settings from model.options, no robot state
read (the robot still sends its joints), RTC off. Its inference is slower than a short chunk lasts, so a
real-time replay places it in the inference-bound region of the control-time roofline, and the report says so."""
from __future__ import annotations

import numpy as np
import pytest

from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
from phyai_ros.replay.report import make_report
from phyai_ros.testing import PolicyNode, make_small_checkpoint, replay

pytestmark = pytest.mark.ros
DOMAIN, RAW = "bridge_orig_lerobot", 10      # the domain's raw action width (diffusers' table)


def test_the_node_runs_cosmos3_and_the_report_calls_it_inference_bound(tmp_path):
    ckpt = make_small_checkpoint(tmp_path / "pipeline", policy="cosmos3")
    bag = make_demo_bag(tmp_path / "bag", DemoBagConfig(duration=8.0, state_rate_hz=20.0, storage="mcap"))
    overrides = {"model.id": "cosmos3-tiny", "model.embodiment": DOMAIN, "rtc.mode": "off",
                 "model.options": "resolution_tier=256;chunk_size=8;num_steps=2;guidance=3.0",
                 "cameras.slots": ["image"], "cameras.topics": ["cameras/base/image"], "cameras.compressed": [False],
                 "cameras.required": [True], "control.action_names": [f"a{i}" for i in range(RAW)],
                 "control.dt": 0.01}   # an 8-action chunk lasts 0.08 s: far less than one CPU inference
    with PolicyNode(checkpoint=ckpt, overrides=overrides, stepped=False) as node:
        # its warm-up (two guided steps of the tiny pipeline) can take over a minute on a loaded 2-core CI machine
        # (alone the whole test takes ~20 s): replay()'s wait for the first report (180 s) covers it
        result = replay(bag.path, node, mode="realtime", out=tmp_path / "out")
        log = node.output()
    assert "policy cosmos3-tiny (cosmos3, H = 8)" in log, log[-2000:]
    chunks = result.chunk_data
    assert len(chunks) >= 2, log[-3000:]
    assert all(c.actions.shape == (8, RAW) and np.isfinite(c.actions).all() for c in chunks)
    report = make_report(tmp_path / "out", formats=("md",))
    text = report.markdown.read_text()
    assert "inference-bound" in text, text[:3000]
