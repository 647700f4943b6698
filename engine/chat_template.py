"""ChatTemplate: a model's chat template, compiled in a sandboxed Jinja environment that bounds its work.

Chat templates come with downloaded models and are untrusted code. The sandbox keeps them away
from Python internals; the bounds here keep one from spending minutes and gigabytes on a prompt
(`{{ 'A' * 10**10 }}`, loops in loops). Every loop iteration, call, filter and intercepted
operator is a step; the characters operations read and build count against a work budget; no
value may outgrow the render limit; and operations that build much more than they are given
(repetition, powers, padding widths, replace, join, indent) are refused before they run when
their result would pass it.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from engine.errors import UserError

# The render limit is the messages' own text plus an allowance for what the template adds: per
# token of context (a prompt past the context is refused after rendering anyway), and at least
# MIN_ALLOWANCE. Real templates add a few kilobytes; tool descriptions, tens.
ALLOWANCE_PER_TOKEN = 64
MIN_ALLOWANCE = 1 << 20
MAX_STEPS = 200_000  # real templates take a few dozen steps per message
WORK_FACTOR = 32  # characters read and built in all, as a multiple of the render limit
MAX_SECONDS = 3.0  # a backstop for work no counter sees
MAX_INT_BITS = 1 << 16  # integers a template may build: far past any count, id or timestamp
MAX_RANGE = 100_000  # what Jinja's own sandbox allows range()

# Integer arguments that are widths or counts: each can pad a string to that many characters.
_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate", "batch", "slice", "tojson"})
# Widths and precisions in %-formats and format specs.
_PERCENT_WIDTHS = re.compile(r"%[#0\- +]*(\d*)(?:\.(\d*))?")
_FORMAT_WIDTHS = re.compile(r"\{[^{}]*?:[^{}\d]*(\d*)(?:\.(\d*))?[^{}]*\}")


class TemplateLimitError(UserError):
    """A chat template that passes the render bounds: broken or hostile."""

    def __init__(self, what: str):
        super().__init__(f"the model's chat template {what}; the template is broken or hostile: "
                         "fix its chat_template or use another model")


def render_limit(messages: list[dict], max_len: int | None) -> int:
    """The most characters a render may produce, and any value in it hold."""
    text = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
    return text + max(MIN_ALLOWANCE, ALLOWANCE_PER_TOKEN * (max_len or 0))


@dataclass
class _Budget:
    """What one render may still spend."""

    max_chars: int
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    steps: int = 0
    work: int = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"takes more than {MAX_STEPS:,} steps")
        if not self.steps & 255 and time.monotonic() > self.deadline:
            raise TemplateLimitError(f"runs for more than {MAX_SECONDS:g} s")

    def read(self, n: int) -> None:
        self.work += n
        if self.work > WORK_FACTOR * self.max_chars:
            raise TemplateLimitError(f"handles more than {WORK_FACTOR * self.max_chars:,} characters")

    def built(self, value) -> None:
        """Counts a value an operation returned; refuses one past the render limit."""
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"builds a {value.bit_length():,}-bit integer")
        n = _size(value)
        self.expect(n, "builds a value")
        self.read(n)

    def expect(self, n: int, what: str) -> None:
        """Refuses an operation whose result would hold `n` items."""
        if n > self.max_chars:
            raise TemplateLimitError(f"{what} of {n:,} items (limit {self.max_chars:,})")

    def widths(self, values) -> None:
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.max_chars:
                raise TemplateLimitError(f"asks for a width or count of {_describe(v)} (limit {self.max_chars:,})")


def _size(value) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def _deep_size(value) -> int:
    """Items a repetition of `value` copies or later prints: a list of long strings counts them too."""
    if isinstance(value, (list, tuple)):
        return len(value) + sum(_size(v) for v in value)
    return _size(value)


def _describe(v: int) -> str:
    return f"{v:,}" if v.bit_length() < 64 else f"a {v.bit_length():,}-bit number"


def _format_widths(fmt: str, pattern: re.Pattern) -> int:
    return sum(int(w or 0) + int(p or 0) for w, p in pattern.findall(fmt))


def _expected_size(name: str, base, args: tuple, kwargs: dict) -> int:
    """The size the str method or filter `name` would return (0 when it cannot build much more
    than it is given)."""
    arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name in ("join", "sum") and isinstance(base, (list, tuple)):  # the filters
        sep = arg(0, "d", "")
        return _deep_size(base) + (len(sep) * len(base) if isinstance(sep, str) else 0)
    if not isinstance(base, str):
        return 0
    if name == "join" and isinstance(arg(0, ""), (list, tuple, str)):  # str.join
        items = arg(0, "")
        return _deep_size(items) + len(base) * len(items)
    if name == "replace" and isinstance(arg(0, "old"), str) and isinstance(arg(1, "new"), str):
        old, new = arg(0, "old"), arg(1, "new")
        return len(base) + (base.count(old) if old else len(base) + 1) * len(new)
    if name == "indent":
        width = arg(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        return len(base) + (base.count("\n") + 1) * pad
    if name == "wordwrap":
        width, wrap = arg(0, "width", 79), arg(2, "wrapstring") or "\n"
        return len(base) + (len(base) // max(width, 1) + 1) * len(wrap) if isinstance(width, int) else 0
    if name == "expandtabs":
        size = arg(0, "tabsize", 8)
        return len(base) + base.count("\t") * size if isinstance(size, int) else 0
    if name in ("ljust", "rjust", "center", "zfill"):
        width = arg(0, "width", 0)
        return max(len(base), width) if isinstance(width, int) else 0
    if name in ("format", "format_map"):
        return len(base) + _format_widths(base, _FORMAT_WIDTHS)
    return 0


@functools.cache
def _environment_class():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %} tag: renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Counted:
        """A loop's iterable whose items are steps; its length stays known for `loop.last`."""

        def __init__(self, seq, budget: _Budget):
            self.seq, self.budget = seq, budget

        def __len__(self):
            return len(self.seq)

        def __iter__(self):
            for item in self.seq:
                self.budget.step()
                yield item

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def __init__(self):
            super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=self._output,
                             extensions=[Generation, jinja2.ext.loopcontrols])
            self._local = threading.local()
            self.filters["tojson"] = _tojson
            self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
            self.filters["localchat_counted"] = jinja2.pass_environment(lambda env, seq: Counted(seq, env.budget))
            self.globals.update(raise_exception=_raise_exception, range=self._range, lipsum=self._lipsum,
                                strftime_now=lambda fmt: datetime.now().strftime(fmt))

        @property
        def budget(self) -> _Budget:
            """The budget of the render in progress on this thread (constant folding at compile
            time gets a fresh one: a refusal there just leaves the expression to render time)."""
            return getattr(self._local, "budget", None) or _Budget(max_chars=MIN_ALLOWANCE)

        def render_bounded(self, template, max_chars: int, variables: dict) -> str:
            self._local.budget = budget = _Budget(max_chars=max_chars)
            try:
                out, size = [], 0
                for chunk in template.generate(**variables):
                    size += len(chunk)
                    budget.expect(size, "renders a prompt")
                    out.append(chunk)
                return "".join(out)
            finally:
                self._local.budget = None

        def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
            """Every for loop counts its iterations as steps."""
            if isinstance(source, str):
                source = self.parse(source, name, filename)
            for loop in source.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, "localchat_counted", [], [], None, None)
            return super().compile(source, name, filename, raw, defer_init)

        # --- the sandbox's hooks ------------------------------------------------------------
        def _output(self, value):
            budget = self.budget
            budget.expect(_deep_size(value), "prints a value")
            budget.read(len(value if isinstance(value, str) else str(value)))
            return value

        def call_binop(self, context, operator, left, right):
            budget = self.budget
            budget.step()
            _check_binop(budget, operator, left, right)
            result = super().call_binop(context, operator, left, right)
            budget.built(result)
            return result

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's signature)
            budget = __self.budget
            budget.step()
            for value in (*args, *kwargs.values()):
                budget.expect(_size(value), "passes a value")
            method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
            base, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
            if isinstance(base, str):
                budget.read(len(base))
                if name in _WIDTH_METHODS or (name in ("format", "format_map") and "{:{" in base.replace(" ", "")):
                    budget.widths((*args, *kwargs.values()))
                budget.expect(_expected_size(name, base, args, kwargs), f"calls str.{name} for a result")
            result = super().call(__context, __obj, *args, **kwargs)
            budget.built(result)
            return result

        def getattr(self, obj, attribute):
            """A value read back from a namespace or a dict is checked again: `ns.x ~ ns.x` in a
            loop doubles a string without any hooked operation."""
            value = super().getattr(obj, attribute)
            self.budget.expect(_size(value), "holds a value")
            return value

        def getitem(self, obj, argument):
            value = super().getitem(obj, argument)
            self.budget.expect(_size(value), "holds a value")
            return value

        def _range(self, *args):
            try:
                n = len(range(*args))
            except OverflowError:
                n = MAX_RANGE + 1
            if n > MAX_RANGE:
                raise TemplateLimitError(f"asks for a range of more than {MAX_RANGE:,} numbers")
            return range(*args)

        def _lipsum(self, n=5, html=True, min=20, max=100):  # noqa: A002 (Jinja's own names)
            from jinja2.utils import generate_lorem_ipsum

            self.budget.expect(n * max if isinstance(n, int) and isinstance(max, int) else 0, "asks for lorem ipsum")
            return generate_lorem_ipsum(n, html, min, max)

        def _bounded_filter(self, name, f):
            @functools.wraps(f)  # keeps the pass_context/pass_environment mark Jinja dispatches on
            def bounded(*args, **kwargs):
                budget = self.budget
                budget.step()
                leading = getattr(f, "jinja_pass_arg", None) is not None
                value, rest = (args[1], args[2:]) if leading else (args[0], args[1:])
                budget.read(_size(value))
                if name in _WIDTH_FILTERS or (name == "format" and "*" in str(value)):
                    budget.widths((*rest, *kwargs.values()))
                if name == "format" and isinstance(value, str):
                    budget.expect(len(value) + _format_widths(value, _PERCENT_WIDTHS), "formats a string")
                budget.expect(_expected_size(name, value, rest, kwargs), f"uses the {name} filter for a result")
                result = f(*args, **kwargs)
                budget.built(result)
                return result

            return bounded

    return BoundedEnvironment


