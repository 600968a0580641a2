"""Filters on an AMQP 1.0 source (§3.5.3 ``filter``, a map of symbol → described
value), sans-I/O: :func:`source_filters` turns a client's filter map into a core
selector, consumer arguments and the filter map the broker echoes in its attach.

Filters are recognised by their descriptor (symbol or code), whatever their key:

- ``apache.org:selector-filter:string`` (``0x0000468C00000004``): a JMS message
  selector (core's :mod:`leveret.core.selector`). JMS header names read the AMQP 1.0
  fields as Qpid JMS maps them (JMSType the ``subject``, JMSTimestamp the
  ``creation-time``, JMSXGroupID the ``group-id``, JMSXGroupSeq ``group-sequence``,
  JMSExpiration ``absolute-expiry-time``, each as core reads it when absent; the others
  as core reads them: JMSMessageID ``message-id``, JMSCorrelationID ``correlation-id``,
  JMSPriority the header's ``priority``, 4 by default, JMSDeliveryMode the header's
  ``durable``); other names are application properties.
  An invalid selector refuses the attach with ``amqp:invalid-field`` and the parse
  error as text, so a JMS client hears of it rather than getting every message.
- ``amqp:properties-filter`` (``0x173``) and ``amqp:application-properties-filter``
  (``0x174``): AMQP filter expressions (OASIS filtex, RabbitMQ 4.1): every field given
  must equal the message's; a string may be ``&p:prefix``, ``&s:suffix`` (``&&`` for a
  string that starts with ``&``); a null value matches anything. At most
  :data:`MAX_FILTER_FIELDS` fields each; one of each kind.
- ``amqp:sql-filter`` (``0x120``): an SQL filter expression (RabbitMQ 4.2), run by
  core's selector engine after translating its lexical forms (``p.subject``,
  ``h.priority``, ``a.key`` and ``[delimited]`` identifiers, ``!=``, double-quoted
  strings). What core's grammar does not cover (``%``, ``UTC()``, binary literals,
  non-literal ``IN`` lists, strings ordered with ``<``…) leaves the filter unapplied.
  SQL and property filters exclude each other (RabbitMQ 4): the first one wins.
- ``rabbitmq:stream-offset-spec``: on a stream, the consumer argument
  ``x-stream-offset`` (``first``, ``last``, ``next``, an offset ≥ 0, a timestamp, or
  an interval such as ``10m``: the messages of the last ten minutes).
- ``rabbitmq:stream-filter`` (a string or a list of strings) with
  ``rabbitmq:stream-match-unfiltered`` (boolean): only messages whose filter value
  (message-annotation or header ``x-stream-filter-value``) is one of them, and those
  without one when match-unfiltered is true: core's
  :class:`~leveret.core.stream_filter.StreamFilter`. On a stream it becomes the
  consumer arguments ``x-stream-filter`` and ``x-stream-match-unfiltered``, so the
  stream skips chunks by its chunk index; on any other queue, a test of the selector.
  Exact either way (RabbitMQ's Bloom filters let a few others through on streams only).

A filter that is unknown, malformed or not applicable is left out of the echoed map
and not applied: RabbitMQ 4's behaviour (§3.5.3: the sender echoes the filters
actually in place), but for the JMS selector.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import BrokerError
from ...core.queue_config import parse_age
from ...core.selector import Lookup, Selector, SelectorError, compile_selector, logic_of
from ...core.stream_filter import FILTER_ARGUMENT, MATCH_UNFILTERED_ARGUMENT, StreamFilter
from . import errors as e
from .filter_fields import MISSING, PROPERTY_FIELDS, name
from .types import Described, Symbol, Timestamp

SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004
PROPERTIES_FILTER = "amqp:properties-filter"
PROPERTIES_FILTER_CODE = 0x173
APPLICATION_PROPERTIES_FILTER = "amqp:application-properties-filter"
APPLICATION_PROPERTIES_FILTER_CODE = 0x174
SQL_FILTER = "amqp:sql-filter"
SQL_FILTER_CODE = 0x120
STREAM_OFFSET_SPEC = "rabbitmq:stream-offset-spec"
STREAM_FILTER = "rabbitmq:stream-filter"
STREAM_MATCH_UNFILTERED = "rabbitmq:stream-match-unfiltered"

#: Fields one property filter may name (filtex §7.1 asks for a limit; RabbitMQ's).
MAX_FILTER_FIELDS = 16
#: Characters and tokens of an SQL filter expression (filtex §7.1; RabbitMQ's limits).
MAX_SQL_LENGTH = 4096
MAX_SQL_TOKENS = 200

_Fn = Callable[[Lookup], Any]


@dataclass
class SourceFilters:
    """What a source's filter map asks for: ``selector`` (every applied filter, ANDed;
    None when none filters messages), consumer ``arguments`` (``x-stream-offset``) and
    ``echoed``, the filter map to send back (None when the client sent none)."""

    selector: Selector | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    echoed: dict[Any, Any] | None = None


class _Invalid(Exception):
    """A filter that cannot be applied (left out, not echoed)."""


def _is(descriptor: Any, symbol: str, code: int | None) -> bool:
    if isinstance(descriptor, str):
        return descriptor == symbol
    return code is not None and isinstance(descriptor, int) and descriptor == code


def source_filters(filter_map: Any, stream: bool = False, now: float | None = None) -> SourceFilters:
    """The filters of a source's ``filter`` map (see the module doc); ``stream``: the
    source is a stream queue (the offset spec applies only there); ``now``: the time
    (epoch seconds) an interval offset spec counts back from. Raises LinkFault
    (``amqp:invalid-field``) for an invalid JMS selector, and nothing else."""
    out = SourceFilters()
    if not isinstance(filter_map, dict):
        return out
    out.echoed = {}
    fns: list[_Fn] = []
    texts: list[str] = []
    sections: set[str] = set()  # property filters applied, or "sql"
    stream_values: list[str] | None = None
    match_unfiltered: bool | None = None
    for key, value in filter_map.items():
        if not isinstance(value, Described):
            if isinstance(key, str) and key.startswith("rabbitmq:stream-"):
                # a filter set without descriptors, which RabbitMQ still reads
                value = Described(Symbol(key), value)
            else:
                continue
        descriptor = value.descriptor
        try:
            if _is(descriptor, SELECTOR_FILTER, SELECTOR_FILTER_CODE):
                if "jms" in sections or not isinstance(value.value, str):
                    continue
                fns.append(jms_selector(value.value))
                texts.append(value.value)
                sections.add("jms")
            elif _is(descriptor, PROPERTIES_FILTER, PROPERTIES_FILTER_CODE) or _is(
                descriptor, APPLICATION_PROPERTIES_FILTER, APPLICATION_PROPERTIES_FILTER_CODE
            ):
                kind = "p" if _is(descriptor, PROPERTIES_FILTER, PROPERTIES_FILTER_CODE) else "a"
                if kind in sections or "sql" in sections:
                    continue
                fns.append(property_filter(kind, value.value))
                texts.append(f"{descriptor}: {value.value!r}")
                sections.add(kind)
            elif _is(descriptor, SQL_FILTER, SQL_FILTER_CODE):
                if sections & {"p", "a", "sql"}:
                    continue
                fns.append(sql_filter(value.value))
                texts.append(str(value.value))
                sections.add("sql")
            elif _is(descriptor, STREAM_OFFSET_SPEC, None):
                if not stream:
                    continue
                out.arguments["x-stream-offset"] = offset_spec(value.value, now)
            elif _is(descriptor, STREAM_FILTER, None):
                stream_values = _stream_values(value.value)
            elif _is(descriptor, STREAM_MATCH_UNFILTERED, None):
                if not isinstance(value.value, bool):
                    continue
                match_unfiltered = value.value
            else:
                continue
        except _Invalid:
            continue
        out.echoed[key] = value
    if stream_values is not None and stream:
        out.arguments[FILTER_ARGUMENT] = stream_values
        out.arguments[MATCH_UNFILTERED_ARGUMENT] = bool(match_unfiltered)
    elif stream_values is not None:
        fns.append(stream_filter(stream_values, bool(match_unfiltered)))
        texts.append(f"x-stream-filter-value in {stream_values!r}")
    if fns:
        out.selector = Selector(" AND ".join(f"({t})" for t in texts), _all(fns), False)
    return out


def _all(fns: list[_Fn]) -> _Fn:
    """Every filter, with the JMS truth table of AND."""
    return fns[0] if len(fns) == 1 else logic_of(tuple(fns), False)


# -- the JMS selector -------------------------------------------------------------------
#: JMS header names Qpid JMS maps to AMQP 1.0 fields that core's neutral properties
#: do not hold.
_JMS_RENAMES = {
    "JMSType": name("jms-type"),
    "JMSTimestamp": name("p", "creation-time"),
    "JMSXGroupID": name("p", "group-id"),
    "JMSXGroupSeq": name("p", "group-sequence"),
    "JMSExpiration": name("p", "absolute-expiry-time"),
}


def jms_selector(text: str) -> _Fn:
    """A JMS selector's test; LinkFault (``amqp:invalid-field``) when invalid."""
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        raise e.LinkFault(e.INVALID_FIELD, str(exc)) from None
    evaluate = selector.evaluate
    renames = _JMS_RENAMES
    if not any(jms in text for jms in renames):
        return evaluate

    def fn(lookup: Lookup) -> bool | None:
        def renamed(n: str) -> Any:
            field = renames.get(n)
            if field is None:
                return lookup(n)
            v = lookup(field)
            if v is None:  # not in the AMQP 1.0 form: as core reads it
                v = 0 if n == "JMSExpiration" else lookup(n)
            return v

        return evaluate(renamed)

    return fn


