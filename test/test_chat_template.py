"""A checkpoint's chat template (models/chat_template.py), read and compiled in one place for GR00T N1.7 and
Cosmos3: where it is read from, and that a hostile one neither reaches Python nor fails without naming itself."""
import json

import jinja2
import pytest

from phyai_ros.models.chat_template import compile_chat_template, read_chat_template
from phyai_ros.models.files import CheckpointError


def test_read_order_jinja_then_chat_template_json_then_tokenizer_config(tmp_path):
    with pytest.raises(CheckpointError, match="no chat template"):
        read_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "from config"}))
    assert read_chat_template(tmp_path) == "from config"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert read_chat_template(tmp_path) == "from json"
    (tmp_path / "chat_template.jinja").write_text("from jinja")
    assert read_chat_template(tmp_path) == "from jinja"


def test_a_non_string_template_entry_is_no_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": ["a", "list"]}))
    with pytest.raises(CheckpointError, match="no chat template"):
        read_chat_template(tmp_path)


def test_rendering_as_transformers_does_and_a_hostile_template_stays_in_the_sandbox():
    t = compile_chat_template("{% for m in messages %}<{{ m.role }}>{{ m.content | tojson }}\n{% endfor %}")
    assert t.render(messages=[{"role": "user", "content": "hi"}]) == '<user>"hi"\n'
    escape = compile_chat_template("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        escape.render()
    refuse = compile_chat_template("{{ raise_exception('no system role') }}")
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system role"):
        refuse.render()
    with pytest.raises(CheckpointError, match="backbone/: chat template does not compile"):
        compile_chat_template("{% for %}", "backbone/")


def test_a_huge_or_binary_template_file_is_refused_naming_it(tmp_path):
    from phyai_ros.models.chat_template import MAX_TEMPLATE_BYTES
    jinja = tmp_path / "chat_template.jinja"
    with open(jinja, "wb") as f:
        f.truncate(MAX_TEMPLATE_BYTES + 1)          # sparse: refused from its size, never read
    with pytest.raises(CheckpointError, match="chat_template.jinja: .* bytes, more than"):
        read_chat_template(tmp_path)
    jinja.write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(CheckpointError, match="chat_template.jinja: not UTF-8"):
        read_chat_template(tmp_path)
