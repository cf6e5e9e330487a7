"""A checkpoint's chat template (models/chat_template.py), read and compiled in one place for GR00T N1.7 and
Cosmos3: where it is read from, and that a hostile one neither reaches Python nor fails without naming itself."""
import json
import re

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


# ------------------------------------------------------------------ the render budget (issue 38, item 5)
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
HUGE_STRING = "{{ 'x' * 500000000 }}"


@pytest.mark.parametrize("template, says", [
    (NESTED_LOOPS, "more than 100,000 steps"),
    (HUGE_STRING, "a value of about 500,000,000 characters"),
    ("{{ 'x'.ljust(500000000) }}", "characters"),
    ("{{ ('x' * 200000) | replace('x', 'yyyyyyyyyy') }}", "'replace'"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~'"),
    ("{% set s = 'x' * 100000 %}{{ [s, s, s] | join }}", "'join'"),
    ("{{ '%0500000000d' % 1 }}", "'%'"),
    ("{{ 7 ** 99999999 }}", "'**'"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests more than 64 calls"),
    ("{% for i in range(3000) %}{{ 'y' * 100 }}{% endfor %}", "renders more than 262,144 characters"),
], ids=["nested_range_loops", "x_times_5e8", "ljust", "replace", "doubling", "join", "format_width", "power",
        "recursion", "output"])
def test_a_render_over_its_budget_is_refused_quickly_naming_the_template(template, says):
    import time
    t = time.monotonic()
    with pytest.raises(CheckpointError, match=f"hostile/: .*{re.escape(says)}"):
        compile_chat_template(template, "hostile/").render()
    assert time.monotonic() - t < 3.0


def test_a_chat_template_s_budget_leaves_real_prompts_alone():
    from phyai_ros.models.cosmos3.checkpoint import CHATML
    messages = [{"role": "system", "content": "You are a robot."}, {"role": "user", "content": "pick up " * 2000}]
    out = compile_chat_template(CHATML).render(messages=messages, add_generation_prompt=True)
    assert out.count("pick up") == 2000 and out.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [NESTED_LOOPS, HUGE_STRING], ids=["nested_range_loops", "x_times_5e8"])
def test_a_checkpoint_whose_template_is_over_budget_is_refused_at_load_naming_the_file(tmp_path, template):
    from phyai_ros.models.cosmos3.checkpoint import write_byte_tokenizer
    from phyai_ros.models.cosmos3.prompt import ChatTokenizer
    folder = write_byte_tokenizer(tmp_path / "text_tokenizer")
    ChatTokenizer(folder)   # the ChatML template loads
    (folder / "chat_template.jinja").write_text(template)
    with pytest.raises(CheckpointError, match=f"{folder}'s chat template: the chat template"):
        ChatTokenizer(folder)