# -- property filter expressions --------------------------------------------------------
_Match = Callable[[Any], bool]

#: Properties-filter fields and the value types they take (filtex §4.2.4).
_ID, _STRING, _BINARY, _SYMBOL, _TIME, _UINT = "id", "string", "binary", "symbol", "time", "uint"
_FIELD_TYPES = dict(
    zip(
        PROPERTY_FIELDS,
        (
            _ID,
            _BINARY,
            _STRING,
            _STRING,
            _STRING,
            _ID,
            _SYMBOL,
            _SYMBOL,
            _TIME,
            _TIME,
            _STRING,
            _UINT,
            _STRING,
        ),
        strict=True,
    )
)


def property_filter(kind: str, value: Any) -> _Fn:
    """A properties (``kind`` ``"p"``) or application-properties (``"a"``) filter's
    test: every field matches. _Invalid for a malformed filter."""
    if not isinstance(value, dict) or not value or len(value) > MAX_FILTER_FIELDS:
        raise _Invalid
    checks: list[tuple[str, _Match]] = []
    for key, ref in value.items():
        if kind == "p":
            if not isinstance(key, str) or key not in _FIELD_TYPES:
                raise _Invalid
            checks.append((name("p", key), _reference(ref, _FIELD_TYPES[key])))
        else:
            if not isinstance(key, str) or isinstance(key, Symbol):
                raise _Invalid
            checks.append((name("a", key), _reference(ref, None)))
    checks_t = tuple(checks)

    def fn(lookup: Lookup) -> bool:
        for n, match in checks_t:
            v = lookup(n)
            if v is MISSING or not match(v):
                return False
        return True

    return fn


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_string(v: Any) -> bool:
    return isinstance(v, str) and not isinstance(v, Symbol)


