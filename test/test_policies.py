"""The node's policy bridge: one predict path (adapter -> its runner; here without graphs, with and without
prompt-length buckets), for pi0.5 and pi0; RTC requests in robot units reach the solver; build_policy takes
the type and chunk size from the checkpoint, checks the RTC mode per model type, and gives the policy an
operator selector of its own."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from phyai_ros.control.rtc import make_request
from phyai_ros.models.pi.pi0 import Pi0Adapter
from phyai_ros.models.pi.pi05 import Pi05Adapter
from phyai_ros.policies import ControlPolicy

FIXTURES = Path(os.environ.get("PHYAI_PARITY_FIXTURES") or
                Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_parity")
pytestmark = pytest.mark.skipif(not (FIXTURES / "pi05" / "expected.safetensors").is_file(),
                                reason=f"LeRobot parity fixtures not found at {FIXTURES}")
IMG = "raw.observation.images."


@pytest.mark.parametrize("name, cls", [("pi05", Pi05Adapter), ("pi0", Pi0Adapter)])
def test_runner_path_equals_adapter_path_with_and_without_rtc(name, cls):
    d = FIXTURES / name
    adapter = cls.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    cfg = adapter.config
    inp = load_file(str(d / "inputs.safetensors"))
    task = json.loads((d / "inputs.json").read_text())["tasks"][0]
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    state = inp["raw.observation.state"][0].numpy()
    first = ControlPolicy(adapter, noise_seed=3).predict(images, state, task)
    assert first.shape == (cfg.chunk_size, adapter.action_dim) and np.isfinite(first).all()
    # RTC: the previous chunk's remainder in robot units, as the control loop hands it over.
    rtc = make_request(first[10:], 4, mode="guided", schedule="exp", horizon=cfg.chunk_size, t0_ns=0, dt_ns=1)
    guided_e = ControlPolicy(adapter, noise_seed=3).predict(images, state, task, rtc)
    adapter.use_runner(token_bucket=16)   # the runner as the GPU configures it (graphs need CUDA)
    np.testing.assert_allclose(ControlPolicy(adapter, noise_seed=3).predict(images, state, task), first, atol=1e-5)
    np.testing.assert_allclose(ControlPolicy(adapter, noise_seed=3).predict(images, state, task, rtc), guided_e,
                               atol=1e-5)
    # With the same noise, guidance pulls the first d actions toward the remainder they must continue.
    y = first[10:14]
    unguided = ControlPolicy(adapter, noise_seed=7).predict(images, state, task)
    guided = ControlPolicy(adapter, noise_seed=7).predict(images, state, task, rtc)
    assert np.abs(guided[:4] - y).max() < 0.5 * np.abs(unguided[:4] - y).max()


def test_paper_vjp_form_is_selectable_and_runs_eagerly_beside_a_runner():
    d = FIXTURES / "pi05"
    adapter = Pi05Adapter.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    cfg = adapter.config
    inp = load_file(str(d / "inputs.safetensors"))
    images = {k[len(IMG):]: v[0].numpy() for k, v in inp.items() if k.startswith(IMG)}
    state, task = inp["raw.observation.state"][0].numpy(), "pick up the cup"
    first = ControlPolicy(adapter, noise_seed=1).predict(images, state, task)
    rtc = make_request(first[10:], 4, mode="guided", schedule="exp", horizon=cfg.chunk_size, t0_ns=0, dt_ns=1)
    ident = ControlPolicy(adapter, noise_seed=2).predict(images, state, task, rtc)
    adapter.rtc_jacobian = "vjp"   # what build_policy sets from rtc.jacobian
    vjp = ControlPolicy(adapter, noise_seed=2).predict(images, state, task, rtc)
    assert np.isfinite(vjp).all() and np.abs(vjp - ident).max() > 1e-3


@pytest.mark.parametrize("name, cls", [("pi05", Pi05Adapter), ("pi0", Pi0Adapter)])
def test_training_time_rtc_feeds_the_frozen_prefix_as_clean_actions(name, cls):
    d = FIXTURES / name
    adapter = cls.from_files(d / "checkpoint", FIXTURES / "tokenizer" / "tokenizer.model", d / "norm_stats.json")
    inp = load_file(str(d / "inputs.safetensors"))
    tasks = json.loads((d / "inputs.json").read_text())["tasks"]
    images = {k[len(IMG):]: v.numpy() for k, v in inp.items() if k.startswith(IMG)}
    x = adapter.prepare(images, inp["raw.observation.state"].numpy(), tasks)
    prev, noise = inp["rtc.prev_chunk_left_over"], inp["noise"]
    plain = adapter.sample_actions(x, noise)
    trained = adapter.sample_actions(x, noise, adapter.rtc_tensors(prev, 4, 10, mode="trained"))
    dims = prev.shape[-1]
    assert (trained[:, :4, :dims] - prev[:, :4]).abs().max().item() == 0.0   # returned as given
    assert (trained[:, 4:] - plain[:, 4:]).abs().max().item() > 1e-3         # the rest is conditioned on it
    none_frozen = adapter.sample_actions(x, noise, adapter.rtc_tensors(prev, 0, 10, mode="trained"))
    assert (none_frozen - plain).abs().max().item() <= 1e-5                   # d = 0: per-token path = plain
    # Through the node's bridge, in robot units.
    policy = ControlPolicy(adapter, noise_seed=5)
    first = policy.predict({k: v[0] for k, v in images.items()}, inp["raw.observation.state"][0].numpy(), tasks[0])
    rtc = make_request(first[10:], 3, mode="trained", schedule="exp", horizon=adapter.config.chunk_size,
                       t0_ns=0, dt_ns=1)
    out = policy.predict({k: v[0] for k, v in images.items()}, inp["raw.observation.state"][0].numpy(), tasks[0], rtc)
    np.testing.assert_allclose(out[:3], first[10:13], atol=1e-4)


def _node_params(ckpt, tokenizer, **overrides):
    from node_harness import CPU_CONFIG, load_params
    from phyai_ros.parameters import SPECS
    return {**{k: s.default for k, s in SPECS.items()}, **load_params(CPU_CONFIG), "model.checkpoint": str(ckpt),
            "model.tokenizer": str(tokenizer), "model.warmup_runs": 0, **overrides}


def test_build_policy_takes_type_and_horizon_from_the_checkpoint_and_checks_given_ones(tmp_path):
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy, resolved_parameters
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi0_small", horizon=20, policy="pi0")
    p = _node_params(ckpt, tokenizer)
    assert p["model.type"] == "" and p["control.horizon"] == 0   # nothing restated by hand
    policy = build_policy(p)
    assert (policy.model_type, policy.horizon) == ("pi0", 20)
    assert type(policy.adapter).__name__ == "Pi0Adapter"
    resolved = resolved_parameters(p, policy)
    assert (resolved.model.type, resolved.control.horizon) == ("pi0", 20)
    # The start-up captures camera counts from the required cameras up (an optional one may go missing).
    assert policy.min_cameras == sum(map(bool, p["cameras.required"])) >= 1
    assert build_policy({**p, "cameras.required": [False] * len(p["cameras.slots"])}).min_cameras == 1
    with pytest.raises(ValueError, match="control.horizon 50 != the model's chunk size 20"):
        build_policy({**p, "control.horizon": 50})
    # The loop's trigger rule is the loop's (ControlConfig), checked once H is known, in the parameters' names.
    with pytest.raises(ValueError, match=r"rtc.overlap must be in \[0, control.horizon\) \(control.horizon = 20\)"):
        resolved_parameters({**p, "rtc.overlap": 20}, policy).control_config()
    # An RTC mode the model does not do is refused, saying which modes it does.
    with pytest.raises(ValueError, match=r"rtc.mode 'native' is not supported by the checkpoint .* \(it supports "
                                         r"guided, trained, off\)"):
        build_policy({**p, "rtc.mode": "native"})


def test_the_warm_up_covers_the_robots_cameras_only(tmp_path):
    """A robot with two of the checkpoint's three cameras (one of them optional): the warm-up shows the
    model those two, and the buckets it makes hold one or two camera slots, never the third."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    ckpt = make_small_checkpoint(tmp_path / "pi05_small")
    p = _node_params(ckpt, require_tokenizer(), **{"cameras.slots": ["base_0_rgb", "left_wrist_0_rgb"],
                                                   "cameras.topics": ["a/image", "b/image"],
                                                   "cameras.compressed": [False, False],
                                                   "cameras.required": [True, False]})
    policy = build_policy(p)
    assert len(policy.adapter.camera_names) == 3 and policy.min_cameras == 1
    images, state = policy.warmup_observation(policy.adapter.state_dim)
    assert sorted(images) == ["base_0_rgb", "left_wrist_0_rgb"]
    keys = policy.adapter.capture_buckets(images, state, eager=True, min_cameras=policy.min_cameras)
    assert sorted(k[1] for k in keys) == [1, 2]


def test_each_policy_owns_its_operator_selector(tmp_path):
    """build_policy no longer mutates the module's SELECTOR: the profile goes to the policy's own selector,
    which the ops consult while that policy runs."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.layers import selector as sel
    from phyai_ros.policies import build_policy
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"devices": {"test-device": {"linear": {"1x2|float32": "torch"}}}}))
    ckpt = make_small_checkpoint(tmp_path / "pi05_small", horizon=20)
    policy = build_policy(_node_params(ckpt, require_tokenizer(), **{"model.op_profile": str(profile)}))
    assert "test-device" in policy.selector.profile and "test-device" not in sel.SELECTOR.profile
    assert policy.selector is not sel.SELECTOR and policy.selector.candidates is sel.SELECTOR.candidates
    policy.selector.recording = {}
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for s in policy.camera_slots}
    policy.predict(images, np.zeros(policy.adapter.state_dim, np.float32), "pick")
    assert policy.selector.recording and sel.SELECTOR.recording is None   # the ops asked the policy's selector
    assert sel.active_selector() is None                                     # and only during its call
