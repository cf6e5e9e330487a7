"""A default that performs without a hand-made operator profile (phyai_ros.layers.profiles, model.op_autotune):
shipped profiles found by device signature, the precedence explicit > cache > shipped per device, the profile
written by the start-up autotune on a device nothing matched (here the CPU, with a second real linear candidate
so that there is something to choose) and read back by the next start, and atomic writes."""
import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import phyai_ros.layers.dispatch  # noqa: F401  (registers the ops' candidates)
from phyai_ros.layers.profiles import (ProfileChoice, cache_file, find_profile, profile_stamp, selector_for,
                                       shipped_dir, write_profile)
from phyai_ros.layers.selector import SELECTOR, Candidate, OperatorSelector

REPO = Path(__file__).resolve().parents[1]
KEY = "1x2|float32"


def _profile(path: Path, devices: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"devices": devices}))
    return path


def test_shipped_profiles_are_found_by_device_signature(tmp_path):
    shipped = tmp_path / "shipped"
    _profile(shipped / "a_thor.json", {"cuda:sm110:NVIDIA Thor": {"linear": {KEY: "thor"}}})
    _profile(shipped / "b_cpu.json", {"cpu": {"linear": {KEY: "b"}}})
    _profile(shipped / "c_cpu.json", {"cpu": {"linear": {KEY: "c"}}})   # name order: b wins
    (shipped / "broken.json").write_text("{not json")                    # skipped with a warning
    cache = tmp_path / "cache"
    found = find_profile("cpu", cache, shipped)
    assert (found.path, found.origin) == (shipped / "b_cpu.json", "shipped")
    assert find_profile("cuda:sm110:NVIDIA Thor", cache, shipped).path == shipped / "a_thor.json"
    none = find_profile("cuda:sm90:NVIDIA H200", cache, shipped)
    assert none.path is None and none.looked_in == (cache_file("cuda:sm90:NVIDIA H200", cache), shipped)
    assert "no operator profile for cuda:sm90:NVIDIA H200" in none.describe()
    # The package's own: profiles/ of this checkout (phyai_ros/profiles when installed) holds the H200's and the
    # H100's, each found by its device name alone; another H100 board (PCIe) is not the SXM card's.
    assert shipped_dir() == REPO / "profiles"
    for signature, name in (("cuda:sm90:NVIDIA H200", "h200.json"), ("cuda:sm90:NVIDIA H100 80GB HBM3", "h100.json")):
        found = find_profile(signature, cache)
        assert (found.path, found.origin) == (REPO / "profiles" / name, "shipped")
    assert find_profile("cuda:sm90:NVIDIA H100 PCIe", cache).path is None


def test_cache_file_name_is_the_sanitized_signature(tmp_path):
    assert cache_file("cuda:sm90:NVIDIA H200", tmp_path) == tmp_path / "cuda_sm90_NVIDIA_H200.json"
    assert cache_file("cuda:sm110:NVIDIA Jetson/Thor (x)", tmp_path).name == "cuda_sm110_NVIDIA_Jetson_Thor_x_.json"


