"""Speed that travels (issue 39) on the CPU: the start-up autotune's shortlist and budget, the per-device cache's
invalidation (another device's table, other kernels or versions, a corrupt file), the node's op_autotune modes,
and the quantized linears' measured plan (the "dense" candidate, which weights keep a bf16 copy)."""
import json
import logging
import time

import numpy as np
import pytest
import torch

import phyai_ros.layers.dispatch  # noqa: F401  (registers the ops' candidates)
from phyai_ros.layers import profiling
from phyai_ros.layers.profiles import (cache_file, find_profile, kernels_fingerprint, profile_stamp, selector_for,
                                       stale_reason, write_profile)
from phyai_ros.layers.quantized import (QuantizedWeight, QuantScheme, dense_shapes, plan_dense, qshape_key,
                                        quantized_in)
from phyai_ros.layers.selector import SELECTOR, Candidate, OperatorSelector, ProfileError
from phyai_ros.layers.shortlist import Priors, compute_capability, shortlist
from test_op_profiles import _matmul_linear, _node_params

H100, H200, THOR = "cuda:sm90:NVIDIA H100 80GB HBM3", "cuda:sm90:NVIDIA H200", "cuda:sm110:NVIDIA Thor"
KEY = "1x50x1024,2048x1024|bfloat16"


def _ok(us):
    return {"us": us, "rel_err": 1e-3, "ok": True}


def _write(path, timings: dict, devices: dict = None):
    path.write_text(json.dumps({"devices": devices or {}, "timings": timings}))
    return path


def _cands(*names, default=None):
    """Candidates in preference order; every one profiled-only except ``default`` (the first if not given)."""
    default = default or names[0]
    return [Candidate(n, lambda *a: None, profiled_only=n != default) for n in names]


# ------------------------------------------------------------------ the shortlist
def test_compute_capability_of_a_signature():
    assert compute_capability(H200) == 90 and compute_capability(THOR) == 110
    assert compute_capability("cpu") is None and compute_capability("cuda:odd") is None


def test_the_nearest_device_ranks_the_exact_shape(tmp_path):
    files = [_write(tmp_path / "h200.json", {H200: {"linear": {KEY: {"a": _ok(9), "b": _ok(3), "c": _ok(5),
                                                                       "d": "failed: no", "e": {"us": 1, "ok": False}}}}}),
             _write(tmp_path / "thor.json", {THOR: {"linear": {KEY: {"e": _ok(1), "d": _ok(2)}}}})]
    priors = Priors.load(H100, files)
    assert [sig for sig, _, _ in priors.tables] == [H200, THOR]          # sm90 before sm110
    assert priors.ranking("linear", KEY) == ["b", "c", "a"]              # failed and wrong outputs never rank
    # Another sm110 device ranks by the Thor's table (distance 0) before the H200's.
    assert Priors.load("cuda:sm110:NVIDIA Thor T4000", files).ranking("linear", KEY) == ["e", "d"]
    # A device's own table is never its prior.
    assert [sig for sig, _, _ in Priors.load(H200, files).tables] == [THOR]


def test_a_shape_ranks_by_its_nearest_profiled_shape_else_by_the_ops_wins(tmp_path):
    near = "1x64x1024,2048x1024|bfloat16"      # 64 rows instead of 50: one length, within 2x
    other = "1x50x4096,1024x4096|bfloat16"     # another width: not a stand-in
    files = [_write(tmp_path / "p.json", {H200: {"linear": {
        near: {"a": _ok(2), "b": _ok(1)},
        other: {"c": _ok(1), "a": _ok(2)},
        "1x50x2048,2048x2048|bfloat16": {"c": _ok(1), "b": _ok(3)}}}})]
    priors = Priors.load(H100, files)
    assert priors.ranking("linear", KEY) == ["b", "a"]
    # No profiled shape stands in: ranked by how often each won (c twice, b once, a never).
    assert priors.ranking("linear", "1x50x8192,512x8192|bfloat16") == ["c", "b"]
    assert priors.ranking("rms_norm", KEY) == []


def test_equally_near_devices_are_interleaved(tmp_path):
    files = [_write(tmp_path / "a.json", {H200: {"linear": {KEY: {"a": _ok(1), "b": _ok(2), "c": _ok(3)}}}}),
             _write(tmp_path / "b.json", {H100: {"linear": {KEY: {"x": _ok(1), "b": _ok(2)}}}})]
    # An sm89 GPU is as near to both sm90 GPUs: their rankings merge rank by rank (H100's first, by name).
    assert Priors.load("cuda:sm89:NVIDIA L40", files).ranking("linear", KEY) == ["x", "a", "b", "c"]


