"""How selector values compare, compute and match (see :mod:`leveret.core.selector`).

Values are what a lookup gives (str, int, float, bool) or None (NULL); anything else
compares with nothing. As ActiveMQ 5.17 does (activemq-client filter/
ComparisonExpression.java, ArithmeticExpression.java, UnaryExpression.java):

- Values of different types (a string and a number, a boolean and a number) compare
  FALSE, not unknown, so ``<>`` is TRUE; ``NOT BETWEEN`` is ``< low OR > high``. Numbers
  compare across int and float; two strings (or booleans) also order at run time
  (String.compareTo), though string literals are refused with ``<``…
- ``convert``: ActiveMQ's STOMP conversion, a string compared with a number or boolean
  read as that type (Integer.valueOf: sign and digits; Double.valueOf: trimmed, with
  NaN, Infinity and an f/d suffix; Boolean.valueOf: "true" in any case); FALSE when the
  string does not parse.
- LIKE on a non-string is FALSE; ESCAPE escapes only ``%``, ``_`` or itself, and is an
  ordinary character (or wildcard) elsewhere. IN on a non-string is unknown.
- ``/`` divides in floating point (``5 / 2 = 2.5``).

Unlike ActiveMQ: any comparison with NULL is unknown (ActiveMQ finds two NULLs equal and
``'x' = NULL`` FALSE, so ``'x' <> missing`` matches there); division by zero and
arithmetic on non-numbers are unknown (ActiveMQ gives Infinity or NaN, concatenates
strings with ``+``, and fails the evaluation otherwise); ints do not wrap at 32 or 64
bits, and strings read as ints are not range-checked.
"""

from __future__ import annotations

import operator
import re
from typing import Any


def _kind(v: Any) -> str:
    """'s' string, 'b' boolean, 'n' number, 'o' anything else."""
    if isinstance(v, str):
        return "s"
    if isinstance(v, bool):
        return "b"
    return "n" if isinstance(v, int | float) else "o"


_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")
_JAVA_SPACE = "".join(map(chr, range(33)))  # what String.trim() removes


def _parse_as(s: str, other: Any) -> Any:
    """``s`` read as ``other``'s type, as Boolean/Integer/Double.valueOf do; None if not."""
    if isinstance(other, bool):
        return s.lower() == "true"
    try:
        if isinstance(other, int):
            return int(s) if _JAVA_INT.fullmatch(s) else None
        s = s.strip(_JAVA_SPACE)
        return float(s.rstrip("fFdD")) if _JAVA_DOUBLE.fullmatch(s) else None
    except ValueError:  # more digits than int() reads
        return None


def compare(a: Any, b: Any, convert: bool) -> int:
    """0, 1 or 2 when ``a`` is less than, equal to or greater than ``b``; 3 when they
    do not compare (different types, NaN). ``convert``: ActiveMQ's STOMP conversion."""
    t = type(a)
    if t is not type(b) or not (t is int or t is float or t is str):  # not the usual case
        ka, kb = _kind(a), _kind(b)
        if ka != kb:
            if convert and ka == "s" and kb != "o":
                a = _parse_as(a, b)
            elif convert and kb == "s" and ka != "o":
                b = _parse_as(b, a)
            else:
                return 3
            if a is None or b is None:
                return 3
        elif ka == "o":
            return 3
    return 0 if a < b else 2 if a > b else 1 if a == b else 3


#: Each comparison's outcome by :func:`compare`'s answer: less, equal, greater, neither.
OUTCOMES = {
    "=": (False, True, False, False), "<>": (True, False, True, True),
    "<": (True, False, False, False), ">": (False, False, True, False),
    "<=": (True, True, False, False), ">=": (False, True, True, False),
}  # fmt: skip


def test(outcomes: tuple[bool, ...], a: Any, b: Any, convert: bool) -> bool | None:
    """A comparison's truth: unknown (None) if either side is NULL."""
    if a is None or b is None:
        return None
    return outcomes[compare(a, b, convert)]


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class LikePattern:
    """A LIKE pattern as fixed-length segments between ``%``: the first anchored at the
    start, the last at the end, each other one at its leftmost place after the one
    before (exact for ``%``), so matching never backtracks."""

    def __init__(self, pattern: str, escape: str | None) -> None:
        segments: list[list[str]] = [[]]
        i = 0
        while i < len(pattern):
            c = pattern[i]
            if c == escape and pattern[i + 1 : i + 2] in ("%", "_", escape):
                i += 1
                segments[-1].append(re.escape(pattern[i]))
            elif c == "%":
                segments.append([])
            else:
                segments[-1].append("." if c == "_" else re.escape(c))
            i += 1
        self.parts = [(re.compile("".join(s), re.DOTALL), len(s)) for s in segments]

    def match(self, s: str) -> bool:
        if len(self.parts) == 1:
            return self.parts[0][0].fullmatch(s) is not None
        (first, _), *middle, (last, size) = self.parts
        end = len(s) - size  # where the last segment must start
        m = first.match(s, 0, end) if end >= 0 else None
        if m is None:
            return False
        for part, _ in middle:
            m = part.search(s, m.end(), end)
            if m is None:
                return False
        return last.fullmatch(s, end) is not None
