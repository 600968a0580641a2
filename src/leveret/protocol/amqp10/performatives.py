"""AMQP 1.0 composite types as dataclasses (OASIS AMQP 1.0 parts 2-5): the performatives
(§2.7), SASL frames (§5.3.3), error (§2.8.14), source and target (§3.5.3-4), delivery
states (§3.4) and message sections (§3.2), each with its descriptor code and name and its
field list, to and from described values, sans-I/O.

A composite is a described list (§1.3.2): :func:`to_described` writes the fields in
order, as null where a field equals its spec default, leaving out trailing nulls; the
descriptor is the numeric code (``ULong``), as proton and RabbitMQ send it.
:func:`from_described` takes a :class:`~leveret.protocol.amqp10.types.Described` with
the numeric or symbolic descriptor, gives missing and null fields their defaults,
ignores fields past the known ones (later versions may add some), checks each field's
type and refuses a mandatory field left null: :class:`~leveret.protocol.amqp10.types.
DecodeError` with ``amqp:invalid-field`` for a missing mandatory field and
``amqp:decode-error`` for a field of the wrong type. A described value with an unknown
descriptor stays a ``Described`` (transactions' coordinator, declared, ...).

Field values are plain Python: integers as ``int`` (encoded as the field's type: uint,
ushort, ubyte, ulong), strings, ``bytes``, ``bool``; a multiple symbol field (§1.4:
one value or an array) is a tuple of ``Symbol``; ``fields`` maps (properties, info,
annotations) are dicts with ``Symbol`` keys. Times are in milliseconds (idle-time-out,
ttl, timestamps) or seconds (a terminus's timeout), as the spec gives them. Message
sections with a single value (data, amqp-sequence, amqp-value, the annotation and
application-properties maps, footer) keep it in ``value``; plain ``str`` keys of
annotations are written as symbols (§3.2.10).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields as dc_fields
from typing import Any, ClassVar, TypeAlias

from leveret.protocol.amqp10.types import (
    DECODE_ERROR,
    Array,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

#: The condition for a mandatory field left null or a field out of range (§2.8.15).
INVALID_FIELD = "amqp:invalid-field"

#: Field types: how a value is written (and checked when read).
#: "any" takes any value; composite fields name their classes (see _Field).
_UINT, _USHORT, _UBYTE, _ULONG = "uint", "ushort", "ubyte", "ulong"
_BOOL, _STRING, _SYMBOL, _BINARY, _TIMESTAMP = "boolean", "string", "symbol", "binary", "timestamp"
_SYMBOLS, _FIELDS, _MAP, _LIST, _ANY = "symbol[]", "fields", "map", "list", "any"
_ERROR, _STATE, _SOURCE, _TARGET = "error", "delivery-state", "source", "target"

_WRITERS: dict[str, Any] = {
    _UINT: UInt,
    _USHORT: UShort,
    _UBYTE: UByte,
    _ULONG: ULong,
    _SYMBOL: Symbol,
    _TIMESTAMP: Timestamp,
}
_RANGES = {_UINT: 2**32, _USHORT: 2**16, _UBYTE: 2**8, _ULONG: 2**64}


class Composite:
    """What every composite dataclass shares: its descriptor ``CODE`` and ``NAME``
    and ``FIELDS``, one ``(type, mandatory)`` pair per dataclass field, in wire order."""

    __slots__ = ()
    CODE: ClassVar[int]
    NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]]


# -- the error type (§2.8.14) and the delivery states (§3.4) ------------------------------


@dataclass(frozen=True, slots=True)
class Error(Composite):
    """error (§2.8.14): a ``condition`` symbol (``amqp:not-found``, ...), an optional
    description and an ``info`` map."""

    CODE: ClassVar[int] = 0x1D
    NAME: ClassVar[str] = "amqp:error:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_SYMBOL, True), (_STRING, False), (_FIELDS, False))
    condition: str = ""
    description: str | None = None
    info: dict[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class Received(Composite):
    """received (§3.4.1): how much of a delivery has arrived, to resume it."""

    CODE: ClassVar[int] = 0x23
    NAME: ClassVar[str] = "amqp:received:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_UINT, True), (_ULONG, True))
    section_number: int = 0
    section_offset: int = 0


@dataclass(frozen=True, slots=True)
class Accepted(Composite):
    """accepted (§3.4.2): the terminal outcome of a message processed successfully."""

    CODE: ClassVar[int] = 0x24
    NAME: ClassVar[str] = "amqp:accepted:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ()


@dataclass(frozen=True, slots=True)
class Rejected(Composite):
    """rejected (§3.4.3): the message is invalid and cannot be processed; ``error``
    says why. RabbitMQ dead-letters it."""

    CODE: ClassVar[int] = 0x25
    NAME: ClassVar[str] = "amqp:rejected:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_ERROR, False),)
    error: Error | None = None


@dataclass(frozen=True, slots=True)
class Released(Composite):
    """released (§3.4.4): not processed; the message may go to another consumer."""

    CODE: ClassVar[int] = 0x26
    NAME: ClassVar[str] = "amqp:released:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ()


@dataclass(frozen=True, slots=True)
class Modified(Composite):
    """modified (§3.4.5): released with changes: ``delivery_failed`` counts a failed
    delivery, ``undeliverable_here`` keeps it from this link, and
    ``message_annotations`` are merged into the message's."""

    CODE: ClassVar[int] = 0x27
    NAME: ClassVar[str] = "amqp:modified:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_BOOL, False), (_BOOL, False), (_FIELDS, False))
    delivery_failed: bool | None = None
    undeliverable_here: bool | None = None
    message_annotations: dict[Any, Any] | None = None


