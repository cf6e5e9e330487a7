"""Hostile checkpoint files (issue 38, item 8): a fixed-name file (config.json, model.safetensors, norm_stats.json,
tokenizer.json, ...) that is a symlink leading out of its checkpoint folder is refused, with one error whether
the target exists or not (a checkpoint can neither read nor probe files elsewhere); a malformed tokenizer.json
is an error naming the file, never a bare KeyError / TypeError."""
import json
import os

import pytest

from phyai_ros.fixtures import make_small_checkpoint, require_tokenizer
from phyai_ros.models.bpe import ByteLevelBPE, TokenizerError
from phyai_ros.models.pi.lerobot_checkpoint import read_lerobot_checkpoint
from phyai_ros.models.cosmos3.checkpoint import write_byte_tokenizer
from phyai_ros.models.cosmos3.prompt import ChatTokenizer
from phyai_ros.models.contract import ModelFiles
from phyai_ros.models.files import CheckpointError
from phyai_ros.models.pi.pi05.adapter import Pi05Adapter


def _relink(path, target) -> None:
    path.unlink()
    os.symlink(target, path)


def _refusal(load, path, outside) -> str:
    """The error ``load()`` raises with ``path`` linked to an existing file outside, and to a missing one."""
    messages = []
    for target in (outside, outside.with_name("missing.json")):
        _relink(path, target)
        with pytest.raises(CheckpointError) as err:
            load()
        messages.append(str(err.value))
    assert messages[0] == messages[1], messages   # nothing tells whether the target exists
    assert "not inside the checkpoint folder" in messages[0] and str(outside.parent) not in messages[0], messages
    return messages[0]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_checkpoint_file_linking_outside_is_refused_alike_whether_its_target_exists(tmp_path, name):
    ckpt = make_small_checkpoint(tmp_path / "ckpt" / "pi05", horizon=10)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    outside.write_bytes((ckpt / name).read_bytes())
    says = _refusal(lambda: read_lerobot_checkpoint(ckpt, "pi05"), ckpt / name, outside)
    assert name in says


def test_a_norm_stats_link_outside_is_refused_and_a_link_inside_is_fine(tmp_path):
    ckpt = make_small_checkpoint(tmp_path / "ckpt" / "pi05", horizon=10)
    stats = ckpt / "norm_stats.json"
    if not stats.exists():
        pytest.skip("the small checkpoint keeps its statistics elsewhere")
    inside_copy = ckpt / "stats_copy.json"
    inside_copy.write_bytes(stats.read_bytes())
    _relink(stats, inside_copy.name)   # a link inside the folder: loads
    Pi05Adapter.load(ckpt, ModelFiles.of(require_tokenizer()))
    outside = tmp_path / "elsewhere" / "norm_stats.json"
    outside.parent.mkdir()
    outside.write_bytes(inside_copy.read_bytes())
    _refusal(lambda: Pi05Adapter.load(ckpt, ModelFiles.of(require_tokenizer())), stats, outside)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
def test_a_tokenizer_folder_s_links_outside_are_refused(tmp_path, name):
    folder = write_byte_tokenizer(tmp_path / "ckpt" / "text_tokenizer")
    ChatTokenizer(folder)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    outside.write_bytes((folder / name).read_bytes())
    _refusal(lambda: ChatTokenizer(folder), folder / name, outside)


@pytest.mark.parametrize("edit, says", [
    (lambda spec: [spec], "JSON list, not an object"),
    (lambda spec: {**spec, "model": {**spec["model"], "vocab": None}}, "TypeError"),
    (lambda spec: {k: v for k, v in spec.items() if k != "model"} | {"model": {"type": "BPE"}}, "KeyError"),
    (lambda spec: {**spec, "model": {**spec["model"], "vocab": {"a": "one"}}}, "model.vocab must map"),
    (lambda spec: {**spec, "model": {**spec["model"], "merges": [7]}}, "TypeError"),
    (lambda spec: {**spec, "added_tokens": [{"id": 3}]}, "KeyError"),
    (lambda spec: {**spec, "normalizer": "NFC"}, "AttributeError"),
    (lambda spec: {**spec, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "behavior": "Isolated", "pattern": {"Regex": "(("}}, {"type": "ByteLevel"}]}}, "error"),
], ids=["list", "vocab_null", "no_vocab", "vocab_types", "merge_int", "added_no_content", "normalizer_str", "regex"])
def test_a_malformed_tokenizer_json_is_an_error_naming_the_file(tmp_path, edit, says):
    folder = write_byte_tokenizer(tmp_path / "tok")
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(TokenizerError, match=f"{path}: .*{says}"):
        ByteLevelBPE(path)
