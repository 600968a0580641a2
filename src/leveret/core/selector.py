"""JMS message selectors (JMS 1.1 §3.8.1), as ActiveMQ 5.17 evaluates them.

``compile_selector(text)`` parses a selector once into Python closures;
``selector.matches(lookup)`` evaluates it per message, with ``lookup(name)`` giving a
property's value (str, int, float, bool) or None when absent (:func:`message_lookup`
builds one from a core :class:`~leveret.core.message.Message`). Used by STOMP
subscriptions (``selector`` header) and AMQP consumers (``x-selector`` argument).

The grammar, loosest first: ``OR``; ``AND``; ``NOT``; comparisons (``= <> < > <= >=``,
``[NOT] BETWEEN a AND b``, ``[NOT] LIKE 'p' [ESCAPE 'c']``, ``[NOT] IN ('a', …)``,
``IS [NOT] NULL``); ``+ -``; ``* /``; unary ``+ -``; literals, identifiers, parentheses.
Keywords are case-insensitive, identifiers are not. Logic is SQL's three-valued one: a
comparison with NULL (a missing property) is unknown, ``NOT`` unknown is unknown,
``AND``/``OR`` follow the JMS truth tables, and a message matches only when the whole
selector is TRUE.

What ActiveMQ 5.17 does, read in its sources (activemq-client: grammar/SelectorParser.jj,
filter/ComparisonExpression.java, UnaryExpression.java, ConstantExpression.java,
PropertyExpression.java; activemq-stomp: transport/stomp/ProtocolConverter.java), and
followed here (how values compare: :mod:`leveret.core.selector_values`):

- STOMP strings: ProtocolConverter prefixes every STOMP selector with
  ``convert_string_expressions:``, which makes ComparisonExpression.compare read a string
  compared with a number or boolean as that type (Integer.valueOf against an int,
  Double.valueOf against a float, Boolean.valueOf); a string that does not parse makes
  the comparison FALSE. So header ``count:5`` matches ``count > 3``; ``count:5.5`` does
  not (no int) but matches ``count > 3.0``. Only comparisons and BETWEEN convert, not IN,
  LIKE, arithmetic or a bare property; other protocols never convert. Hence
  ``convert_strings=True`` for STOMP subscriptions only.
- ``< > <= >=`` and BETWEEN reject string, boolean and NULL literals and boolean
  expressions; ``=``/``<>`` reject NULL, and a boolean literal against another literal.
  LIKE takes a string literal pattern and a one-character ESCAPE; IN a property on its
  left and string literals. A selector (and each operand of AND, OR, NOT) must be
  boolean: a bare property is TRUE only when it holds the boolean true.
- Literals: decimal (optional ``L``), hex ``0x…``, octal ``0…`` (hex and octal within a
  Java long), floats ``1.``, ``.5``, ``1e3``; ``--`` comments to a line end, ``/* */``.
- JMS header names (JMSPriority, …) shadow properties of the same name.

Deliberately unlike ActiveMQ: ``NOT`` binds below comparisons as JMS §3.8.1.2 says
(``NOT a = 1`` is ``NOT (a = 1)``; ActiveMQ's grammar makes NOT unary, so there it is
``(NOT a) = 1``), and all comparison operators share one level (ActiveMQ puts ``=``,
``<>`` below ``<``…). Also accepted: Unicode (Java) identifiers, ``L`` on hex and
octal, ``f``/``d`` suffixes. Not supported: XPATH/XQUERY, ActiveMQ's functions (REGEX,
INLIST…) and its ``%`` (modulo).

Bounded work: at most :data:`MAX_LENGTH` characters and :data:`MAX_NESTING` levels of
parentheses, NOT and signs; LIKE matches in O(len(value) × len(pattern)) (no regex
backtracking). Compiling any string gives a :class:`Selector` or raises SelectorError.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from leveret.core.selector_lookup import message_lookup
from leveret.core.selector_values import ARITHMETIC, OUTCOMES, LikePattern, is_number, test

__all__ = [
    "MAX_LENGTH",
    "MAX_NESTING",
    "Lookup",
    "Selector",
    "SelectorError",
    "compile_selector",
    "message_lookup",
]

MAX_LENGTH = 4096
MAX_NESTING = 64
_MAX_TREE = 4 * MAX_NESTING  # operators deep (chains of comparisons or arithmetic)

Lookup = Callable[[str], Any]
_Fn = Callable[[Lookup], Any]


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SelectorError(ValueError):
    """An invalid selector: ``str(error)`` is ``invalid selector '<text>': <detail>``;
    ``position`` is the 0-based offset of the offending token (None if none); long
    selectors and tokens are shown cut to 80 characters."""

    def __init__(self, selector: str, detail: str, position: int | None = None) -> None:
        super().__init__(f"invalid selector '{_short(selector)}': {detail}")
        self.selector, self.detail, self.position = selector, detail, position


class Selector:
    """A compiled selector. ``evaluate(lookup)`` gives True, False or None (unknown);
    ``matches(lookup)`` is True only when it is True."""

    __slots__ = ("_fn", "convert_strings", "text")

    def __init__(self, text: str, fn: _Fn, convert_strings: bool) -> None:
        self.text, self._fn, self.convert_strings = text, fn, convert_strings

    def evaluate(self, lookup: Lookup) -> bool | None:
        return self._fn(lookup)

    def matches(self, lookup: Lookup) -> bool:
        return self._fn(lookup) is True

    def __repr__(self) -> str:
        return f"<Selector {self.text!r}>"


@functools.lru_cache(maxsize=256)
def compile_selector(text: str, *, convert_strings: bool = False) -> Selector:
    """The :class:`Selector` for ``text`` (memoised). ``convert_strings``: compare
    strings with numbers and booleans as ActiveMQ's STOMP transport does (see the module
    doc). Raises SelectorError for an invalid selector, and for nothing else."""
    if len(text) > MAX_LENGTH:
        raise SelectorError(text, f"longer than {MAX_LENGTH} characters")
    try:
        return Selector(text, _Parser(text, convert_strings).parse(), convert_strings)
    except RecursionError:  # a deep caller stack; the nesting limits keep ours shallow
        raise SelectorError(text, "nested too deeply") from None


# -- tokens ----------------------------------------------------------------------------
_KEYWORDS = frozenset(("NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE", "TRUE", "FALSE", "NULL"))
_EXP = r"(?:[eE][+-]?[0-9]+)"
_TOKEN = re.compile(
    rf"""(?P<space>\s+|--[^\r\n]*(?:\r\n|\r|\n)|/\*.*?\*/)
    |(?P<hex>0[xX][0-9a-fA-F]+[lL]?)
    |(?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+){_EXP}?[fFdD]?|[0-9]+(?:{_EXP}[fFdD]?|[fFdD]))
    |(?P<int>[0-9]+[lL]?)
    |(?P<str>'(?:[^']|'')*'(?!'))
    |(?P<id>(?:[^\W\d]|\$)[\w$]*)
    |(?P<op><>|<=|>=|[=<>+\-*/(),])""",
    re.VERBOSE | re.DOTALL,
)


def logic_of(fns: tuple[_Fn, ...], stop: bool) -> Callable[[Lookup], bool | None]:
    """JMS's three-valued OR (``stop`` True) or AND (``stop`` False) of the conditions
    ``fns``: ``stop`` as soon as one gives it, else None (unknown) when one gave None,
    else ``not stop``."""

    def fn(lookup: Lookup) -> bool | None:
        unknown = False
        for f in fns:
            r = f(lookup)
            if r is stop:
                return stop
            unknown = unknown or r is None
        return None if unknown else not stop

    return fn


class _Token(NamedTuple):
    kind: str  # id, kw, num, str, op, end
    value: Any
    pos: int
    text: str


def _tokenize(text: str) -> list[_Token]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            what = "unterminated string" if text[pos] == "'" else f"unexpected character {text[pos]!r}"
            raise SelectorError(text, f"{what} at position {pos}", pos)
        kind, word = m.lastgroup or "", m.group()
        if kind == "id" and word.isascii() and word.upper() in _KEYWORDS:
            tokens.append(_Token("kw", word.upper(), pos, word))
        elif kind in ("hex", "int"):
            tokens.append(_Token("num", _integer(text, word, pos), pos, word))
        elif kind == "float":
            tokens.append(_Token("num", float(word.rstrip("fFdD")), pos, word))
        elif kind == "str":
            tokens.append(_Token("str", word[1:-1].replace("''", "'"), pos, word))
        elif kind != "space":
            tokens.append(_Token(kind, word, pos, word))
        pos = m.end()
    tokens.append(_Token("end", None, len(text), ""))
    return tokens


def _integer(text: str, word: str, pos: int) -> int:
    digits = word.rstrip("lL")
    try:
        if digits[:2] in ("0x", "0X"):
            value = int(digits[2:], 16)
        else:
            value = int(digits, 8 if digits.startswith("0") else 10)
    except ValueError:
        raise SelectorError(text, f"invalid number '{_short(word)}' at position {pos}", pos) from None
    if value >= 2**63 and digits[0] not in "123456789":  # hex and octal are Java longs
        raise SelectorError(text, f"number out of range '{_short(word)}' at position {pos}", pos)
    return value


# -- the parser: recursive descent, one closure per node ---------------------------------
# Node kinds, named as errors show them.
_BOOL, _TF, _NULL = "a boolean expression", "a boolean literal", "NULL"
_NUM, _STR, _PROP, _VAL = "a numeric literal", "a string literal", "a property", "an arithmetic expression"


class _Node(NamedTuple):
    fn: _Fn
    kind: str
    pos: int
    depth: int = 1


class _Parser:
    def __init__(self, text: str, convert: bool) -> None:
        self.text, self.convert = text, convert
        self.tokens = _tokenize(text)
        self.i = self.nesting = 0

    def fail(self, detail: str, pos: int) -> SelectorError:
        return SelectorError(self.text, f"{detail} at position {pos}", pos)

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def accept(self, kind: str, *values: str) -> _Token | None:
        tok = self.tokens[self.i]
        if tok.kind == kind and (not values or tok.value in values):
            self.i += 1
            return tok
        return None

    def expect(self, kind: str, value: str, what: str) -> _Token:
        tok = self.accept(kind, value)
        if tok is None:
            raise self.unexpected(what)
        return tok

    def unexpected(self, what: str) -> SelectorError:
        tok = self.peek()
        found = "" if tok.kind == "end" else f", found '{_short(tok.text)}'"
        return SelectorError(self.text, f"expected {what} at position {tok.pos}{found}", tok.pos)

    def nest(self, levels: int, pos: int) -> None:
        self.nesting += levels
        if self.nesting > MAX_NESTING:
            raise self.fail(f"nested deeper than {MAX_NESTING} levels", pos)

    def node(self, fn: _Fn, kind: str, pos: int, *children: _Node) -> _Node:
        depth = 1 + max(c.depth for c in children)
        if depth > _MAX_TREE:
            raise self.fail(f"more than {_MAX_TREE} operators deep", pos)
        return _Node(fn, kind, pos, depth)

    def parse(self) -> _Fn:
        node = self.boolean(self.or_())
        if self.peek().kind != "end":
            raise self.fail(f"unexpected '{_short(self.peek().text)}'", self.peek().pos)
        return node.fn

    def boolean(self, node: _Node) -> _Node:
        """``node`` where a condition is needed: a bare property is a boolean cast."""
        if node.kind in (_BOOL, _TF, _NULL):
            return node
        if node.kind is not _PROP:
            raise self.fail(f"expected a boolean expression, found {node.kind}", node.pos)
        f = node.fn
        return self.node(lambda lk: v if (v := f(lk)) is None or v is True else False, _BOOL, node.pos, node)

    def logic(self, word: str, operand: Callable[[], _Node]) -> _Node:
        parts = [operand()]
        while self.accept("kw", word):
            parts.append(operand())
        if len(parts) == 1:
            return parts[0]
        fn = logic_of(tuple(self.boolean(p).fn for p in parts), word == "OR")
        return self.node(fn, _BOOL, parts[0].pos, *parts)

    def or_(self) -> _Node:
        return self.logic("OR", self.and_)

    def and_(self) -> _Node:
        return self.logic("AND", self.not_)

    def not_(self) -> _Node:
        pos, count = self.peek().pos, 0
        while self.accept("kw", "NOT"):
            count += 1
        self.nest(count, pos)
        node = self.comparison()
        self.nesting -= count
        if count == 0:
            return node
        inner = self.boolean(node)
        if count % 2 == 0:
            return inner
        f = inner.fn
        return self.node(lambda lk: None if (r := f(lk)) is None else not r, _BOOL, pos, inner)

    def comparison(self) -> _Node:
        left = self.additive()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in OUTCOMES:
                self.i += 1
                left = self.compare(tok.value, left, self.additive(), tok.pos)
            elif self.accept("kw", "IS"):
                left = self.is_null(left, self.accept("kw", "NOT") is not None)
            elif tok.kind == "kw" and tok.value in ("NOT", "BETWEEN", "LIKE", "IN"):
                negate = self.accept("kw", "NOT") is not None
                op = self.accept("kw", "BETWEEN", "LIKE", "IN")
                if op is None:
                    raise self.unexpected("BETWEEN, LIKE or IN")
                method = {"BETWEEN": self.between, "LIKE": self.like, "IN": self.in_}[op.value]
                left = method(left, negate)
            else:
                return left

    def is_null(self, value: _Node, negate: bool) -> _Node:
        self.expect("kw", "NULL", "NULL")
        f = value.fn
        return self.node(lambda lk: (f(lk) is None) is not negate, _BOOL, value.pos, value)

    def check_ordered(self, op: str, *operands: _Node) -> None:
        for node in operands:
            if node.kind in (_BOOL, _TF, _STR, _NULL):
                raise self.fail(f"'{op}' cannot compare {node.kind}", node.pos)

    def compare(self, op: str, left: _Node, right: _Node, pos: int) -> _Node:
        if op in ("=", "<>"):
            for node in (left, right):
                if node.kind is _NULL:
                    raise self.fail("cannot compare with NULL (use IS NULL)", node.pos)
            literals = (_TF, _NUM, _STR)
            if left.kind in literals and right.kind in literals and (left.kind is _TF) != (right.kind is _TF):
                raise self.fail(f"cannot compare {left.kind} with {right.kind}", pos)
        else:
            self.check_ordered(op, left, right)
        lf, rf, outcomes, convert = left.fn, right.fn, OUTCOMES[op], self.convert
        return self.node(lambda lk: test(outcomes, lf(lk), rf(lk), convert), _BOOL, left.pos, left, right)

    def between(self, value: _Node, negate: bool) -> _Node:
        low = self.additive()
        self.expect("kw", "AND", "AND")
        high = self.additive()
        self.check_ordered("BETWEEN", value, low, high)
        vf, lf, hf, convert = value.fn, low.fn, high.fn, self.convert
        # ActiveMQ: value >= low AND value <= high; NOT: value < low OR value > high
        above, below = (OUTCOMES["<"], OUTCOMES[">"]) if negate else (OUTCOMES[">="], OUTCOMES["<="])
        stop = negate  # the value that decides, as in logic()

        def fn(lookup: Lookup) -> bool | None:
            v = vf(lookup)
            a, b = test(above, v, lf(lookup), convert), test(below, v, hf(lookup), convert)
            if a is stop or b is stop:
                return stop
            return None if a is None or b is None else not stop

        return self.node(fn, _BOOL, value.pos, value, low, high)

    def string(self) -> str:
        tok = self.accept("str")
        if tok is None:
            raise self.unexpected("a string literal")
        return str(tok.value)

    def like(self, value: _Node, negate: bool) -> _Node:
        pattern, escape = self.string(), None
        if self.accept("kw", "ESCAPE"):
            pos = self.peek().pos
            escape = self.string()
            if len(escape) != 1:
                raise self.fail("ESCAPE takes one character", pos)
        like, f = LikePattern(pattern, escape), value.fn

        def fn(lookup: Lookup) -> bool | None:
            v = f(lookup)
            return None if v is None else (isinstance(v, str) and like.match(v)) is not negate

        return self.node(fn, _BOOL, value.pos, value)

    def in_(self, value: _Node, negate: bool) -> _Node:
        if value.kind is not _PROP:
            raise self.fail(f"IN needs a property on its left, not {value.kind}", value.pos)
        self.expect("op", "(", "'('")
        items = {self.string()}
        while self.accept("op", ","):
            items.add(self.string())
        self.expect("op", ")", "')'")
        values, f = frozenset(items), value.fn

        def fn(lookup: Lookup) -> bool | None:
            v = f(lookup)
            return (v in values) is not negate if isinstance(v, str) else None

        return self.node(fn, _BOOL, value.pos, value)

    def arithmetic(self, ops: tuple[str, str], operand: Callable[[], _Node]) -> _Node:
        left = operand()
        while tok := self.accept("op", *ops):
            right = operand()
            lf, rf, op = left.fn, right.fn, ARITHMETIC[tok.value]

            def fn(lookup: Lookup, lf: _Fn = lf, rf: _Fn = rf, op: Any = op) -> Any:
                a, b = lf(lookup), rf(lookup)
                if not (is_number(a) and is_number(b)):
                    return None
                try:
                    return op(a, b)
                except ArithmeticError:  # division by zero, int too large for a float
                    return None

            left = self.node(fn, _VAL, left.pos, left, right)
        return left

    def additive(self) -> _Node:
        return self.arithmetic(("+", "-"), self.multiplicative)

    def multiplicative(self) -> _Node:
        return self.arithmetic(("*", "/"), self.unary)

    def unary(self) -> _Node:
        pos, signs = self.peek().pos, []
        while tok := self.accept("op", "+", "-"):
            signs.append(tok.value)
        self.nest(len(signs), pos)
        node = self.primary()
        self.nesting -= len(signs)
        minus = signs.count("-")
        if not minus:  # ActiveMQ: unary plus is no operator at all
            return node
        f, odd = node.fn, minus % 2 == 1
        return self.node(lambda lk: (-v if odd else v) if is_number(v := f(lk)) else None, _VAL, pos, node)

    def primary(self) -> _Node:
        tok = self.peek()
        self.i += 1
        if tok.kind == "op" and tok.value == "(":
            self.nest(1, tok.pos)
            node = self.or_()
            self.expect("op", ")", "')'")
            self.nesting -= 1
            return node
        if tok.kind == "id":
            name = tok.value
            return _Node(lambda lookup: lookup(name), _PROP, tok.pos)
        if tok.kind in ("num", "str"):
            value = tok.value
            return _Node(lambda lookup: value, _NUM if tok.kind == "num" else _STR, tok.pos)
        if tok.kind == "kw" and tok.value in ("TRUE", "FALSE", "NULL"):
            truth = {"TRUE": True, "FALSE": False}.get(tok.value)
            return _Node(lambda lookup: truth, _NULL if truth is None else _TF, tok.pos)
        self.i -= 1
        raise self.unexpected("an expression")