def test_precedence_is_explicit_then_cache_then_shipped_per_device(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    cache, shipped = tmp_path / "cache", tmp_path / "shipped"
    explicit = _profile(tmp_path / "mine.json", {"cpu": {"linear": {KEY: "explicit"}}})
    write_profile(cache_file("cpu", cache), "cpu", {"linear": {KEY: "cache"}}, {})   # stamped as a cache is
    _profile(shipped / "cpu.json", {"cpu": {"linear": {KEY: "shipped"}}})
    base = OperatorSelector(candidates=SELECTOR.candidates)

    def chosen(**kw):
        sel, choice = selector_for("cpu", base=base, cache=cache, shipped=shipped, **kw)
        return sel.profile.get("cpu", {}).get("linear", {}).get(KEY), choice

    assert chosen(explicit=explicit) == ("explicit", ProfileChoice("cpu", explicit, "explicit"))
    assert chosen() == ("cache", ProfileChoice("cpu", cache_file("cpu", cache), "cache"))
    cache_file("cpu", cache).unlink()
    assert chosen() == ("shipped", ProfileChoice("cpu", shipped / "cpu.json", "shipped"))
    # A profile already in the base selector (PHYAI_OP_PROFILE's) counts as explicit.
    env_base = base.derive(explicit)
    sel, choice = selector_for("cpu", base=env_base, cache=cache, shipped=shipped)
    assert choice.origin == "explicit" and sel.profile["cpu"]["linear"][KEY] == "explicit"
    # An explicit file without a table for this device leaves it to the next in line, and says so.
    thor_only = _profile(tmp_path / "thor.json", {"cuda:sm110:NVIDIA Thor": {"linear": {KEY: "thor"}}})
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        assert chosen(explicit=thor_only)[0] == "shipped"
    assert "has no table for cpu" in caplog.text
    with pytest.raises(FileNotFoundError):
        chosen(explicit=tmp_path / "missing.json")
    # PHYAI_OP_PROFILE=none: the defaults, whatever is cached or shipped (an A/B baseline).
    monkeypatch.setenv("PHYAI_OP_PROFILE", "none")
    assert chosen() == (None, ProfileChoice("cpu", None, "none", ("nowhere: PHYAI_OP_PROFILE=none",)))
    assert base.profile == {}   # derived selectors never write into their base


def test_write_profile_is_atomic_and_merges(tmp_path):
    path = tmp_path / "p.json"
    write_profile(path, "other", {"linear": {"k": "x"}}, {})
    big = {"linear": {f"{i}x4096|bfloat16": f"triton_{i % 7}" for i in range(20000)}}   # ~0.7 MB per write
    errors, stop = [], threading.Event()

    def read_all_the_time():
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except ValueError as exc:   # a half-written file
                errors.append(exc)

    reader = threading.Thread(target=read_all_the_time)
    reader.start()
    try:
        for i in range(15):
            write_profile(path, "cpu", {"linear": {k: f"{v}_{i}" for k, v in big["linear"].items()}}, {})
    finally:
        stop.set()
        reader.join()
    assert errors == []
    data = json.loads(path.read_text())
    assert data["devices"]["other"] == {"linear": {"k": "x"}}                 # merged, not replaced
    assert data["devices"]["cpu"]["linear"]["0x4096|bfloat16"] == "triton_0_14"
    assert sorted(os.listdir(tmp_path)) == ["p.json"]                         # no temporary file left
    # A write that fails (a table JSON cannot hold) leaves the old file whole, and no temporary file.
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_profile(path, "cpu", {"linear": {"k": object()}}, {})
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["p.json"]
    write_profile(path, "cpu", {"linear": {"k": "y"}}, {}, merge=False)
    assert json.loads(path.read_text()) == {"devices": {"cpu": {"linear": {"k": "y"}}}, "timings": {"cpu": {}},
                                            "meta": profile_stamp()}


def _matmul_linear(x, weight, bias=None):
    """A second real CPU implementation of the linear op (matmul with the transposed weight)."""
    y = torch.matmul(x, weight.t())
    return y if bias is None else y + bias


def _node_params(ckpt, tokenizer, **overrides):
    from node_harness import CPU_CONFIG, load_params
    from phyai_ros.parameters import SPECS
    return {**{k: s.default for k, s in SPECS.items()}, **load_params(CPU_CONFIG), "model.checkpoint": str(ckpt),
            "model.tokenizer": str(tokenizer), "model.warmup_runs": 1, **overrides}


def test_autotune_profiles_the_warmup_calls_caches_them_and_the_next_start_reads_the_cache(tmp_path, monkeypatch):
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    tokenizer = require_tokenizer()
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))
    # On the CPU every op has one usable candidate: a second linear makes a choice (profiled-only: the default
    # stays torch, only a profile picks it), so the timing and choosing run for real.
    monkeypatch.setitem(SELECTOR.candidates, "linear",
                        [Candidate("matmul", _matmul_linear, profiled_only=True), *SELECTOR.candidates["linear"]])
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), tokenizer, **{"model.op_autotune": "on"})

    off = build_policy({**p, "model.op_autotune": "off"})
    assert off.op_profile.origin == "none" and not (tmp_path / "cache").exists()

    first = build_policy(p)
    path = cache_file("cpu", tmp_path / "cache")
    assert (first.op_profile.origin, first.op_profile.path) == ("autotune", path)
    assert "operator profile for cpu: " in first.op_profile.describe()
    data = json.loads(path.read_text())
    table, timings = data["devices"]["cpu"], data["timings"]["cpu"]
    assert table and set(table) == {"linear"}                       # the only op with a choice here
    assert set(table["linear"].values()) <= {"matmul", "torch"}
    assert table["linear"].keys() == timings["linear"].keys()
    for key, entry in timings["linear"].items():
        assert set(entry) == {"matmul", "torch"} and all(v["ok"] and v["us"] > 0 for v in entry.values()), key
        assert table["linear"][key] == min(entry, key=lambda n: entry[n]["us"])
    # Single-candidate calls are listed, not timed; both passes were recorded (fused ops and their sub-ops).
    assert timings["rms_norm"] and all(v == {"torch": "only candidate"} for v in timings["rms_norm"].values())
    assert {"linear_geglu", "geglu"} <= set(timings)
    assert first.selector.profile["cpu"]["linear"] == table["linear"]

    # The next start: the cache is this device's profile; nothing new to profile, the file is not rewritten.
    stamp = path.stat().st_mtime_ns
    second = build_policy(p)
    assert (second.op_profile.origin, second.op_profile.path) == ("cache", path)
    assert second.selector.profile["cpu"]["linear"] == table["linear"] and path.stat().st_mtime_ns == stamp
    assert selector_for("cpu")[1] == ProfileChoice("cpu", path, "cache")
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for s in second.camera_slots}
    state = np.zeros(second.adapter.state_dim, np.float32)
    np.testing.assert_allclose(second.predict(images, state, "pick"), off.predict(images, state, "pick"), atol=1e-4)

    # Another model on the same device (pi0: other shapes): the cache lacks them, so they are profiled and added.
    p0 = {**p, "model.checkpoint": str(make_small_checkpoint(tmp_path / "pi0", horizon=20, policy="pi0"))}
    third = build_policy(p0)
    assert third.op_profile.origin == "autotune"
    merged = json.loads(path.read_text())["devices"]["cpu"]["linear"]
    assert table["linear"].items() <= merged.items() and len(merged) > len(table["linear"])
    assert build_policy(p0).op_profile.origin == "cache"


