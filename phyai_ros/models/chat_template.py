"""A checkpoint's chat template: read from its tokenizer folder and compiled as transformers renders it.

The template is text from outside, so it runs in jinja2's immutable sandbox (no attribute or Python access
beyond plain data) with transformers' rendering options: trim / lstrip blocks, loop controls, a ``tojson``
filter and ``raise_exception``. GR00T N1.7's Qwen3-VL backbone and Cosmos3's text tokenizer both read theirs
through here.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .files import CheckpointError, read_json

TEMPLATE_FILES = ("chat_template.json", "tokenizer_config.json")   # after chat_template.jinja, in this order
MAX_TEMPLATE_BYTES = 1 << 20   # a chat template is a few KB; a larger file is refused before it is read


def read_chat_template(folder) -> str:
    """chat_template.jinja, else chat_template.json's or tokenizer_config.json's ``chat_template`` string."""
    folder = Path(folder)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        size = jinja.stat().st_size
        if size > MAX_TEMPLATE_BYTES:
            raise CheckpointError(f"{jinja}: {size} bytes, more than a chat template's {MAX_TEMPLATE_BYTES}")
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{jinja}: not UTF-8 text ({exc})") from None
    for name in TEMPLATE_FILES:
        p = folder / name
        if p.is_file():
            template = read_json(p).get("chat_template")
            if isinstance(template, str) and template:
                return template
    raise CheckpointError(f"{folder}: no chat template (chat_template.jinja, chat_template.json or "
                          "tokenizer_config.json's chat_template)")


@functools.lru_cache(maxsize=8)
def compile_chat_template(template: str, source: str = "the chat template"):
    """The sandboxed jinja2 template (compiled once per text); a template that does not compile is a
    CheckpointError naming ``source``."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as exc:
        raise CheckpointError(f"{source}: chat template does not compile ({exc})") from None
