"""A checkpoint's chat template: read from its tokenizer folder and compiled as transformers renders it.

The template is text from outside, so it runs in jinja2's immutable sandbox (no attribute or Python access
beyond plain data) with transformers' rendering options: trim / lstrip blocks, loop controls, a ``tojson``
filter and ``raise_exception``. GR00T N1.7's Qwen3-VL backbone and Cosmos3's text tokenizer both read theirs
through here.

The sandbox blocks access, not work: two nested ``range(100000)`` loops ran for minutes, ``'x' * 500000000``
took gigabytes. So every render runs under a budget (``render``): at most ``MAX_RENDER_STEPS`` template lines
and ``MAX_RENDER_SECONDS`` (a trace function on the template's own frames, which also caps macro recursion at
``MAX_RENDER_DEPTH``), and no string or list it makes, nor its output, beyond ``MAX_RENDER_CHARS``: operators,
``~``, method calls and filters whose result would be larger are refused before they allocate (repetition, powers,
concatenation, padding widths, ``replace`` / ``join`` / ``indent`` / ``expandtabs`` / ``wordwrap`` growth, format
widths). A render over budget is a CheckpointError naming the template; the families render once at load
(``check_renders``) so such a template is refused there. Prompts are a few KB and render in well under a
millisecond; the budget is thousands of times that.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time
from pathlib import Path

from .files import CheckpointError, fixed_file, read_json

TEMPLATE_FILES = ("chat_template.json", "tokenizer_config.json")   # after chat_template.jinja, in this order
MAX_TEMPLATE_BYTES = 1 << 20   # a chat template is a few KB; a larger file is refused before it is read
MAX_RENDER_STEPS = 100_000     # template lines executed in one render (a chat prompt takes a few hundred)
MAX_RENDER_SECONDS = 2.0
MAX_RENDER_DEPTH = 64          # nested template frames (macros calling macros)
MAX_RENDER_CHARS = 1 << 18     # a rendered prompt, and any one string or list a render makes
_TEMPLATE_FILE = "<template>"  # the file name jinja2 compiles a template from a string under
_WIDE_FORMAT = re.compile(r"\d{7,}|[%{][^a-zA-Z%}]*\*")   # a format width of 7+ digits, or one taken from an argument


def read_chat_template(folder) -> str:
    """chat_template.jinja, else chat_template.json's or tokenizer_config.json's ``chat_template`` string."""
    folder = Path(folder)
    jinja = fixed_file(folder, "chat_template.jinja")
    if jinja.is_file():
        size = jinja.stat().st_size
        if size > MAX_TEMPLATE_BYTES:
            raise CheckpointError(f"{jinja}: {size} bytes, more than a chat template's {MAX_TEMPLATE_BYTES}")
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{jinja}: not UTF-8 text ({exc})") from None
    for name in TEMPLATE_FILES:
        p = fixed_file(folder, name)
        if p.is_file():
            template = read_json(p).get("chat_template")
            if isinstance(template, str) and template:
                return template
    raise CheckpointError(f"{folder}: no chat template (chat_template.jinja, chat_template.json or "
                          "tokenizer_config.json's chat_template)")


class RenderBudgetError(CheckpointError):
    """A render that went over its budget (steps, time, depth or size): the template's fault, never the prompt's."""


def _size(value, limit: int = MAX_RENDER_CHARS) -> int:
    """Characters / items a value holds (strings and containers, nested), counted until past ``limit``."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        total = len(value)
        for item in (value.items() if isinstance(value, dict) else value):
            if total > limit:
                break
            total += _size(item, limit - total) if isinstance(item, (str, bytes, list, tuple, dict)) else 0
        return total
    return 0


def _predicted(name: str, args: tuple, kwargs: dict):
    """The size an operation named ``name`` (a filter, a str method or an operator) would make, where it can grow
    beyond its arguments; None where it cannot (the result is checked after)."""
    values = list(args) + list(kwargs.values())
    ints = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    big_int = max(ints, default=0)
    first = args[0] if args else ""
    text = len(first) if isinstance(first, str) else _size(first)
    if name in ("*",):
        seq = [v for v in args if isinstance(v, (str, bytes, list, tuple))]
        return _size(seq[0]) * big_int if seq and ints else None
    if name == "**":
        return big_int if len(ints) == 2 and min(ints) > 1 else None   # a huge exponent: refused as a size
    if name in ("replace",) and len(args) >= 3 and isinstance(first, str):
        old, new = str(args[1]), str(args[2])
        return len(first) + (first.count(old) if old else len(first) + 1) * max(len(new) - len(old), 0)
    if name in ("expandtabs", "indent"):
        return (text + 1) * (big_int + 1) + sum(len(v) for v in values[1:] if isinstance(v, str))
    if name in ("join", "wordwrap"):
        sep = max((len(v) for v in values[1:] if isinstance(v, str)), default=0)
        return _size(first) * (sep + 1) + big_int
    if name in ("%", "format", "format_map") and any(isinstance(v, str) and _WIDE_FORMAT.search(v) for v in values):
        return MAX_RENDER_CHARS + 1   # a width the template or its arguments choose: refused
    return max(big_int, sum(_size(v) for v in values))


