"""Operator profiles on a CUDA device (``gpu`` marker): the shipped profile of this GPU is found by its name, and
``model.op_autotune`` on a device nothing matched profiles the warm-up's calls among the real Triton candidates,
caches them, captures the graphs with the choices, and the next start reads the cache."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from phyai_ros.layers.profiles import cache_file, selector_for, signatures_in
from phyai_ros.layers.selector import device_signature

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_profile_of_this_gpu_is_found_without_a_parameter(tmp_path, monkeypatch):
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    signature = device_signature(torch.device("cuda"))
    shipped = [p for p in sorted((REPO / "profiles").glob("*.json")) if signature in signatures_in(p)]
    if not shipped:
        pytest.skip(f"no shipped profile for {signature}")
    selector, choice = selector_for("cuda", cache=tmp_path / "empty_cache")
    assert (choice.path, choice.origin) == (shipped[0], "shipped")
    assert selector.profile[signature] == json.loads(shipped[0].read_text())["devices"][signature]


def test_autotune_on_an_unprofiled_device_caches_and_the_next_start_reads_it(tmp_path, monkeypatch):
    from node_harness import make_small_checkpoint, require_tokenizer
    from test_op_profiles import _node_params
    from phyai_ros.policies import build_policy
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))   # as on a GPU nobody profiled
    ckpt = make_small_checkpoint(tmp_path / "pi05", horizon=20)
    p = _node_params(ckpt, require_tokenizer(), **{"model.device": "cuda", "model.dtype": "bfloat16",
                                                   "model.cuda_graphs": True, "model.token_bucket": 16,
                                                   "model.op_autotune": "on"})
    first = build_policy(p)
    signature = device_signature(torch.device("cuda"))
    path = cache_file(signature, tmp_path / "cache")
    assert (first.op_profile.origin, first.op_profile.path) == ("autotune", path), first.op_profile.describe()
    print(first.op_profile.describe())
    data = json.loads(path.read_text())
    table, timings = data["devices"][signature], data["timings"][signature]
    assert table.get("linear") and table["linear"].keys() <= timings["linear"].keys()
    timed = [v for keys in timings.values() for entry in keys.values() for v in entry.values() if isinstance(v, dict)]
    assert timed and all(v["us"] > 0 for v in timed)
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for s in first.camera_slots}
    state = np.zeros(first.adapter.state_dim, np.float32)
    chunk = first.predict(images, state, "pick up the cup")
    assert np.isfinite(chunk).all() and first.adapter.runner.use_graphs

    second = build_policy(p)
    assert (second.op_profile.origin, second.op_profile.path) == ("cache", path)
    assert second.selector.profile[signature] == table
    np.testing.assert_allclose(second.predict(images, state, "pick up the cup"), chunk, atol=1e-3)


def _without_this_device(tmp_path, signature: str) -> Path:
    """A copy of the shipped profiles with this device's tables taken out: the priors a GPU nobody profiled has."""
    folder = tmp_path / "shipped_others"
    folder.mkdir()
    for path in sorted((REPO / "profiles").glob("*.json")):
        data = json.loads(path.read_text())
        for section in ("devices", "timings"):
            data.get(section, {}).pop(signature, None)
        if data.get("devices"):
            (folder / path.name).write_text(json.dumps(data))
    return folder


def test_the_bounded_autotune_times_shortlists_ranked_by_the_other_devices(tmp_path, monkeypatch):
    """On a GPU no profile matches, with the other devices' shipped profiles as priors: each call times a shortlist
    (not every usable candidate), within the budget, and the chunk is finite through the captured graphs."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from test_op_profiles import _node_params
    from phyai_ros.layers.shortlist import SHORTLIST
    from phyai_ros.policies import build_policy
    signature = device_signature(torch.device("cuda"))
    priors = _without_this_device(tmp_path, signature)
    if not list(priors.glob("*.json")):
        pytest.skip("no shipped profile of another device to rank by")
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(priors))
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), require_tokenizer(),
                     **{"model.device": "cuda", "model.dtype": "bfloat16", "model.cuda_graphs": True,
                        "model.op_autotune": "auto", "model.op_autotune_budget": 60.0})
    policy = build_policy(p)
    print(policy.op_profile.describe())
    assert policy.op_profile.origin == "autotune" and "measured devices ranked the shortlists" in \
        policy.op_profile.detail
    timings = json.loads(cache_file(signature, tmp_path / "cache").read_text())["timings"][signature]
    widest = max(len(entry) for keys in timings.values() for entry in keys.values())
    assert widest <= SHORTLIST + 3, widest     # ranked, default, never-measured ones: far fewer than linear's 32
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for s in policy.camera_slots}
    assert np.isfinite(policy.predict(images, np.zeros(policy.adapter.state_dim, np.float32), "pick")).all()


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_a_quantized_checkpoint_on_the_gpu_measures_dense_against_its_kernels(tmp_path, monkeypatch, scheme):
    from node_harness import make_small_checkpoint, require_tokenizer
    from test_op_profiles import _node_params
    from phyai_ros.layers.quantized import dense_shapes
    from phyai_ros.policies import build_policy
    from phyai_ros.quant.__main__ import main as quantize
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))
    src = make_small_checkpoint(tmp_path / "float", horizon=20)
    assert quantize(["--checkpoint", str(src), "--output", str(tmp_path / "q"), "--scheme", scheme,
                     "--parts", "vision,prefix,expert", "--device", "cuda", "--dtype", "bfloat16"]) == 0
    p = _node_params(tmp_path / "q", require_tokenizer(), **{"model.device": "cuda", "model.dtype": "bfloat16",
                                                            "model.cuda_graphs": True, "model.op_autotune": "on"})
    policy = build_policy(p)
    signature = device_signature(torch.device("cuda"))
    data = json.loads(cache_file(signature, tmp_path / "cache").read_text())
    q = {op: keys for op, keys in data["timings"][signature].items() if op.startswith("qlinear")}
    assert q and all(isinstance(e.get("dense"), dict) and e["dense"]["ok"] for keys in q.values()
                     for e in keys.values() if len(e) > 1)
    chosen = dense_shapes(data["devices"][signature])
    assert all((w.dense is not None) == (w.shape_tag in chosen) for w in policy.adapter.quantized_weights())
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for s in policy.camera_slots}
    assert np.isfinite(policy.predict(images, np.zeros(policy.adapter.state_dim, np.float32), "pick")).all()
