"""Broken model files fail at load time with a message naming the file (or the tensor), never a bare
library error: truncated safetensors, non-JSON config / dims / stats, empty or corrupt tokenizer, weights
holding NaN, a pi0 label on pi0.5 weights, and a policy whose warm-up chunk is not finite."""
import json
import shutil

import pytest
import torch

from node_harness import make_small_checkpoint, require_tokenizer
from phyai_ros.models.files import CheckpointError
from phyai_ros.models.pi.pi0 import Pi0Adapter
from phyai_ros.models.pi.pi05 import Pi05Adapter


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_small_checkpoint(tmp_path_factory.mktemp("ckpt") / "pi05_small")


def broken_copy(small, tmp_path, name="broken"):
    copy = tmp_path / name
    shutil.copytree(small, copy)
    return copy


def load(ckpt, tokenizer=None, cls=Pi05Adapter):
    return cls.from_files(ckpt, tokenizer or require_tokenizer(), ckpt / "norm_stats.json")


def nan_action_stats(small, tmp_path):
    """A copy of ``small`` whose weights are finite but whose action statistics hold a NaN."""
    ckpt = broken_copy(small, tmp_path, "nan_stats")
    stats = json.loads((ckpt / "norm_stats.json").read_text())
    stats["action"]["q99"][0] = float("nan")
    (ckpt / "norm_stats.json").write_text(json.dumps(stats))
    return ckpt


def truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


