"""Broken model files fail at load time with a message naming the file (or the tensor), never a bare
library error: truncated safetensors, non-JSON config / dims / stats, empty or corrupt tokenizer, weights
holding NaN, a pi0 label on pi0.5 weights, and a policy whose warm-up chunk is not finite."""
import json
import shutil

import pytest
import torch

from node_harness import make_small_checkpoint, require_tokenizer
from phyai_ros.models.files import CheckpointError
from phyai_ros.models.pi0 import Pi0Adapter
from phyai_ros.models.pi05 import Pi05Adapter


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
    from phyai_ros.models.common.paligemma_keys import UNUSED_KEYS
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