#: The reference values each field type takes (RabbitMQ's; content-type and
#: content-encoding also as strings, times and group-sequence as any integer ≥ 0).
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    _ID: lambda v: (isinstance(v, str | bytes | uuid.UUID) and not isinstance(v, Symbol)) or _is_uint(v),
    _STRING: _is_string,
    _BINARY: lambda v: isinstance(v, bytes),
    _SYMBOL: lambda v: isinstance(v, str),
    _TIME: _is_uint,
    _UINT: _is_uint,
}


def _reference(ref: Any, kind: str | None) -> _Match:
    """How a message's value matches the reference value ``ref`` (filtex §4.1.1)."""
    if ref is None:
        return lambda v: True
    if kind is not None and not _TYPE_CHECKS[kind](ref):
        raise _Invalid
    if isinstance(ref, str) and not isinstance(ref, Symbol) and kind != _SYMBOL and ref.startswith("&"):
        affix = ref[3:].encode()
        if ref.startswith("&p:"):
            return lambda v: (b := _bytes(v)) is not None and b.startswith(affix)
        if ref.startswith("&s:"):
            return lambda v: (b := _bytes(v)) is not None and b.endswith(affix)
        if ref.startswith("&&"):
            ref = ref[1:]
        else:
            raise _Invalid
    return lambda v: _equal(ref, v)