def _check(name: str, size, source: str) -> None:
    if size is not None and size > MAX_RENDER_CHARS:
        raise RenderBudgetError(f"{source}: the chat template makes a value of about {size:,} characters "
                                f"({name!r}), more than a render's {MAX_RENDER_CHARS:,}")


class _Budget:
    """One render's steps, depth and deadline, kept by a trace function on the template's own frames (jinja2
    compiles a template to Python, so its loops and macro calls are lines and calls there)."""

    def __init__(self, source: str):
        self.source, self.steps, self.depth = source, 0, 0
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS

    def trace(self, frame, event, arg):
        if frame.f_code.co_filename != _TEMPLATE_FILE:
            return None
        self.depth += 1
        if self.depth > MAX_RENDER_DEPTH:
            raise RenderBudgetError(f"{self.source}: the chat template nests more than {MAX_RENDER_DEPTH} calls")
        return self.local

    def local(self, frame, event, arg):
        if event == "return":
            self.depth -= 1
        elif event == "line":
            self.steps += 1
            if self.steps > MAX_RENDER_STEPS:
                raise RenderBudgetError(f"{self.source}: the chat template runs more than {MAX_RENDER_STEPS:,} steps "
                                        "for one prompt")
            if not self.steps & 255 and time.monotonic() > self.deadline:
                raise RenderBudgetError(f"{self.source}: the chat template renders for more than "
                                        f"{MAX_RENDER_SECONDS:g} s")
        return self.local


class ChatTemplate:
    """A compiled template whose ``render`` runs under the budget (module docstring)."""

    def __init__(self, template, source: str):
        self.template, self.source = template, source

    def render(self, **context) -> str:
        budget = _Budget(self.source)
        previous = sys.gettrace()
        sys.settrace(budget.trace)
        try:
            out, size = [], 0
            for piece in self.template.generate(**context):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    raise RenderBudgetError(f"{self.source}: the chat template renders more than "
                                            f"{MAX_RENDER_CHARS:,} characters")
                out.append(piece)
            return "".join(out)
        finally:
            sys.settrace(previous)


def _sandbox(source: str):
    """jinja2's immutable sandbox whose operators, ``~``, calls and filters refuse results over the budget."""
    import jinja2
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame) -> None:   # ``a ~ b``: its result checked where it is made
            self.write("environment.checked_concat(")
            super().visit_Concat(node, frame)
            self.write(")")

    class Sandbox(ImmutableSandboxedEnvironment):
        code_generator_class = Generator
        intercepted_binops = frozenset(("*", "**", "+", "%"))

        def call_binop(self, context, operator, left, right):
            _check(operator, _predicted(operator, (left, right), {}) if operator != "+" else
                   _size(left) + _size(right), source)
            result = super().call_binop(context, operator, left, right)
            _check(operator, _size(result), source)
            return result

        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 - jinja2's own signature
            name = getattr(__obj, "__name__", "call")
            receiver = getattr(__obj, "__self__", None)
            full = (receiver, *args) if isinstance(receiver, (str, list, tuple, dict)) else args
            _check(name, _predicted(name, full, kwargs), source)
            result = super().call(__context, __obj, *args, **kwargs)
            _check(name, _size(result), source)
            return result

        @staticmethod
        def checked_concat(text):
            _check("~", len(text), source)
            return text

    def bounded(name, fn):
        @functools.wraps(fn)   # keeps jinja2's pass_context / pass_eval_context marks
        def call(*args, **kwargs):
            values = args[1:] if getattr(fn, "jinja_pass_arg", None) is not None else args
            _check(name, _predicted(name, values, kwargs), source)
            result = fn(*args, **kwargs)
            _check(name, _size(result), source)
            return result
        return call

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                ensure_ascii=ensure_ascii)
    env.filters = {name: bounded(name, fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    return env


@functools.lru_cache(maxsize=8)
def compile_chat_template(template: str, source: str = "the chat template") -> ChatTemplate:
    """The sandboxed, budgeted template (compiled once per text); a template that does not compile is a
    CheckpointError naming ``source``."""
    import jinja2

    try:
        return ChatTemplate(_sandbox(source).from_string(template), source)
    except jinja2.exceptions.TemplateError as exc:
        raise CheckpointError(f"{source}: chat template does not compile ({exc})") from None


def check_renders(template: ChatTemplate, **context) -> str:
    """Render once at load with a representative prompt: a template over its budget is refused there, naming its
    file, instead of failing every prompt. Its own errors (``raise_exception``, the sandbox's) are the template's
    business with that prompt and are left to the prompts."""
    import jinja2

    try:
        return template.render(**context)
    except jinja2.exceptions.TemplateError:
        return ""