def test_shortlist_keeps_the_ranked_the_default_and_the_never_measured(tmp_path):
    files = [_write(tmp_path / "p.json", {H200: {"linear": {KEY: {
        "t1": _ok(5), "t2": _ok(1), "t3": _ok(2), "t4": _ok(3), "t5": _ok(4), "torch": _ok(9)}}}})]
    priors = Priors.load(H100, files)
    cands = _cands("t1", "t2", "t3", "t4", "t5", "new", "torch")
    picked = [c.name for c in shortlist(priors, "linear", KEY, cands, size=3)]
    assert picked == ["t1", "t2", "t3", "t4", "new"]   # top 3 (t2 t3 t4), the default t1, "new" never measured
    # Size 1 where the best is the default: a second one is timed, so the choice is measured.
    ranked_default = _cands("t2", "t1", "t3", "torch")
    assert [c.name for c in shortlist(priors, "linear", KEY, ranked_default, size=1)] == ["t2", "t3"]
    # An op no device measured: every candidate.
    assert shortlist(priors, "rms_norm", KEY, cands, size=1) == cands
    # Two candidates or fewer: both.
    assert shortlist(priors, "linear", KEY, cands[:2], size=1) == cands[:2]


def test_the_gain_at_a_call_is_what_the_nearest_device_saved_over_the_default(tmp_path):
    files = [_write(tmp_path / "p.json", {H200: {"linear": {KEY: {"t1": _ok(5), "t2": _ok(1), "t3": _ok(2)}}}})]
    priors = Priors.load(H100, files)
    assert priors.gain("linear", KEY, "t1") == 4.0
    assert priors.gain("linear", KEY, "t2") == 0.0                       # the default was the best there
    assert priors.gain("linear", KEY, "torch") is None                   # the default was not timed
    assert priors.gain("rms_norm", KEY, "triton") is None


def test_a_bad_prior_file_is_skipped(tmp_path):
    (tmp_path / "bad.json").write_text("{nope")
    good = _write(tmp_path / "good.json", {H200: {"linear": {KEY: {"a": _ok(1)}}}})
    assert [s for s, _, _ in Priors.load(H100, [tmp_path / "bad.json", good]).tables] == [H200]


# ------------------------------------------------------------------ profile_calls: select and deadline
def _toy_selector():
    sel = OperatorSelector()
    for name in ("a", "b", "c"):
        sel.register("toy", Candidate(name, lambda x: x * 2.0))
    return sel


def test_profile_calls_times_only_the_selected_and_stops_at_the_deadline():
    sel = _toy_selector()
    calls = {("toy", f"k{i}"): ((torch.ones(4),), {}) for i in range(3)}
    table, timings = profiling.profile_calls(sel, calls, "cpu", reps=2, replays=1,
                                             select=lambda op, key, cands: cands[1:])
    assert set(timings["toy"]) == {"k0", "k1", "k2"}
    assert all(set(entry) == {"b", "c"} for entry in timings["toy"].values())
    assert set(table["toy"].values()) <= {"b", "c"}
    assert profiling.profile_calls(sel, calls, "cpu", deadline=time.perf_counter() - 1) == ({}, {})
    # Under a budget the calls worth most go first (ties in name order).
    seen = []
    profiling.profile_calls(sel, calls, "cpu", reps=2, replays=1, report=lambda op, key, e, c: seen.append(key),
                            priority=lambda op, key: {"k0": 1.0, "k1": 0.0, "k2": 3.0}[key])
    assert seen == ["k2", "k0", "k1"]


def test_a_float32_call_holds_candidates_to_parity_not_to_the_bf16_bound():
    """A candidate 1e-3 off the reference passes at a bf16 key (2e-2) and fails at a float32 one: fp32 runs are
    the parity runs (predict --dtype float32), which a tuned choice must not move."""
    sel = OperatorSelector()
    sel.register("toy", Candidate("off", lambda x: x * 2.002, profiled_only=True))
    sel.register("toy", Candidate("torch", lambda x: x * 2.0))
    x = torch.ones(64)
    calls = {("toy", "64|float32"): ((x,), {}), ("toy", "64|bfloat16"): ((x,), {})}
    _, timings = profiling.profile_calls(sel, calls, "cpu", reps=2, replays=1)
    assert timings["toy"]["64|bfloat16"]["off"]["ok"] and not timings["toy"]["64|float32"]["off"]["ok"]