def _bytes(v: Any) -> bytes | None:
    """A string, binary or UUID value's bytes (RabbitMQ holds all three as binaries);
    a lone surrogate (text from HTTP, a 0-9-1 key that is no UTF-8) keeps bytes that
    no UTF-8 reference value holds, so it matches nothing."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, bytes):
        return v
    if isinstance(v, uuid.UUID):
        return v.bytes
    return None


def _equal(ref: Any, v: Any) -> bool:
    """Equality as filtex §4.1.1 and RabbitMQ's: numbers across types, strings and
    binaries by their bytes, booleans only with booleans."""
    if isinstance(ref, bool) or isinstance(v, bool):
        return isinstance(ref, bool) and isinstance(v, bool) and ref == v
    if isinstance(v, datetime.datetime) and isinstance(ref, int):
        v = int(v.timestamp() * 1000)
    if isinstance(ref, int | float) and isinstance(v, int | float):
        return ref == v
    b = _bytes(ref)
    if b is not None:
        return b == _bytes(v)
    return bool(ref == v)


# -- SQL filter expressions -------------------------------------------------------------
_SQL_TOKEN = re.compile(
    r"""(?P<space>[ \t\f\n\r]+)
    |(?P<binary>0x[0-9A-Fa-f]+)
    |(?P<float>[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?)
    |(?P<int>[0-9]+)
    |(?P<str>'(?:[^']|'')*'|"(?:[^"]|"")*")
    |(?P<section>[a-zA-Z][a-zA-Z_-]*\.[a-zA-Z][a-zA-Z0-9_]*)
    |(?P<delimited>\[(?:[^\[\]]|\[\[|\]\])*\])
    |(?P<id>[a-zA-Z][a-zA-Z0-9_]*)
    |(?P<op><>|!=|<=|>=|[=<>+\-*/(),])""",
    re.VERBOSE | re.DOTALL,
)
_SQL_KEYWORDS = frozenset(("AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE"))
#: Reserved words of filtex SQL that core's grammar has no use for (functions, EXISTS…).
_SQL_UNSUPPORTED = frozenset(
    ("EXISTS", "NAN", "INF", "LOWER", "UPPER", "LEFT", "RIGHT", "SUBSTRING", "UTC", "DATE")
)
_SECTIONS = {"header": "h", "h": "h", "properties": "p", "p": "p", "application_properties": "a", "a": "a"}


def sql_filter(value: Any) -> _Fn:
    """An SQL filter expression's test, evaluated by core's selectors; _Invalid for an
    expression that is not valid or that core's grammar does not cover."""
    text, names = _translate_sql(value)
    try:
        selector = compile_selector(text)
    except SelectorError:
        raise _Invalid from None
    evaluate = selector.evaluate

    def fn(lookup: Lookup) -> bool | None:
        def resolve(n: str) -> Any:
            real = names.get(n)
            if real is None:
                return None
            v = lookup(real)
            return None if v is MISSING else v

        return evaluate(resolve)

    return fn