DeliveryState: TypeAlias = Received | Accepted | Rejected | Released | Modified | Described

# -- terminuses (§3.5) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source(Composite):
    """source (§3.5.3): where messages come from. ``durable``: 0 none, 1 configuration,
    2 unsettled-state; ``timeout`` in seconds; ``filter`` maps symbols to described
    filters; ``address`` is a string (RabbitMQ 4: ``/queues/:queue``)."""

    CODE: ClassVar[int] = 0x28
    NAME: ClassVar[str] = "amqp:source:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_ANY, False),
        (_UINT, False),
        (_SYMBOL, False),
        (_UINT, False),
        (_BOOL, False),
        (_FIELDS, False),
        (_SYMBOL, False),
        (_MAP, False),
        (_STATE, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
    )
    address: Any = None
    durable: int = 0
    expiry_policy: str = "session-end"
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: str | None = None
    filter: dict[Any, Any] | None = None
    default_outcome: DeliveryState | None = None
    outcomes: tuple[str, ...] | None = None
    capabilities: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Target(Composite):
    """target (§3.5.4): where messages go (RabbitMQ 4: ``/exchanges/:x/:key``,
    ``/queues/:queue``, or null to use each message's ``to``)."""

    CODE: ClassVar[int] = 0x29
    NAME: ClassVar[str] = "amqp:target:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_ANY, False),
        (_UINT, False),
        (_SYMBOL, False),
        (_UINT, False),
        (_BOOL, False),
        (_FIELDS, False),
        (_SYMBOLS, False),
    )
    address: Any = None
    durable: int = 0
    expiry_policy: str = "session-end"
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    capabilities: tuple[str, ...] | None = None


# -- performatives (§2.7) ----------------------------------------------------------------

