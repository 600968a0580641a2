"""Decoding of the AMQP 0-9-1 methods without a hand-written codec, through pamqp.

Both twins of :func:`leveret.amqp.frames.decode_method` (pure and compiled) decode the
hot methods themselves and hand every other method here, so those fail alike.
"""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.base import Frame as Method
from pamqp.exceptions import UnmarshalingException

from .errors import NOT_IMPLEMENTED, SYNTAX_ERROR, AMQPConnectionError
from .field_table import MAX_NESTING, nests_deeper

_TOO_DEEP = f"field tables nested more than {MAX_NESTING} deep"


def decode_with_pamqp(index: int, payload: bytes) -> Method:
    """The method frame ``payload`` (class and method id ``index``, its first 4 bytes) as
    a pamqp command. Raises AMQPConnectionError 540 for an unknown class/method id and
    502 for arguments that do not decode, field tables included that nest more than
    :data:`~.field_table.MAX_NESTING` deep."""
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise AMQPConnectionError(
            NOT_IMPLEMENTED, f"unknown method class {index >> 16} method {index & 0xFFFF}"
        )
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (
        UnmarshalingException,
        struct.error,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        IndexError,
    ) as exc:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: {exc}") from None
    except RecursionError:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: {_TOO_DEEP}") from None
    for name in method.__slots__:  # pamqp's arguments
        value = getattr(method, name, None)
        if isinstance(value, dict) and nests_deeper(value):
            raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: {_TOO_DEEP}")
    return method
