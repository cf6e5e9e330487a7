"""The model contract proven by a fourth family that lives in test/toy_family/ and is registered from the
environment (``PHYAI_ROS_FAMILIES``), with no shared file changed: it runs through ``predict``, the quantizer,
the serve engine, the node over DDS and a stepped replay, exactly as the built-in families do.

Every registered family (the built-in three and the toy) is also checked against the contract class itself."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from phyai_ros.models import PLUGIN_ENV, checkpoint_type, family, family_names
from phyai_ros.models.contract import FILE_KINDS, RTC_MODES, SERVING, PolicyAdapter, check_family
from ros_helpers import REPO, python_env

TEST_DIR = Path(__file__).resolve().parent
TOY = "toy_flow=toy_family.adapter:ToyFlowAdapter"
H, STATE, ACTION = 20, 8, 7


@pytest.fixture(autouse=True)
def toy_registered(monkeypatch):
    """The toy family registered the way a robot's own family would be, for this process and its children."""
    monkeypatch.setenv(PLUGIN_ENV, TOY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TEST_DIR), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def toy(tmp_path) -> Path:
    from phyai_ros.fixtures import make_small_checkpoint
    return make_small_checkpoint(tmp_path / "toy", policy="toy_flow", horizon=H, state_dim=STATE, action_dim=ACTION)


def _observation(seed: int = 0):
    rng = np.random.default_rng(seed)
    images = {"base_0_rgb": rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
              "left_wrist_0_rgb": rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)}
    return images, rng.normal(size=STATE).astype(np.float32), "stack the blocks"


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=300)


# ----------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("name", ["pi05", "pi0", "groot_n17", "cosmos3", "minicpm_robot", "toy_flow"])
def test_every_registered_family_keeps_the_contract(name):
    assert name in family_names()
    cls = family(name)
    check_family(cls)   # a complete PolicyAdapter with well-formed facts
    assert issubclass(cls, PolicyAdapter) and cls.family == name
    assert set(cls.rtc_modes) <= set(RTC_MODES) and cls.serving in SERVING and set(cls.needs_files) <= set(FILE_KINDS)


def test_a_plugin_cannot_take_a_built_in_name_or_be_malformed(monkeypatch):
    from phyai_ros.models import registered
    monkeypatch.setenv(PLUGIN_ENV, "pi05=toy_family.adapter:ToyFlowAdapter")
    with pytest.raises(ValueError, match="takes a built-in family's name"):
        registered()
    monkeypatch.setenv(PLUGIN_ENV, "toy_flow")
    with pytest.raises(ValueError, match="not name=module:Class"):
        registered()
    monkeypatch.setenv(PLUGIN_ENV, "other=toy_family.adapter:ToyFlowAdapter")
    with pytest.raises(ValueError, match="registered as 'other' but says it is family 'toy_flow'"):
        family("other")


def test_no_shared_file_knows_the_toy_family():
    """The proof is only a proof if nothing under phyai_ros/ (or the scripts, configs and launch files) names it."""
    shared = [p for d in ("phyai_ros", "scripts", "config", "launch", "kernels") for p in (REPO / d).rglob("*")
              if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".sh")]
    assert shared and not [p for p in shared if "toy_flow" in p.read_text() or "toy_family" in p.read_text()]


# ----------------------------------------------------------------------------- offline tools
def test_predict_runs_the_toy_family_like_any_checkpoint(toy, tmp_path):
    assert checkpoint_type(toy) == "toy_flow"
    images, state, task = _observation()
    noise = torch.randn(1, H, ACTION, generator=torch.Generator().manual_seed(3))
    save_file({**{f"raw.observation.images.{k}": torch.from_numpy(v[None].copy()) for k, v in images.items()},
               "raw.observation.state": torch.from_numpy(state[None].copy()), "noise": noise},
              str(tmp_path / "inputs.safetensors"))
    res = _run("phyai_ros.predict", "--checkpoint", str(toy), "--inputs", str(tmp_path / "inputs.safetensors"),
               "--task", task, "--output", str(tmp_path / "out.safetensors"))
    assert res.returncode == 0, res.stderr
    assert "toy_flow" in res.stdout
    out = load_file(str(tmp_path / "out.safetensors"))["actions"][0].numpy()
    alone = family("toy_flow").load(toy).predict(images, state, task, noise=noise)
    assert out.shape == (H, ACTION) and np.abs(out - alone).max() <= 1e-6
    # A flag the family does not read is refused, not ignored.
    res = _run("phyai_ros.predict", "--checkpoint", str(toy), "--inputs", str(tmp_path / "inputs.safetensors"),
               "--task", task, "--tokenizer", str(tmp_path / "x.model"), "--output", str(tmp_path / "o2.safetensors"))
    assert res.returncode == 2 and "toy_flow reads its tokenizer from its checkpoint folders" in res.stderr