ROLE_SENDER, ROLE_RECEIVER = False, True
SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1
MAX_UINT = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Open(Composite):
    """open (§2.7.1). ``max_frame_size`` in bytes; ``idle_time_out`` in milliseconds
    (None: no heartbeats wanted)."""

    CODE: ClassVar[int] = 0x10
    NAME: ClassVar[str] = "amqp:open:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_STRING, True),
        (_STRING, False),
        (_UINT, False),
        (_USHORT, False),
        (_UINT, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
        (_FIELDS, False),
    )
    container_id: str = ""
    hostname: str | None = None
    max_frame_size: int = MAX_UINT
    channel_max: int = 0xFFFF
    idle_time_out: int | None = None
    outgoing_locales: tuple[str, ...] | None = None
    incoming_locales: tuple[str, ...] | None = None
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class Begin(Composite):
    """begin (§2.7.2): ``remote_channel`` is set when answering a peer's begin."""

    CODE: ClassVar[int] = 0x11
    NAME: ClassVar[str] = "amqp:begin:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_USHORT, False),
        (_UINT, True),
        (_UINT, True),
        (_UINT, True),
        (_UINT, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
        (_FIELDS, False),
    )
    remote_channel: int | None = None
    next_outgoing_id: int = 0
    incoming_window: int = 0
    outgoing_window: int = 0
    handle_max: int = MAX_UINT
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class Attach(Composite):
    """attach (§2.7.3). ``role``: False sender, True receiver; settle modes as
    :data:`SND_MIXED`, :data:`RCV_FIRST`, ...; ``max_message_size`` in bytes."""

    CODE: ClassVar[int] = 0x12
    NAME: ClassVar[str] = "amqp:attach:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_STRING, True),
        (_UINT, True),
        (_BOOL, True),
        (_UBYTE, False),
        (_UBYTE, False),
        (_SOURCE, False),
        (_TARGET, False),
        (_MAP, False),
        (_BOOL, False),
        (_UINT, False),
        (_ULONG, False),
        (_SYMBOLS, False),
        (_SYMBOLS, False),
        (_FIELDS, False),
    )
    name: str = ""
    handle: int = 0
    role: bool = ROLE_SENDER
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    source: Source | Described | None = None
    target: Target | Described | None = None
    unsettled: dict[Any, Any] | None = None
    incomplete_unsettled: bool = False
    initial_delivery_count: int | None = None
    max_message_size: int | None = None
    offered_capabilities: tuple[str, ...] | None = None
    desired_capabilities: tuple[str, ...] | None = None
    properties: dict[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class Flow(Composite):
    """flow (§2.7.4): session window state and, with a ``handle``, link credit."""

    CODE: ClassVar[int] = 0x13
    NAME: ClassVar[str] = "amqp:flow:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_UINT, False),
        (_UINT, True),
        (_UINT, True),
        (_UINT, True),
        (_UINT, False),
        (_UINT, False),
        (_UINT, False),
        (_UINT, False),
        (_BOOL, False),
        (_BOOL, False),
        (_FIELDS, False),
    )
    next_incoming_id: int | None = None
    incoming_window: int = 0
    next_outgoing_id: int = 0
    outgoing_window: int = 0
    handle: int | None = None
    delivery_count: int | None = None
    link_credit: int | None = None
    available: int | None = None
    drain: bool = False
    echo: bool = False
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)  # not frozen: one is made per frame, and frozen init costs 2x
class Transfer(Composite):
    """transfer (§2.7.5): its payload (message bytes) follows it in the frame."""

    CODE: ClassVar[int] = 0x14
    NAME: ClassVar[str] = "amqp:transfer:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_UINT, True),
        (_UINT, False),
        (_BINARY, False),
        (_UINT, False),
        (_BOOL, False),
        (_BOOL, False),
        (_UBYTE, False),
        (_STATE, False),
        (_BOOL, False),
        (_BOOL, False),
        (_BOOL, False),
    )
    handle: int = 0
    delivery_id: int | None = None
    delivery_tag: bytes | None = None
    message_format: int | None = None
    settled: bool | None = None
    more: bool = False
    rcv_settle_mode: int | None = None
    state: DeliveryState | None = None
    resume: bool = False
    aborted: bool = False
    batchable: bool = False


@dataclass(frozen=True, slots=True)
class Disposition(Composite):
    """disposition (§2.7.6): the state of deliveries ``first`` to ``last``."""

    CODE: ClassVar[int] = 0x15
    NAME: ClassVar[str] = "amqp:disposition:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_BOOL, True),
        (_UINT, True),
        (_UINT, False),
        (_BOOL, False),
        (_STATE, False),
        (_BOOL, False),
    )
    role: bool = ROLE_SENDER
    first: int = 0
    last: int | None = None
    settled: bool = False
    state: DeliveryState | None = None
    batchable: bool = False


@dataclass(frozen=True, slots=True)
class Detach(Composite):
    """detach (§2.7.7): ``closed`` closes the link rather than suspending it."""

    CODE: ClassVar[int] = 0x16
    NAME: ClassVar[str] = "amqp:detach:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_UINT, True), (_BOOL, False), (_ERROR, False))
    handle: int = 0
    closed: bool = False
    error: Error | None = None


@dataclass(frozen=True, slots=True)
class End(Composite):
    """end (§2.7.8)."""

    CODE: ClassVar[int] = 0x17
    NAME: ClassVar[str] = "amqp:end:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_ERROR, False),)
    error: Error | None = None


@dataclass(frozen=True, slots=True)
class Close(Composite):
    """close (§2.7.9)."""

    CODE: ClassVar[int] = 0x18
    NAME: ClassVar[str] = "amqp:close:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_ERROR, False),)
    error: Error | None = None


