"""Decoding of the AMQP 0-9-1 methods without a hand-written codec, through pamqp.

Both twins of :func:`leveret.amqp.frames.decode_method` (pure and compiled) decode the
hot methods themselves and hand every other method here, so those fail alike.
"""

from __future__ import annotations

import re
import struct

from pamqp import commands, constants as pamqp_constants
from pamqp.base import Frame as Method
from pamqp.exceptions import UnmarshalingException

from .errors import NOT_IMPLEMENTED, SYNTAX_ERROR, AMQPConnectionError
from .field_table import check_table

# pamqp refuses exchange and queue names outside ``[a-zA-Z0-9-_.:@#,/+ ]`` when it
# builds a method (a queue.declare-ok for ``federation: X -> NODE``, RabbitMQ's
# federation queue, failed with 541); AMQP and RabbitMQ allow any text in a shortstr
# (255 bytes, which pamqp and the broker check apart), so the broker and the clients
# built on pamqp here accept any.
for _domain in ("exchange-name", "queue-name"):
    pamqp_constants.DOMAIN_REGEX[_domain] = re.compile(r".*", re.DOTALL)

#: Bytes each fixed-size method argument takes (pamqp's names); bits are packed.
_ARGUMENT_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}
#: For each method class with a field table argument: its argument types in order.
_LAYOUTS: dict[type, tuple[str, ...] | None] = {}


def _layout(cls: type[Method]) -> tuple[str, ...] | None:
    """``cls``'s argument types in wire order if one is a field table, else None."""
    if cls not in _LAYOUTS:
        kinds = tuple(cls.amqp_type(name) for name in cls.__slots__)
        _LAYOUTS[cls] = kinds if "table" in kinds else None
    return _LAYOUTS[cls]


def check_tables(cls: type[Method], arguments: bytes) -> None:
    """Walk the method arguments ``arguments`` to each field table and check it with
    :func:`~.field_table.check_table` (depth and lengths, nothing decoded), so that a
    table nested too deeply is refused before pamqp decodes it. ValueError if one is
    refused; a malformed argument before it is left for pamqp to report."""
    layout = _layout(cls)
    if layout is None:
        return
    offset, bits = 0, 0
    try:
        for kind in layout:
            if kind == "bit":  # up to 8 bits share an octet
                offset += bits == 0
                bits = (bits + 1) % 8
                continue
            bits = 0
            if kind == "table":
                offset = check_table(arguments, offset)
            elif kind == "shortstr":
                offset += 1 + arguments[offset]
            elif kind == "longstr":
                offset += 4 + struct.unpack_from(">I", arguments, offset)[0]
            else:
                offset += _ARGUMENT_SIZES[kind]
    except (IndexError, struct.error):
        return  # a truncated argument: pamqp says which


def decode_with_pamqp(index: int, payload: bytes) -> Method:
    """The method frame ``payload`` (class and method id ``index``, its first 4 bytes) as
    a pamqp command. Raises AMQPConnectionError 540 for an unknown class/method id and
    502 for arguments that do not decode, field tables included that nest more than
    :data:`~.field_table.MAX_NESTING` deep (found by :func:`check_tables` before pamqp
    decodes anything: such a start-ok costs microseconds, not pamqp's O(n²))."""
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise AMQPConnectionError(
            NOT_IMPLEMENTED, f"unknown method class {index >> 16} method {index & 0xFFFF}"
        )
    method = cls()
    arguments = payload[4:]
    try:
        check_tables(cls, arguments)  # depth refused before any value is built
        method.unmarshal(arguments)
    except (
        UnmarshalingException,
        struct.error,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        IndexError,
    ) as exc:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: {exc}") from None
    except RecursionError:  # not reached past check_tables; kept as the last guard
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: nested too deeply") from None
    return method