def test_the_bounded_search_ranks_and_orders_by_the_priors(tmp_path):
    from phyai_ros.runtime.autotune import UNMEASURED_PRIORITY, bounded_search
    sel = _toy_selector()
    files = [_write(tmp_path / "p.json", {H200: {"toy": {"k0": {"a": _ok(3), "b": _ok(1), "c": _ok(2)}}}})]
    search = bounded_search(sel, Priors.load(H100, files), size=1)
    assert search["priority"]("toy", "k0") == 2.0                            # "a" (the default) lost 2 us there
    assert search["priority"]("toy", "k9") == UNMEASURED_PRIORITY
    assert [c.name for c in search["select"]("toy", "k0", sel.candidates["toy"])] == ["a", "b"]
    assert bounded_search(sel, Priors(), size=0)["select"] is None


# ------------------------------------------------------------------ the cache: stale, foreign, corrupt
def test_the_stamp_names_the_kernels_and_versions():
    stamp = profile_stamp()
    assert set(stamp) == {"format", "kernels", "triton", "torch", "cuda"} and stamp["torch"] == torch.__version__
    assert kernels_fingerprint() == stamp["kernels"]                    # stable
    # A launch shape's keywords are part of it: a tiling changed under one name is another kernel.
    import functools
    sel = OperatorSelector(candidates={"linear": [Candidate("t", functools.partial(lambda x, block=1: x, block=64))]})
    other = OperatorSelector(candidates={"linear": [Candidate("t", functools.partial(lambda x, block=1: x,
                                                                                    block=128))]})
    assert kernels_fingerprint(sel) != kernels_fingerprint(other)
    assert stale_reason({"meta": stamp}) == ""
    assert "no stamp" in stale_reason({})


STALE = {"kernels": "000000000000", "triton": "0.0.1", "torch": "1.0", "cuda": "9.9", "format": 1}


@pytest.mark.parametrize("field", sorted(STALE))
def test_a_cache_timed_under_other_kernels_or_versions_is_ignored_with_a_warning(tmp_path, caplog, field):
    path = write_profile(cache_file("cpu", tmp_path), "cpu", {"linear": {KEY: "torch"}}, {})
    assert find_profile("cpu", tmp_path, tmp_path / "no_shipped").origin == "cache"
    data = json.loads(path.read_text())
    data["meta"][field] = STALE[field]
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        choice = find_profile("cpu", tmp_path, tmp_path / "no_shipped")
    assert choice.origin == "none"
    assert f"{path} ignored: timed under other kernels or versions ({field} {STALE[field]} !=" in caplog.text


def test_a_cache_without_this_devices_table_is_ignored_with_a_warning(tmp_path, caplog):
    path = cache_file("cpu", tmp_path)
    write_profile(path, H200, {"linear": {KEY: "t"}}, {})        # copied from another machine
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        assert find_profile("cpu", tmp_path, tmp_path / "no_shipped").origin == "none"
    assert f"{path} ignored: it has no table for cpu (it holds: {H200})" in caplog.text


def test_a_corrupt_cache_is_ignored_with_a_warning(tmp_path, caplog):
    path = cache_file("cpu", tmp_path)
    path.write_text('{"devices": {"cpu": {"linear": {"k": "t"')   # cut off mid-write by a crash
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        assert find_profile("cpu", tmp_path, tmp_path / "no_shipped").origin == "none"
    assert f"{path} ignored: {path}: unreadable" in caplog.text


def test_an_oversized_profile_is_refused_unread(tmp_path, caplog, monkeypatch):
    """Sizes before decoding: a cache (or explicit) file past MAX_PROFILE_BYTES is not parsed, and the node goes
    on as with no profile, with a warning naming the file and its size."""
    import phyai_ros.layers.selector as selector_module
    path = cache_file("cpu", tmp_path)
    path.write_text(json.dumps({"devices": {"cpu": {"linear": {KEY: "torch"}}}, "pad": "x" * 2048}))
    monkeypatch.setattr(selector_module, "MAX_PROFILE_BYTES", 1024)
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        assert find_profile("cpu", tmp_path, tmp_path / "no_shipped").origin == "none"
    assert f"{path} ignored: {path}: {path.stat().st_size} bytes, over the 1024 a profile may have" in caplog.text
    with pytest.raises(ProfileError, match="over the 1024"):
        selector_module.read_profile(path)