# -- SASL (§5.3.3) -----------------------------------------------------------------------

SASL_OK, SASL_AUTH, SASL_SYS, SASL_SYS_PERM, SASL_SYS_TEMP = range(5)


@dataclass(frozen=True, slots=True)
class SaslMechanisms(Composite):
    """sasl-mechanisms (§5.3.3.1): the server's mechanisms (``PLAIN``, ...)."""

    CODE: ClassVar[int] = 0x40
    NAME: ClassVar[str] = "amqp:sasl-mechanisms:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_SYMBOLS, True),)
    sasl_server_mechanisms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SaslInit(Composite):
    """sasl-init (§5.3.3.2): the client's mechanism and first response."""

    CODE: ClassVar[int] = 0x41
    NAME: ClassVar[str] = "amqp:sasl-init:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_SYMBOL, True), (_BINARY, False), (_STRING, False))
    mechanism: str = ""
    initial_response: bytes | None = None
    hostname: str | None = None


@dataclass(frozen=True, slots=True)
class SaslChallenge(Composite):
    """sasl-challenge (§5.3.3.3)."""

    CODE: ClassVar[int] = 0x42
    NAME: ClassVar[str] = "amqp:sasl-challenge:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_BINARY, True),)
    challenge: bytes = b""


@dataclass(frozen=True, slots=True)
class SaslResponse(Composite):
    """sasl-response (§5.3.3.4)."""

    CODE: ClassVar[int] = 0x43
    NAME: ClassVar[str] = "amqp:sasl-response:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_BINARY, True),)
    response: bytes = b""


@dataclass(frozen=True, slots=True)
class SaslOutcome(Composite):
    """sasl-outcome (§5.3.3.6): ``code`` :data:`SASL_OK` (0), :data:`SASL_AUTH` (1, bad
    credentials), :data:`SASL_SYS` (2), ... (4)."""

    CODE: ClassVar[int] = 0x44
    NAME: ClassVar[str] = "amqp:sasl-outcome:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ((_UBYTE, True), (_BINARY, False))
    code: int = SASL_OK
    additional_data: bytes | None = None


# -- message sections (§3.2) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Header(Composite):
    """header (§3.2.1): ``ttl`` in milliseconds; ``priority`` 0-255 (4 by default)."""

    CODE: ClassVar[int] = 0x70
    NAME: ClassVar[str] = "amqp:header:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_BOOL, False),
        (_UBYTE, False),
        (_UINT, False),
        (_BOOL, False),
        (_UINT, False),
    )
    durable: bool = False
    priority: int = 4
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0


@dataclass(frozen=True, slots=True)
class Properties(Composite):
    """properties (§3.2.4): ids are ulong, uuid, binary or string; times are
    milliseconds since the Unix epoch."""

    CODE: ClassVar[int] = 0x73
    NAME: ClassVar[str] = "amqp:properties:list"
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = (
        (_ANY, False),
        (_BINARY, False),
        (_ANY, False),
        (_STRING, False),
        (_ANY, False),
        (_ANY, False),
        (_SYMBOL, False),
        (_SYMBOL, False),
        (_TIMESTAMP, False),
        (_TIMESTAMP, False),
        (_STRING, False),
        (_UINT, False),
        (_STRING, False),
    )
    message_id: Any = None
    user_id: bytes | None = None
    to: Any = None
    subject: str | None = None
    reply_to: Any = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


class _Section(Composite):
    """A section holding one value (a map, binary, list or any value) rather than a
    list of fields: ``KIND`` is the value's type."""

    __slots__ = ()
    KIND: ClassVar[str]
    FIELDS: ClassVar[tuple[tuple[str, bool], ...]] = ()