# ------------------------------------------------------------------ hostile or broken profile files (issue 22)
BAD_PROFILES = {"table_is_text": '{"devices": {"cpu": {"linear": "x"}}}', "devices_list": '{"devices": ["cpu"]}',
                "nan_name": '{"devices": {"cpu": {"linear": {"%s": NaN}}}}' % KEY, "top_level_list": '[1, 2]',
                "timings_text": '{"devices": {"cpu": {}}, "timings": {"cpu": {"linear": "slow"}}}',
                "not_json": '{"devices": '}


@pytest.mark.parametrize("text", BAD_PROFILES.values(), ids=BAD_PROFILES.keys())
def test_a_bad_profile_file_is_skipped_with_a_warning_naming_it(tmp_path, caplog, monkeypatch, text):
    """As the explicit file, the device's cache or a shipped one: the selector runs on the defaults (or the next
    good profile in line), and the warning names the file."""
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    base = OperatorSelector(candidates=SELECTOR.candidates)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    cache, shipped = tmp_path / "cache", tmp_path / "shipped"
    cache.mkdir()
    cache_file("cpu", cache).write_text(text)
    _profile(shipped / "a_bad.json", {}).write_text(text)
    for explicit in (bad, None):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            sel, choice = selector_for("cpu", explicit, base=base, cache=cache, shipped=shipped)
        assert choice.origin == "none" and sel.profile == {}, choice
        named = [str(p) for p in (bad if explicit else cache_file("cpu", cache), shipped / "a_bad.json")]
        assert all(name in caplog.text for name in named), caplog.text
    good = _profile(shipped / "b_good.json", {"cpu": {"linear": {KEY: "good"}}})
    sel, choice = selector_for("cpu", bad, base=base, cache=cache, shipped=shipped)
    assert choice.path == good and sel.profile["cpu"]["linear"][KEY] == "good"


def test_a_bad_cache_file_is_rewritten_by_the_next_write(tmp_path, caplog):
    path = tmp_path / "cpu.json"
    for text in BAD_PROFILES.values():
        path.write_text(text)
        with caplog.at_level(logging.WARNING):
            write_profile(path, "cpu", {"linear": {KEY: "torch"}}, {"linear": {KEY: {"torch": {"us": 1.0}}}})
        assert json.loads(path.read_text())["devices"] == {"cpu": {"linear": {KEY: "torch"}}}
        assert f"{path} is not a valid profile, rewritten" in caplog.text


def _autotune_like(path: str, prefix: str, n: int) -> None:
    """What one process autotuning on a device does to the cache: n writes of new entries, merged."""
    for i in range(n):
        write_profile(Path(path), "cpu", {"linear": {f"{prefix}{i}": "torch"}},
                      {"linear": {f"{prefix}{i}": {"torch": {"us": 1.0, "ok": True}}}})


def test_two_processes_writing_one_cache_lose_no_entries(tmp_path):
    import multiprocessing
    path = tmp_path / "cpu.json"
    write_profile(path, "cpu", {"linear": {"old": "torch"}}, {})
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_autotune_like, args=(str(path), name, 40)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    table = json.loads(path.read_text())["devices"]["cpu"]["linear"]
    assert set(table) == {"old"} | {f"{name}{i}" for name in "ab" for i in range(40)}, \
        f"{81 - len(table)} entries lost"


def test_autotune_over_a_cache_of_the_wrong_shape(tmp_path, monkeypatch):
    """With model.op_autotune, a list-shaped cache file used to stop the node's start: now it is skipped, the device
    profiled, and the cache rewritten valid."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    tokenizer = require_tokenizer()
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))
    monkeypatch.setitem(SELECTOR.candidates, "linear",
                        [Candidate("matmul", _matmul_linear, profiled_only=True), *SELECTOR.candidates["linear"]])
    path = cache_file("cpu", tmp_path / "cache")
    path.parent.mkdir(parents=True)
    path.write_text('["cpu"]')
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), tokenizer, **{"model.op_autotune": "on"})
    policy = build_policy(p)
    assert (policy.op_profile.origin, policy.op_profile.path) == ("autotune", path)
    assert set(json.loads(path.read_text())["devices"]["cpu"]["linear"].values()) <= {"matmul", "torch"}
