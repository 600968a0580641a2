"""The management node's link pairs in one AMQP 1.0 session (AMQP Link Pair CS 01, as
RabbitMQ 4's ``rabbit_amqp_session``): a client's sender whose target is
``/management`` (requests in) and its receiver whose source is ``/management``
(responses out), both attached with the link property ``paired = true`` and paired by
link name. Sans-I/O: the session's link layer calls :meth:`ManagementPairs.attach`,
:meth:`~ManagementPairs.detach` and :meth:`~ManagementPairs.respond` and does the
framing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leveret.core.session import Session

from .management import MANAGEMENT_ADDRESS, handle_request, parse_request, response_sections
from .performatives import from_described, to_described
from .types import DecodeError, Described, decode_all, encode

#: Credit granted on a request link, topped up when half is used (RabbitMQ 4's 8).
REQUEST_CREDIT = 8

INVALID_FIELD = "amqp:invalid-field"
PRECONDITION_FAILED = "amqp:precondition-failed"


class PairError(Exception):
    """An attach or transfer the link pair refuses: ``condition`` is the AMQP error
    (``amqp:invalid-field`` for a missing ``paired`` property,
    ``amqp:precondition-failed`` for a second half of the same role or a request on a
    half-open pair), ``text`` RabbitMQ's kind of description."""

    def __init__(self, condition: str, text: str) -> None:
        super().__init__(text)
        self.condition = condition
        self.text = text


def is_management(address: Any) -> bool:
    """Whether a terminus address names the management node."""
    return address == MANAGEMENT_ADDRESS


def check_paired(properties: dict | None) -> None:
    """PairError (``amqp:invalid-field``) unless the attach's properties hold
    ``paired = true``, as RabbitMQ 4 requires."""
    if not properties or properties.get("paired") is not True:
        raise PairError(INVALID_FIELD, "Link property 'paired' is not set to boolean value 'true'")


@dataclass(slots=True)
class _Pair:
    requests: int | None = None  # the client's sender (our incoming link) handle
    responses: int | None = None  # the client's receiver (our outgoing link) handle


class ManagementPairs:
    """The management link pairs of one AMQP session, by link name. Handles are the
    client's link handles (the adapter's own bookkeeping of each link stays its own)."""

    def __init__(self) -> None:
        self._pairs: dict[str, _Pair] = {}
        self._names: dict[int, str] = {}

    def attach(self, name: str, client_is_sender: bool, handle: int, properties: dict | None) -> None:
        """Record one half: ``client_is_sender`` for the request link (target
        ``/management``), else the response link (source ``/management``). PairError
        for a missing ``paired`` property or a half already attached under ``name``."""
        check_paired(properties)
        pair = self._pairs.setdefault(name, _Pair())
        if (pair.requests if client_is_sender else pair.responses) is not None:
            raise PairError(PRECONDITION_FAILED, f"management link pair '{name}' already has that half")
        if client_is_sender:
            pair.requests = handle
        else:
            pair.responses = handle
        self._names[handle] = name

    def owns(self, handle: int) -> bool:
        """Whether ``handle`` is a management link of this session."""
        return handle in self._names

    def detach(self, handle: int) -> None:
        """Forget a half; the pair goes once both halves have."""
        name = self._names.pop(handle, None)
        if name is None:
            return
        pair = self._pairs[name]
        if pair.requests == handle:
            pair.requests = None
        if pair.responses == handle:
            pair.responses = None
        if pair.requests is None and pair.responses is None:
            del self._pairs[name]

    def response_link(self, request_handle: int) -> int:
        """The response link paired with request link ``request_handle``; PairError
        (``amqp:precondition-failed``) while it is not attached."""
        pair = self._pairs[self._names[request_handle]]
        if pair.responses is None:
            raise PairError(PRECONDITION_FAILED, "received transfer on half open management link pair")
        return pair.responses


def respond(session: Session, payload: bytes) -> bytes:
    """The response message (encoded sections) to the request message ``payload``.
    Raises :class:`~.management.BadRequestMessage` or DecodeError for a message that
    is no request, and core's AccessRefused for a refused permission (end the session
    with ``amqp:unauthorized-access``)."""
    sections = []
    for value in decode_all(payload):
        if not isinstance(value, Described):
            raise DecodeError("a message section that is not a described value")
        sections.append(from_described(value))
    request = parse_request(sections)
    status, body = handle_request(session, request.method, request.target, request.body)
    return b"".join(encode(to_described(section)) for section in response_sections(request, status, body))