@dataclass(frozen=True, slots=True)
class DeliveryAnnotations(_Section):
    """delivery-annotations (§3.2.2): a map keyed by symbols (or ulongs)."""

    CODE: ClassVar[int] = 0x71
    NAME: ClassVar[str] = "amqp:delivery-annotations:map"
    KIND: ClassVar[str] = _MAP
    value: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MessageAnnotations(_Section):
    """message-annotations (§3.2.3): a map keyed by symbols (``x-opt-...``) or ulongs."""

    CODE: ClassVar[int] = 0x72
    NAME: ClassVar[str] = "amqp:message-annotations:map"
    KIND: ClassVar[str] = _MAP
    value: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApplicationProperties(_Section):
    """application-properties (§3.2.5): a map keyed by strings."""

    CODE: ClassVar[int] = 0x74
    NAME: ClassVar[str] = "amqp:application-properties:map"
    KIND: ClassVar[str] = _MAP
    value: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Data(_Section):
    """data (§3.2.6): opaque bytes of the body."""

    CODE: ClassVar[int] = 0x75
    NAME: ClassVar[str] = "amqp:data:binary"
    KIND: ClassVar[str] = _BINARY
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class AmqpSequence(_Section):
    """amqp-sequence (§3.2.7): a list of AMQP values as the body."""

    CODE: ClassVar[int] = 0x76
    NAME: ClassVar[str] = "amqp:amqp-sequence:list"
    KIND: ClassVar[str] = _LIST
    value: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AmqpValue(_Section):
    """amqp-value (§3.2.8): one AMQP value as the body."""

    CODE: ClassVar[int] = 0x77
    NAME: ClassVar[str] = "amqp:amqp-value:*"
    KIND: ClassVar[str] = _ANY
    value: Any = None


@dataclass(frozen=True, slots=True)
class Footer(_Section):
    """footer (§3.2.9): annotations after the body (hashes, signatures)."""

    CODE: ClassVar[int] = 0x78
    NAME: ClassVar[str] = "amqp:footer:map"
    KIND: ClassVar[str] = _MAP
    value: dict[Any, Any] = field(default_factory=dict)


Performative: TypeAlias = Open | Begin | Attach | Flow | Transfer | Disposition | Detach | End | Close
SaslFrame: TypeAlias = SaslMechanisms | SaslInit | SaslChallenge | SaslResponse | SaslOutcome
Section: TypeAlias = (
    Header
    | DeliveryAnnotations
    | MessageAnnotations
    | Properties
    | ApplicationProperties
    | Data
    | AmqpSequence
    | AmqpValue
    | Footer
)

PERFORMATIVES: tuple[type[Composite], ...] = (
    Open,
    Begin,
    Attach,
    Flow,
    Transfer,
    Disposition,
    Detach,
    End,
    Close,
)
SASL_FRAMES: tuple[type[Composite], ...] = (
    SaslMechanisms,
    SaslInit,
    SaslChallenge,
    SaslResponse,
    SaslOutcome,
)
DELIVERY_STATES: tuple[type[Composite], ...] = (Received, Accepted, Rejected, Released, Modified)
SECTIONS: tuple[type[Composite], ...] = (
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
)
#: Every composite class by its numeric descriptor and by its symbolic one.
REGISTRY: dict[Any, type[Composite]] = {}
_ALL: tuple[type[Composite], ...] = (*PERFORMATIVES, *SASL_FRAMES, *DELIVERY_STATES, *SECTIONS)
_ALL += (Error, Source, Target)
for _cls in _ALL:
    REGISTRY[_cls.CODE] = _cls
    REGISTRY[_cls.NAME] = _cls

# -- to and from described values ---------------------------------------------------------


_FIELDS_OF: dict[type, tuple[tuple[str, Any, str, bool], ...]] = {}


def _fields_of(cls: type[Composite]) -> tuple[tuple[str, Any, str, bool], ...]:
    """Each field's name, spec default, type and mandatory flag, in wire order (made
    once per class: ``dataclasses.fields`` costs more than decoding a transfer)."""
    fields = _FIELDS_OF.get(cls)
    if fields is None:
        fields = _FIELDS_OF[cls] = tuple(
            (f.name, f.default, kind, mandatory)
            for (kind, mandatory), f in zip(cls.FIELDS, dc_fields(cls))  # type: ignore[arg-type]
        )
    return fields


def _write(kind: str, value: Any) -> Any:
    if value is None:
        return None
    writer = _WRITERS.get(kind)
    if writer is not None:
        return writer(value)
    if kind == _SYMBOLS:
        symbols = tuple(Symbol(item) for item in value)
        return symbols[0] if len(symbols) == 1 else Array("symbol", symbols)
    if kind == _FIELDS:
        return {Symbol(key) if type(key) is str else key: item for key, item in value.items()}
    if isinstance(value, Composite):
        return to_described(value)
    return value


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is a field's spec default (sent as null)."""
    return value is not MISSING and value == default and isinstance(value, bool) == isinstance(default, bool)