def test_an_explicit_or_shipped_profile_of_other_kernels_is_used_with_a_note(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "old.json").write_text(json.dumps({"devices": {"cpu": {"linear": {KEY: "torch"}}}}))   # no stamp
    base = OperatorSelector(candidates=SELECTOR.candidates)
    with caplog.at_level(logging.INFO, logger="phyai_ros.layers.profiles"):
        _, choice = selector_for("cpu", base=base, cache=tmp_path / "cache", shipped=shipped)
        assert choice.origin == "shipped"
        _, choice = selector_for("cpu", shipped / "old.json", base=base, cache=tmp_path / "cache", shipped=shipped)
        assert choice.origin == "explicit"
    assert "shipped operator profile" in caplog.text and "explicit operator profile" in caplog.text
    assert "no stamp" in caplog.text


def test_merging_into_a_stale_file_replaces_it(tmp_path, caplog):
    path = tmp_path / "p.json"
    write_profile(path, "cpu", {"linear": {"old": "torch"}}, {}, stamp={**profile_stamp(), "kernels": "0" * 12})
    with caplog.at_level(logging.WARNING, logger="phyai_ros.layers.profiles"):
        write_profile(path, "cpu", {"linear": {"new": "torch"}}, {})
    data = json.loads(path.read_text())
    assert data["devices"]["cpu"]["linear"] == {"new": "torch"} and data["meta"] == profile_stamp()
    assert "timed under other kernels or versions" in caplog.text and "replaced" in caplog.text


# ------------------------------------------------------------------ the node: op_autotune modes, a stale cache
@pytest.fixture
def cpu_choice(tmp_path, monkeypatch):
    """A fresh cache, no shipped profiles, and a second real CPU linear (profiled only) so there is a choice."""
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))
    monkeypatch.setitem(SELECTOR.candidates, "linear",
                        [Candidate("matmul", _matmul_linear, profiled_only=True), *SELECTOR.candidates["linear"]])
    return cache_file("cpu", tmp_path / "cache")


def test_auto_tunes_on_cuda_only_and_a_stale_cache_is_tuned_again(tmp_path, cpu_choice):
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    from phyai_ros.runtime.autotune import wanted
    assert wanted("auto", "cuda") and not wanted("auto", "cpu") and wanted("on", "cpu") and not wanted("off", "cuda")
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), require_tokenizer())
    auto = build_policy({**p, "model.op_autotune": "auto"})
    assert auto.op_profile.origin == "none" and not cpu_choice.exists()   # the CPU: nothing tuned, nothing written
    first = build_policy({**p, "model.op_autotune": "on"})
    assert first.op_profile.origin == "autotune" and "calls of" in first.op_profile.detail
    assert json.loads(cpu_choice.read_text())["meta"] == profile_stamp()
    # The install changes (another Triton): the cache is stale, so the next start tunes and rewrites it.
    data = json.loads(cpu_choice.read_text())
    data["meta"]["triton"] = "0.0.1"
    cpu_choice.write_text(json.dumps(data))
    again = build_policy({**p, "model.op_autotune": "on"})
    assert (again.op_profile.origin, again.op_profile.path) == ("autotune", cpu_choice)
    assert json.loads(cpu_choice.read_text())["meta"] == profile_stamp()
    assert build_policy({**p, "model.op_autotune": "on"}).op_profile.origin == "cache"


