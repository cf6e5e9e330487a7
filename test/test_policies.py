"""The node's policy bridge: the runner path (what the GPU runs, here without graphs) gives the adapter's chunk,
for pi0.5 and pi0, and RTC requests in robot units reach the solver."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from phyai_ros.control.rtc import make_request
from phyai_ros.models.pi0 import Pi0Policy
from phyai_ros.models.pi05 import Pi05Policy
from phyai_ros.policies import ControlPolicy
from phyai_ros.runtime.runner import FlowRunner

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or
                Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity")
pytestmark = pytest.mark.skipif(not (FIXTURES / "pi05" / "expected.safetensors").is_file(),
                                reason=f"LeRobot parity fixtures not found at {FIXTURES}")
IMG = "raw.observation.images."


@pytest.mark.parametrize("name, cls", [("pi05", Pi05Policy), ("pi0", Pi0Policy)])
def test_runner_path_equals_adapter_path_with_and_without_rtc(name, cls):
    d = FIXTURES / name
    adapter = cls.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    cfg = adapter.config
    runner = FlowRunner(adapter.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False,
                        state_dim=cfg.max_state_dim, token_bucket=16)
    inp = load_file(str(d / "inputs.safetensors"))
    task = json.loads((d / "inputs.json").read_text())["tasks"][0]
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    state = inp["raw.observation.state"][0].numpy()
    eager, graphed = ControlPolicy(adapter, None, noise_seed=3), ControlPolicy(adapter, runner, noise_seed=3)
    first = eager.predict(images, state, task)
    assert first.shape == (cfg.chunk_size, adapter.action_dim) and np.isfinite(first).all()
    np.testing.assert_allclose(graphed.predict(images, state, task), first, atol=1e-5)
    # RTC: the previous chunk's remainder in robot units, as the control loop hands it over.
    rtc = make_request(first[10:], 4, mode="guided", schedule="exp", horizon=cfg.chunk_size, t0_ns=0, dt_ns=1)
    guided_e, guided_r = eager.predict(images, state, task, rtc), graphed.predict(images, state, task, rtc)
    np.testing.assert_allclose(guided_r, guided_e, atol=1e-5)
    # With the same noise, guidance pulls the first d actions toward the remainder they must continue.
    y = first[10:14]
    unguided = ControlPolicy(adapter, None, noise_seed=7).predict(images, state, task)
    guided = ControlPolicy(adapter, None, noise_seed=7).predict(images, state, task, rtc)
    assert np.abs(guided[:4] - y).max() < 0.5 * np.abs(unguided[:4] - y).max()


def test_paper_vjp_form_is_selectable_and_runs_eagerly_beside_a_runner():
    d = FIXTURES / "pi05"
    adapter = Pi05Policy.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    cfg = adapter.config
    runner = FlowRunner(adapter.model, cfg.num_steps, cfg.chunk_size, cfg.max_action_dim, use_graphs=False)
    inp = load_file(str(d / "inputs.safetensors"))
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    state, task = inp["raw.observation.state"][0].numpy(), "pick up the cup"
    first = ControlPolicy(adapter, None, noise_seed=1).predict(images, state, task)
    rtc = make_request(first[10:], 4, mode="guided", schedule="exp", horizon=cfg.chunk_size, t0_ns=0, dt_ns=1)
    ident = ControlPolicy(adapter, runner, noise_seed=2).predict(images, state, task, rtc)
    vjp = ControlPolicy(adapter, runner, noise_seed=2, jacobian="vjp").predict(images, state, task, rtc)
    assert np.isfinite(vjp).all() and np.abs(vjp - ident).max() > 1e-3


@pytest.mark.parametrize("name, cls", [("pi05", Pi05Policy), ("pi0", Pi0Policy)])
def test_training_time_rtc_feeds_the_frozen_prefix_as_clean_actions(name, cls):
    from phyai_ros.models.common.policy import RtcParams
    d = FIXTURES / name
    adapter = cls.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    inp = load_file(str(d / "inputs.safetensors"))
    tasks = json.loads((d / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    x = adapter.prepare(images, inp["raw.observation.state"].numpy(), tasks)
    prev, noise = inp["rtc.prev_chunk_left_over"], inp["noise"]
    plain = adapter.sample_actions(x, noise)
    trained = adapter.sample_actions(x, noise, RtcParams(prev, 4, 10, mode="trained"))
    dims = prev.shape[-1]
    assert (trained[:, :4, :dims] - prev[:, :4]).abs().max().item() == 0.0   # returned as given
    assert (trained[:, 4:] - plain[:, 4:]).abs().max().item() > 1e-3         # the rest is conditioned on it
    none_frozen = adapter.sample_actions(x, noise, RtcParams(prev, 0, 10, mode="trained"))
    assert (none_frozen - plain).abs().max().item() <= 1e-5                   # d = 0: per-token path = plain
    # Through the node's bridge, in robot units.
    policy = ControlPolicy(adapter, None, noise_seed=5)
    first = policy.predict({k: v[0] for k, v in images.items()}, inp["raw.observation.state"][0].numpy(), tasks[0])
    rtc = make_request(first[10:], 3, mode="trained", schedule="exp", horizon=adapter.config.chunk_size,
                       t0_ns=0, dt_ns=1)
    out = policy.predict({k: v[0] for k, v in images.items()}, inp["raw.observation.state"][0].numpy(), tasks[0], rtc)
    np.testing.assert_allclose(out[:3], first[10:13], atol=1e-4)