def to_described(composite: Composite) -> Described:
    """``composite`` as the described value that :func:`~leveret.protocol.amqp10.types.
    encode` writes: a list of its fields (spec defaults as null, trailing nulls left
    out), or a section's single value. Raises ValueError for a value out of its field's
    range."""
    descriptor = ULong(composite.CODE)
    if isinstance(composite, _Section):
        value = composite.value  # type: ignore[attr-defined]
        if composite.KIND == _BINARY:
            value = bytes(value)
        elif isinstance(composite, DeliveryAnnotations | MessageAnnotations | Footer):
            value = _write(_FIELDS, value)  # annotation keys are symbols (§3.2.10)
        return Described(descriptor, value)
    items = []
    for name, default, kind, mandatory in _fields_of(type(composite)):
        value = getattr(composite, name)
        if value is None:
            if mandatory:
                raise ValueError(f"{composite.NAME}: field {name} is mandatory")
        elif not mandatory and _is_default(value, default):
            value = None
        elif kind in _RANGES and not 0 <= value < _RANGES[kind]:
            raise ValueError(f"{composite.NAME}: {name} {value} is out of range for a {kind}")
        items.append(_write(kind, value))
    while items and items[-1] is None:
        items.pop()
    return Described(descriptor, items)


def _bad(cls: type[Composite], name: str, value: Any, condition: str = DECODE_ERROR) -> DecodeError:
    return DecodeError(f"{cls.NAME}: field {name} of {type(value).__name__} {value!r:.60}", condition)


def _read(cls: type[Composite], name: str, kind: str, value: Any) -> Any:
    """A field read from the wire, checked against its type."""
    if kind in _RANGES:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(cls, name, value)
        if not 0 <= value < _RANGES[kind]:
            raise _bad(cls, name, value)
        return int(value)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise _bad(cls, name, value)
        return value
    if kind in (_STRING, _SYMBOL):
        if not isinstance(value, str):
            raise _bad(cls, name, value)
        return value if kind == _STRING else Symbol(value)
    if kind == _BINARY:
        if not isinstance(value, bytes):
            raise _bad(cls, name, value)
        return value
    if kind == _TIMESTAMP:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(cls, name, value)
        return int(value)
    if kind == _SYMBOLS:
        items = value.items if isinstance(value, Array) else (value,)
        if not all(isinstance(item, str) for item in items):
            raise _bad(cls, name, value)
        return tuple(Symbol(item) for item in items)
    if kind in (_FIELDS, _MAP):
        if not isinstance(value, dict):
            raise _bad(cls, name, value)
        return value
    if kind == _LIST:
        if not isinstance(value, list):
            raise _bad(cls, name, value)
        return value
    if kind in (_ERROR, _SOURCE, _TARGET, _STATE):
        if not isinstance(value, Described):
            raise _bad(cls, name, value)
        inner = from_described(value)
        wanted: tuple[type, ...] = {
            _ERROR: (Error,),
            _SOURCE: (Source, Described),
            _TARGET: (Target, Described),
            _STATE: (*DELIVERY_STATES, Described),
        }[kind]
        if not isinstance(inner, wanted):
            raise _bad(cls, name, value)
        return inner
    return value


def from_described(described: Described) -> Any:
    """The composite a described value stands for (a ``Described`` with an unknown
    descriptor is returned as it is). Raises DecodeError (``amqp:decode-error``; for a
    mandatory field left null, ``amqp:invalid-field``)."""
    descriptor = described.descriptor
    if not isinstance(descriptor, int | str) or isinstance(descriptor, bool):
        return described
    cls = REGISTRY.get(descriptor)
    if cls is None:
        return described
    value = described.value
    if issubclass(cls, _Section):
        kind = cls.KIND
        if kind != _ANY:
            value = _read(cls, "value", kind, value)
        return cls(value)  # type: ignore[call-arg]
    if not isinstance(value, list):
        raise DecodeError(f"{cls.NAME} described by a {type(value).__name__}, not a list")
    args = {}
    fields = _fields_of(cls)
    for (name, _, kind, _), item in zip(fields, value):
        if item is None:
            continue
        args[name] = _read(cls, name, kind, item)
    for name, _, _, mandatory in fields:
        if mandatory and name not in args:
            raise DecodeError(f"{cls.NAME}: mandatory field {name} is missing", INVALID_FIELD)
    return cls(**args)