def test_a_shipped_profile_made_for_other_models_is_extended_into_the_cache(tmp_path, cpu_choice, monkeypatch):
    """The device's shipped profile matches but lacks this model's calls (the H100's holds pi0.5 and GR00T, not
    pi0): the node's warm-up finds the missing ones, tunes them into the cache, and the cache holds the shipped
    entries too (it supersedes the shipped file at the next start), which then tunes nothing."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), require_tokenizer(),
                     **{"model.op_autotune": "on"})
    assert build_policy(p).op_profile.origin == "autotune"     # every call of this model, to take one from
    tuned = json.loads(cpu_choice.read_text())["devices"]["cpu"]
    key = sorted(tuned["linear"])[0]
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "cpu.json").write_text(json.dumps({"devices": {"cpu": {"linear": {key: "torch"}}}}))
    cpu_choice.unlink()
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(shipped))
    first = build_policy(p)
    assert first.op_profile.origin == "autotune" and first.op_profile.path == cpu_choice, first.op_profile
    cached = json.loads(cpu_choice.read_text())["devices"]["cpu"]
    assert cached["linear"][key] == "torch"                     # the shipped choice kept, not re-timed
    assert {(op, k) for op, keys in tuned.items() for k in keys} <= {(op, k) for op, keys in cached.items()
                                                                      for k in keys}
    again = build_policy(p)
    assert (again.op_profile.origin, again.op_profile.path) == ("cache", cpu_choice)


def test_the_budget_leaves_the_rest_to_the_next_start(tmp_path, cpu_choice, monkeypatch):
    """A budget spent by the recording alone tunes nothing now; the next start (with time) tunes what is missing."""
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    p = _node_params(make_small_checkpoint(tmp_path / "pi05", horizon=20), require_tokenizer(),
                **{"model.op_autotune": "on", "model.op_autotune_budget": 1.0})
    monkeypatch.setattr(profiling, "profile_calls", _with_zero_deadline(profiling.profile_calls))
    first = build_policy(p)
    assert "budget 1 s reached" in first.op_profile.detail, first.op_profile.detail
    assert json.loads(cpu_choice.read_text())["timings"]["cpu"] == {}
    monkeypatch.undo()
    monkeypatch.setenv("PHYAI_PROFILE_CACHE", str(cpu_choice.parent))
    monkeypatch.setenv("PHYAI_PROFILES_DIR", str(tmp_path / "no_shipped"))
    monkeypatch.delenv("PHYAI_OP_PROFILE", raising=False)
    monkeypatch.setitem(SELECTOR.candidates, "linear",
                        [Candidate("matmul", _matmul_linear, profiled_only=True), *SELECTOR.candidates["linear"]])
    second = build_policy({**p, "model.op_autotune_budget": 600.0})
    assert second.op_profile.origin == "autotune"       # the cache lacked the calls: tuned now
    assert json.loads(cpu_choice.read_text())["timings"]["cpu"]["linear"]


def _with_zero_deadline(real):
    def profile_calls(*args, **kwargs):
        kwargs["deadline"] = time.perf_counter() - 1.0
        return real(*args, **kwargs)
    return profile_calls


# ------------------------------------------------------------------ the quantized linears' measured plan
def test_dense_shapes_reads_the_weight_and_scheme_of_every_dense_choice():
    scheme = QuantScheme.make("w8a8")
    w = QuantizedWeight.from_float(torch.randn(64, 32), scheme)
    x, gate = torch.randn(1, 5, 32), torch.randn(1, 1, 64)
    table = {"qlinear": {qshape_key(x, w): "dense", "1x5x32,16x32|float32|w8a8-fp8-dynamic": "triton"},
             "qlinear_gated_ada_rms_norm": {qshape_key(x, w, gate): "dense"}, "linear": {KEY: "dense"}}
    assert w.shape_tag == ("w8a8-fp8-dynamic", "64x32")
    assert dense_shapes(table) == {("w8a8-fp8-dynamic", "64x32")}          # a float op's key has no scheme
    other = QuantizedWeight.from_float(torch.randn(16, 32), scheme)
    assert plan_dense([w, other], None, torch.float32) == 2 and other.dense is not None
    assert plan_dense([w, other], dense_shapes(table), torch.float32) == 1
    assert other.dense is None and torch.equal(w.dense, w.dequantize(torch.float32))
    assert "dense" not in w.state_dict() and quantized_in({"a": w, "b": w, "c": torch.ones(1)}) == [w]


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16", "w4a16"])
def test_the_dense_candidate_is_the_float_op_on_the_dequantized_weight(scheme):
    from phyai_ros.layers.linears import linear, linear_add_rms_norm, linear_geglu
    w = QuantizedWeight.from_float(torch.randn(64, 128), QuantScheme.make(scheme))
    x, res, norm_w = torch.randn(1, 5, 128), torch.randn(1, 5, 64), torch.randn(64)
    plan_dense([w], None, torch.float32)
    sel = SELECTOR.derive()
    sel.profile["cpu"] = {op: {qshape_key(x, w): "dense"} for op in ("qlinear", "qlinear_geglu",
                                                                     "qlinear_add_rms_norm")}
    wd = w.dequantize(torch.float32)
    with sel.active():
        torch.testing.assert_close(linear(x, w), torch.nn.functional.linear(x, wd))
        torch.testing.assert_close(linear_geglu(x, w), linear_geglu(x, wd))
        torch.testing.assert_close(linear_add_rms_norm(x, w, res, norm_w, 1e-6),
                                   linear_add_rms_norm(x, wd, res, norm_w, 1e-6))
        w.dense = None   # a profile naming "dense" for a weight without its copy: the quantized path runs
        torch.testing.assert_close(linear(x, w), SELECTOR.candidates["qlinear"][-1].fn(x, w))
    # Profiled, "dense" is checked against itself, not against W8A8's fake-quantized activations.
    plan_dense([w], None, torch.float32)
    table, timings = profiling.profile_calls(sel, {("qlinear", qshape_key(x, w)): ((x, w, None), {})}, "cpu",
                                             reps=2, replays=1)
    entry = timings["qlinear"][qshape_key(x, w)]
    assert entry["dense"]["ok"] and entry["dense"]["rel_err"] < 1e-5 and set(entry) == {"dense", "torch"}


def test_a_quantized_checkpoint_keeps_dense_copies_only_where_the_profile_runs_bf16(tmp_path, cpu_choice):
    from node_harness import make_small_checkpoint, require_tokenizer
    from phyai_ros.policies import build_policy
    from phyai_ros.quant.__main__ import main as quantize
    src = make_small_checkpoint(tmp_path / "float", horizon=20)
    assert quantize(["--checkpoint", str(src), "--output", str(tmp_path / "q"), "--scheme", "w8a16",
                     "--weight-format", "int8", "--parts", "vision,prefix,expert", "--dtype", "float32"]) == 0
    p = _node_params(tmp_path / "q", require_tokenizer(), **{"model.op_autotune": "on"})
    measured = build_policy(p)
    weights = measured.adapter.quantized_weights()
    data = json.loads(cpu_choice.read_text())
    table, timings = data["devices"]["cpu"], data["timings"]["cpu"]
    q_entries = [e for op, keys in timings.items() if op.startswith("qlinear") for e in keys.values()]
    assert q_entries and all("dense" in e for e in q_entries)            # measured against the quantized path
    chosen = dense_shapes(table)
    assert chosen, "the bf16 path on the dequantized weight should beat dequantizing per call on the CPU"
    assert {w.shape_tag for w in weights if w.dense is not None} == chosen & {w.shape_tag for w in weights}
    assert all((w.dense is not None) == (w.shape_tag in chosen) for w in weights)
    everything = build_policy({**p, "model.quant_plan": "all"})
    assert all(w.dense is None for w in everything.adapter.quantized_weights())
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for s in measured.camera_slots}
    state = rng.standard_normal(measured.adapter.state_dim).astype(np.float32)
    np.testing.assert_allclose(measured.predict(images, state, "pick"), everything.predict(images, state, "pick"),
                               atol=1e-4)


# ------------------------------------------------------------------ shipped profiles and the Thor's launch files
def _shipped():
    from phyai_ros.layers.profiles import shipped_dir
    from phyai_ros.layers.selector import read_profile
    return [(path, sig) for path in sorted(shipped_dir().glob("*.json")) for sig in read_profile(path)["devices"]]


@pytest.mark.parametrize("path,signature", _shipped(), ids=[f"{p.name}:{s}" for p, s in _shipped()])
def test_each_shipped_profile_is_found_by_its_device_name(tmp_path, path, signature):
    found = find_profile(signature, tmp_path / "empty_cache")
    assert (found.path, found.origin) == (path, "shipped")


@pytest.mark.parametrize("config", ["pi05_thor", "pi0_thor", "groot_thor", "minicpm_thor"])
def test_the_thor_configs_tune_at_configure_and_run_a_quantized_checkpoint_by_measurement(config):
    """The Thor launch files load these: no profile ships for the Thor, so its first configure tunes (cached for the
    next), and a quantized checkpoint runs its measured plan."""
    from node_harness import REPO, load_params
    from phyai_ros.parameters import Parameters
    p = Parameters.of(load_params(REPO / "config" / f"{config}.yaml"))
    assert (p.model.op_autotune, p.model.quant_plan, p.model.device) == ("auto", "measured", "cuda")
    assert 1 <= p.model.op_autotune_budget <= 30
    launch = (REPO / "launch" / f"{config}.launch.py").read_text()
    assert f'"{config}.yaml"' in launch