def _check_binop(budget: _Budget, operator: str, left, right) -> None:
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
    if operator == "*" and ints:
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError("multiplies integers past the size limit")
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                budget.expect(_deep_size(seq) * max(n, 0), "repeats a value to a size")
    elif operator == "**" and ints and right > 0 and abs(left) > 1:
        if left.bit_length() * right > MAX_INT_BITS:
            raise TemplateLimitError("raises an integer to a power past the size limit")
    elif operator == "%" and isinstance(left, str):
        values = right if isinstance(right, tuple) else (right,)
        if "*" in left:
            budget.widths(values)
        budget.expect(len(left) + _format_widths(left, _PERCENT_WIDTHS) + sum(_size(v) for v in values),
                      "formats a string")
    elif operator == "+":
        budget.expect(_size(left) + _size(right), "concatenates a value")


def _raise_exception(message):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers' environment has it: no HTML escaping, and the options templates pass.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template; `render` raises UserError for a template that fails or passes
    the bounds (its own `raise_exception` included: templates use it to refuse a conversation)."""

    def __init__(self, source: str):
        import jinja2

        self.env = _environment_class()()
        try:
            self.template = self.env.from_string(source)
        except (jinja2.TemplateError, ValueError, RecursionError) as e:
            raise UserError(f"the model's chat template does not compile: {_first_line(e)}") from None

    def render(self, max_chars: int, **variables) -> str:
        import jinja2

        try:
            return self.env.render_bounded(self.template, max_chars, variables)
        except RecursionError:
            raise TemplateLimitError("recurses too deeply") from None
        except MemoryError:
            raise TemplateLimitError("runs out of memory") from None
        except (jinja2.TemplateError, OverflowError) as e:
            raise UserError(f"the model's chat template failed: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
