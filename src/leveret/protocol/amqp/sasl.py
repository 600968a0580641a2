"""SASL for connection.start-ok (AMQP 0-9-1 §1.4.2.2): PLAIN and RabbitMQ's AMQPLAIN.

The adapter parses the response; core authenticates the user name and password
(:meth:`leveret.core.auth.UserDatabase.authenticate`).
"""

from __future__ import annotations

from pamqp import decode

from ...core.auth import AuthenticationError

MECHANISMS = ("PLAIN", "AMQPLAIN")


def parse_response(mechanism: str, response: bytes | str) -> tuple[str, str]:
    """(username, password) from a connection.start-ok response.

    PLAIN is ``authzid NUL authcid NUL password`` (RFC 4616); AMQPLAIN a field table
    without its length prefix holding LOGIN and PASSWORD. Raises AuthenticationError.
    """
    raw = response.encode("latin-1") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationError("PLAIN response is not 'authzid NUL user NUL password'")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception as exc:  # pamqp raises several types for a bad table
            raise AuthenticationError(f"AMQPLAIN response is not a field table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise AuthenticationError("AMQPLAIN response lacks LOGIN or PASSWORD")
        return _text(login), _text(password)
    raise AuthenticationError(f"unsupported authentication mechanism '{mechanism}'")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