def test_the_quantizer_writes_a_toy_folder_that_loads_and_stays_close(toy, tmp_path):
    res = _run("phyai_ros.quant", "--checkpoint", str(toy), "--output", str(tmp_path / "q"), "--scheme", "w8a16",
               "--dtype", "float32")
    assert res.returncode == 0, res.stderr
    assert "w8a16-int8: 3 weights of expert quantized" in res.stdout
    quantized = family("toy_flow").load(tmp_path / "q")
    assert quantized.quantization() == "quantization w8a16-int8: 3 weights (expert)"
    images, state, task = _observation(1)
    noise = quantized.make_noise(1, torch.Generator().manual_seed(0))
    ref = family("toy_flow").load(toy).predict(images, state, task, noise=noise)
    out = quantized.predict(images, state, task, noise=noise)
    assert 0 < np.abs(out - ref).max() <= 0.05 * np.abs(ref).max()


def test_the_serve_engine_serves_the_toy_family(toy):
    from phyai_ros.serve.engine import BatchEngine, ServeConfig
    from phyai_ros.serve.wire import Failure, Reply, Request
    engine = BatchEngine(ServeConfig(str(toy), device="cpu"))
    assert engine.info()["model_type"] == "toy_flow" and engine.info()["serving"] == "single"
    images, state, task = _observation(2)
    good = Request("arm_a", images, state, task, 7)
    bad = Request("arm_b", images, np.zeros(3, np.float32), task, 8)
    out = engine.run([good, bad])
    expected = engine.adapter.predict(images, state, task, noise=engine.adapter.make_noise(
        1, torch.Generator().manual_seed(7)))
    assert isinstance(out[0], Reply) and np.abs(out[0].actions - expected).max() <= 1e-6
    assert isinstance(out[1], Failure) and out[1].status == 400 and "arm_b" in out[1].message


# ----------------------------------------------------------------------------- the node and a replay
@pytest.mark.ros
def test_the_node_runs_the_toy_family_in_a_stepped_replay(toy, tmp_path):
    """The node process (plugin registered from its environment) loads the toy checkpoint from model.checkpoint
    alone (model.type from its config.json), acts, and a stepped replay accounts for every message."""
    from phyai_ros.replay.demo_bag import DemoBagConfig, make_demo_bag
    from phyai_ros.testing import PolicyNode, replay
    bag = make_demo_bag(tmp_path / "bag", DemoBagConfig(duration=3.0, state_rate_hz=20.0, storage="mcap"))
    overrides = {"rtc.mode": "off", "model.id": "toy"}
    with PolicyNode(checkpoint=toy, overrides=overrides) as node:
        result = replay(bag.path, node, mode="stepped")
        log = node.output()
    assert "policy toy (toy_flow, H = 20)" in log and "quantization none" in log, log[-2000:]
    assert result.complete and result.accounting.ok, (result.accounting.problems, log[-2000:])
    chunks = result.chunk_data
    assert len(chunks) >= 3 and all(c.actions.shape == (H, ACTION) and np.isfinite(c.actions).all() for c in chunks)
    assert result.node_counters.get("inference_errors", 0) == 0


def test_the_runner_interface_releases_and_stays_usable(tmp_path):
    """release() drops every bucket (the node's cleanup); the next call makes its bucket again and computes the
    same chunk, on the toy family's runner built on runtime.runner.Runner alone."""
    from toy_family.adapter import ToyFlowAdapter
    from phyai_ros.runtime.runner import Runner
    folder = ToyFlowAdapter.make_small_checkpoint(tmp_path / "toy")
    adapter = ToyFlowAdapter.load(folder)
    assert isinstance(adapter.runner, Runner)
    images = {"base_0_rgb": np.zeros((16, 16, 3), np.uint8)}
    state = np.zeros(8, np.float32)
    first = adapter.predict(images, state, "pick", noise=torch.Generator().manual_seed(0))
    assert adapter.runner.buckets()
    adapter.release()
    assert adapter.runner.buckets() == []
    again = adapter.predict(images, state, "pick", noise=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(first, again)