def _translate_sql(value: Any) -> tuple[str, dict[str, str]]:
    """The selector text for an SQL filter expression, each identifier replaced by a
    placeholder (``$0``, ``$1``…), and the lookup name of each placeholder."""
    if not isinstance(value, str) or len(value) > MAX_SQL_LENGTH:
        raise _Invalid
    parts: list[str] = []
    names: dict[str, str] = {}
    placeholders: dict[str, str] = {}
    pos = count = 0
    while pos < len(value):
        m = _SQL_TOKEN.match(value, pos)
        if m is None:
            raise _Invalid
        kind, word = m.lastgroup, m.group()
        pos = m.end()
        if kind == "space":
            continue
        count += 1
        if count > MAX_SQL_TOKENS or kind == "binary":
            raise _Invalid
        if kind == "str":
            quote = word[0]
            parts.append("'" + word[1:-1].replace(quote * 2, quote).replace("'", "''") + "'")
            continue
        lookup_name = None
        if kind == "section":
            section, _, field_name = word.partition(".")
            short = _SECTIONS.get(section)
            if short == "a":
                lookup_name = field_name
            elif short == "h" and field_name == "priority":
                lookup_name = "JMSPriority"
            elif short == "p" and field_name.replace("_", "-") in PROPERTY_FIELDS:
                lookup_name = name("p", field_name.replace("_", "-"))
            else:
                raise _Invalid
        elif kind == "delimited":
            key = word[1:-1].replace("[[", "[").replace("]]", "]")
            if any(ord(c) < 32 or ord(c) == 127 for c in key):
                raise _Invalid
            lookup_name = name("a", key)
        elif kind == "id":
            upper = word.upper()
            if upper in _SQL_KEYWORDS:
                parts.append(upper)
                continue
            if upper in _SQL_UNSUPPORTED:
                raise _Invalid
            lookup_name = name("a", word)
        elif word == "!=":
            word = "<>"
        if lookup_name is None:
            parts.append(word)
            continue
        placeholder = placeholders.get(lookup_name)
        if placeholder is None:
            placeholder = placeholders[lookup_name] = f"${len(placeholders)}"
            names[placeholder] = lookup_name
        parts.append(placeholder)
    return " ".join(parts), names


# -- streams ----------------------------------------------------------------------------
_OFFSET_WORDS = ("first", "last", "next")


def offset_spec(value: Any, now: float | None = None) -> Any:
    """``rabbitmq:stream-offset-spec`` as core's ``x-stream-offset``: ``first``,
    ``last``, ``next``, an offset ≥ 0, a timestamp (ms) as a UTC datetime, or an
    interval back from ``now`` (epoch seconds; RabbitMQ's ``10m``, ``12h``, ``7D``…:
    ``x-max-age``'s units) as the datetime it starts at. _Invalid for anything else."""
    if isinstance(value, Timestamp):
        try:
            return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
        except (OverflowError, ValueError, OSError):
            raise _Invalid from None
    if isinstance(value, str) and value in _OFFSET_WORDS:
        return str(value)
    if isinstance(value, str) and now is not None:
        try:
            age = parse_age(str(value))
        except BrokerError:
            raise _Invalid from None
        assert age is not None
        try:
            return datetime.datetime.fromtimestamp(now - age, datetime.UTC)
        except (OverflowError, ValueError, OSError):  # back before year 1
            raise _Invalid from None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise _Invalid


def _stream_values(value: Any) -> list[str]:
    if isinstance(value, str):
        return [str(value)]
    if isinstance(value, list | tuple):
        return [str(v) for v in value if isinstance(v, str)]
    items = getattr(value, "items", None)  # an AMQP array of strings
    if isinstance(items, tuple):
        return [str(v) for v in items if isinstance(v, str)]
    raise _Invalid


def stream_filter(values: Iterable[str], match_unfiltered: bool) -> _Fn:
    """The stream filter's test as a selector's (core's :class:`StreamFilter` on the
    lookup's filter value): the message's filter value is one of ``values``; a message
    without one passes when ``match_unfiltered``."""
    matches = StreamFilter.of(values, match_unfiltered).matches
    key = name("sfv")

    def fn(lookup: Lookup) -> bool:
        v = lookup(key)
        return matches(v if isinstance(v, str) else None)

    return fn