@pytest.mark.parametrize("keep", [lambda n: n // 2, lambda n: 4], ids=["half", "header"])
def test_truncated_safetensors_names_the_file(small, tmp_path, keep):
    ckpt = broken_copy(small, tmp_path)
    truncate(ckpt / "model.safetensors", keep)
    with pytest.raises(CheckpointError) as err:
        load(ckpt)
    assert str(ckpt / "model.safetensors") in str(err.value) and "truncated or corrupt" in str(err.value)


@pytest.mark.parametrize("name", ["config.json", "model_dims.json", "norm_stats.json"])
def test_non_json_file_names_itself(small, tmp_path, name):
    ckpt = broken_copy(small, tmp_path)
    (ckpt / name).write_text('{"type": "pi05",')
    with pytest.raises(CheckpointError, match="not valid JSON") as err:
        load(ckpt)
    assert str(ckpt / name) in str(err.value)


def test_config_json_that_is_not_an_object(small, tmp_path):
    ckpt = broken_copy(small, tmp_path)
    (ckpt / "config.json").write_text("[]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        load(ckpt)


@pytest.mark.parametrize("content", [b"", b"\x00not a sentencepiece model" * 8, "half"], ids=["empty", "junk", "half"])
def test_empty_or_corrupt_tokenizer_names_the_file(small, tmp_path, content):
    tok = tmp_path / "tokenizer.model"
    tok.write_bytes(require_tokenizer().read_bytes()[:7000] if content == "half" else content)
    with pytest.raises(ValueError) as err:
        load(small, tokenizer=tok)
    assert str(tok) in str(err.value)


def test_nan_in_a_used_weight_is_refused_naming_the_tensor(small, tmp_path):
    """Only the weights inference uses count: Inf in an unused lm_head still loads."""
    from safetensors.torch import load_file, save_file
    from phyai_ros.models.pi.paligemma_keys import UNUSED_KEYS
    ckpt = broken_copy(small, tmp_path)
    sd = load_file(str(ckpt / "model.safetensors"))
    unused = next(k for k in sorted(sd) if k in UNUSED_KEYS)
    sd[unused] = torch.full_like(sd[unused], float("inf"))
    save_file(sd, str(ckpt / "model.safetensors"))
    load(ckpt)
    sd["model.action_out_proj.bias"][3] = float("nan")
    save_file(sd, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor model\.action_out_proj\.bias holds non-finite values") as err:
        load(ckpt)
    assert str(ckpt) in str(err.value)


def test_pi0_label_on_pi05_weights_says_so(small, tmp_path):
    with pytest.raises(CheckpointError, match="config.json says type pi05 but model.type .* is pi0"):
        load(small, cls=Pi0Adapter)
    # Without a type in config.json the weights tell: pi0.5's, not a key-mismatch dump.
    ckpt = broken_copy(small, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["type"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    (ckpt / "model_dims.json").unlink()
    with pytest.raises(CheckpointError, match="its weights are pi05's but model.type .* is pi0"):
        load(ckpt, cls=Pi0Adapter)


def test_pi05_label_on_pi0_weights_says_so(tmp_path):
    ckpt = make_small_checkpoint(tmp_path / "pi0_small", policy="pi0")
    with pytest.raises(CheckpointError, match="config.json says type pi0 but model.type .* is pi05"):
        load(ckpt)


def test_warmup_refuses_a_policy_with_non_finite_actions(small, tmp_path):
    """Finite weights, NaN action statistics: only the warm-up chunk shows it."""
    from node_harness import CPU_CONFIG, load_params
    from phyai_ros.parameters import SPECS
    from phyai_ros.policies import build_policy
    ckpt = nan_action_stats(small, tmp_path)
    p = {**{k: s.default for k, s in SPECS.items()}, **load_params(CPU_CONFIG), "control.horizon": 20,
         "model.checkpoint": str(ckpt), "model.tokenizer": str(require_tokenizer()), "model.warmup_runs": 1}
    with pytest.raises(ValueError, match="produces non-finite actions") as err:
        build_policy(p)
    assert str(ckpt) in str(err.value)


# ------------------------------------------------------------------ files outside the checkpoint (issue 22)
def _outside_error(small, tmp_path, how: str, exists: bool) -> str:
    """The error of loading a copy of ``small`` whose weight_map names a shard outside the folder, ``how``: by an
    absolute path, by '..', or through a symlink inside the folder; the outside file ``exists`` or not."""
    from safetensors import safe_open
    run = tmp_path / f"{how}_{exists}"
    run.mkdir()
    ckpt = broken_copy(small, run, "sharded")
    outside = run / "outside.safetensors"
    (ckpt / "model.safetensors").rename(outside)
    with safe_open(str(outside), "pt") as f:
        keys = list(f.keys())
    if not exists:
        outside.unlink()
    name = {"absolute": str(outside), "dotdot": "../outside.safetensors", "symlink": "linked.safetensors"}[how]
    if how == "symlink":
        (ckpt / "linked.safetensors").symlink_to(outside)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: name for k in keys}}))
    with pytest.raises(CheckpointError) as err:
        load(ckpt)
    assert f"{name!r} is not inside the checkpoint folder" in str(err.value), err.value
    return str(err.value).replace(str(run), "RUN")


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_a_shard_outside_the_folder_is_refused_alike_whether_it_exists(small, tmp_path, how):
    assert _outside_error(small, tmp_path, how, True) == _outside_error(small, tmp_path, how, False)


def test_shards_inside_the_folder_load(small, tmp_path):
    from safetensors import safe_open
    ckpt = broken_copy(small, tmp_path, "sharded")
    shard = ckpt / "model-00001-of-00001.safetensors"
    (ckpt / "model.safetensors").rename(shard)
    with safe_open(str(shard), "pt") as f:
        index = {"weight_map": {k: shard.name for k in f.keys()}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded, plain = load(ckpt), load(small)
    assert all(torch.equal(a, b) for a, b in zip(sharded.model.state_dict().values(), plain.model.state_dict().values()))


def groot_copy(tmp_path, edit_json=None):
    """A copy of the GR00T N1.7 fixture checkpoint with ``edit_json(name, data)`` applied to its JSON files."""
    from fixture_sets import require_groot_fixture
    src = require_groot_fixture() / "checkpoint"
    dst = tmp_path / "checkpoint"
    shutil.copytree(src, dst)
    for path in dst.glob("*.json"):
        data = json.loads(path.read_text())
        if edit_json is not None and edit_json(path.name, data) is not False:
            path.write_text(json.dumps(data))
    return dst


def load_groot(dst, **folders):
    from fixture_sets import require_groot_fixture
    from phyai_ros.models.groot_n17 import load_groot_checkpoint
    fixture = require_groot_fixture()
    folders = {"base_model": str(fixture / "base_model"), "backbone": str(fixture / "backbone"), **folders}
    return load_groot_checkpoint(dst, **{k: v for k, v in folders.items() if v is not None})


def _groot_state_file_error(tmp_path, exists: bool) -> str:
    """The error of loading a GR00T copy whose pack step names its state file by '..' (present there or not)."""
    run = tmp_path / str(exists)
    run.mkdir()

    def edit(name, data):
        if name != "policy_preprocessor.json":
            return False
        for step in data["steps"]:
            if step.get("state_file"):
                step["state_file"] = "../stats.safetensors"
    dst = groot_copy(run, edit)
    if exists:
        shutil.copy(next(dst.glob("policy_preprocessor_step_*.safetensors")), run / "stats.safetensors")
    with pytest.raises(CheckpointError, match="state_file '../stats.safetensors' is not inside the checkpoint folder") \
            as err:
        load_groot(dst)
    return str(err.value).replace(str(run), "RUN")


def test_a_groot_state_file_outside_the_folder_is_refused_alike_whether_it_exists(tmp_path):
    assert _groot_state_file_error(tmp_path, True) == _groot_state_file_error(tmp_path, False)


@pytest.mark.parametrize("value", ["", 5], ids=["empty", "int"])
def test_a_groot_base_model_path_that_names_no_folder_is_refused(tmp_path, value):
    """An empty base_model_path would be the checkpoint's parent folder; an int where a path belongs is no path."""
    dst = groot_copy(tmp_path, lambda name, d: d.update(base_model_path=value) if name == "config.json" else False)
    with pytest.raises(CheckpointError, match=f"base_model_path must name a folder, got {value!r}"):
        load_groot(dst, base_model=None)


# ------------------------------------------------------------------ config values (issue 22)
def _set(data: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        data = data[key]
    data[last] = value


@pytest.mark.parametrize("name,key,value", [
    ("config.json", "tokenizer_max_length", 1e8), ("config.json", "tokenizer_max_length", 100_000),
    ("config.json", "chunk_size", "50"), ("config.json", "num_inference_steps", 0),
    ("config.json", "max_period", float("nan")),
    ("model_dims.json", "vlm.width", "64"), ("model_dims.json", "siglip.image_size", 1e6),
], ids=["token_budget_float", "token_budget_huge", "chunk_size_str", "steps_zero", "period_nan", "width_str",
        "image_size"])
def test_pi_config_values_are_checked_at_load_naming_the_file_and_key(small, tmp_path, name, key, value):
    ckpt = broken_copy(small, tmp_path)
    data = json.loads((ckpt / name).read_text())
    _set(data, key, value)
    (ckpt / name).write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as err:
        load(ckpt)
    assert f"{ckpt / name}: {key}" in str(err.value), err.value


def test_a_state_shape_of_the_wrong_type_is_named(small, tmp_path):
    ckpt = broken_copy(small, tmp_path)
    data = json.loads((ckpt / "config.json").read_text())
    data["input_features"]["observation.state"]["shape"] = ["8"]
    (ckpt / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="input_features.observation.state.shape must be a list of 1 integers"):
        load(ckpt)


@pytest.mark.parametrize("folder,key,value", [
    ("base_model", "select_layer", "2"), ("base_model", "action_horizon", 1e9),
    ("base_model", "diffusion_model_cfg.num_layers", 2.5), ("backbone", "vision_config.hidden_size", "24"),
    ("backbone", "text_config.rope_parameters.mrope_section", [2, 2]),
], ids=["select_layer", "horizon", "dit_layers", "vision_width", "mrope"])
def test_groot_config_values_are_checked_at_load_naming_the_file_and_key(tmp_path, folder, key, value):
    from fixture_sets import require_groot_fixture
    copy = tmp_path / folder
    shutil.copytree(require_groot_fixture() / folder, copy)
    data = json.loads((copy / "config.json").read_text())
    _set(data, key, value)
    (copy / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as err:
        load_groot(groot_copy(tmp_path), **{"base_model" if folder == "base_model" else "backbone": str(copy)})
    assert f"{copy / 'config.json'}: {key}" in str(err.value), err.value
