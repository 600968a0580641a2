"""The AMQP 1.0 type codec against python-qpid-proton's C codec (``proton.Data``):
values leveret encodes decode identically with proton, and values proton encodes decode
identically with leveret, for every type (hypothesis), plus the performatives proton's
own engine writes. Skipped without python-qpid-proton (the ``test`` extra installs it)."""

from __future__ import annotations

from typing import Any

import pytest
from amqp10_values import same, values
from hypothesis import given, settings

from leveret.protocol.amqp10 import frames as f, performatives as p, types as t

proton = pytest.importorskip("proton")
from proton import _data as pd  # noqa: E402  (after the skip)

#: proton's array element types and leveret's names for them.
PN_TYPES = {
    pd.PN_NULL: "null",
    pd.PN_BOOL: "boolean",
    pd.PN_UBYTE: "ubyte",
    pd.PN_USHORT: "ushort",
    pd.PN_UINT: "uint",
    pd.PN_ULONG: "ulong",
    pd.PN_BYTE: "byte",
    pd.PN_SHORT: "short",
    pd.PN_INT: "int",
    pd.PN_LONG: "long",
    pd.PN_FLOAT: "float",
    pd.PN_DOUBLE: "double",
    pd.PN_DECIMAL32: "decimal32",
    pd.PN_DECIMAL64: "decimal64",
    pd.PN_DECIMAL128: "decimal128",
    pd.PN_CHAR: "char",
    pd.PN_TIMESTAMP: "timestamp",
    pd.PN_UUID: "uuid",
    pd.PN_BINARY: "binary",
    pd.PN_STRING: "string",
    pd.PN_SYMBOL: "symbol",
    pd.PN_LIST: "list",
    pd.PN_MAP: "map",
    pd.PN_ARRAY: "array",
}
TYPE_CODES = {name: code for code, name in PN_TYPES.items()}
#: leveret's wrapper -> proton's, for the types both wrap.
TO_PROTON = [
    (t.UByte, proton.ubyte),
    (t.UShort, proton.ushort),
    (t.UInt, proton.uint),
    (t.ULong, proton.ulong),
    (t.Byte, proton.byte),
    (t.Short, proton.short),
    (t.Int, proton.int32),
    (t.Timestamp, proton.timestamp),
    (t.Float32, proton.float32),
    (t.Char, proton.char),
    (t.Symbol, proton.symbol),
]


def to_proton(value: Any) -> Any:
    """leveret's Python representation of a value as proton's."""
    if isinstance(value, bool) or value is None:
        return value
    for mine, theirs in TO_PROTON:
        if isinstance(value, mine):
            return theirs(value)
    if isinstance(value, t.Decimal32):
        return proton.decimal32(int.from_bytes(value, "big"))
    if isinstance(value, t.Decimal64):
        return proton.decimal64(int.from_bytes(value, "big"))
    if isinstance(value, t.Decimal128):
        return proton.decimal128(bytes(value))
    if isinstance(value, list | tuple):
        return [to_proton(item) for item in value]
    if isinstance(value, dict):
        return {to_proton(key): to_proton(item) for key, item in value.items()}
    if isinstance(value, t.Described):
        return proton.Described(to_proton(value.descriptor), to_proton(value.value))
    if isinstance(value, t.Array):
        descriptor = pd.UNDESCRIBED if value.descriptor is None else to_proton(value.descriptor)
        return proton.Array(descriptor, TYPE_CODES[value.type], *(to_proton(item) for item in value.items))
    return value  # int (long), float (double), str, bytes, UUID


FROM_PROTON = [(theirs, mine) for mine, theirs in TO_PROTON]


def from_proton(value: Any) -> Any:
    """proton's Python representation of a value as leveret's."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, proton.decimal32):
        return t.Decimal32(int(value).to_bytes(4, "big"))
    if isinstance(value, proton.decimal64):
        return t.Decimal64(int(value).to_bytes(8, "big"))
    if isinstance(value, proton.decimal128):
        return t.Decimal128(bytes(value))
    for theirs, mine in FROM_PROTON:
        if isinstance(value, theirs):
            return mine(value)
    if isinstance(value, list):
        return [from_proton(item) for item in value]
    if isinstance(value, dict):
        return {from_proton(key): from_proton(item) for key, item in value.items()}
    if isinstance(value, proton.Described):
        return t.Described(from_proton(value.descriptor), from_proton(value.value))
    if isinstance(value, proton.Array):
        descriptor = None if value.descriptor is pd.UNDESCRIBED else from_proton(value.descriptor)
        return t.Array(PN_TYPES[value.type], tuple(from_proton(item) for item in value.elements), descriptor)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def proton_can(value: Any) -> bool:
    """Whether proton's Python layer (not its C codec) represents ``value``: it returns
    binary as memoryview, which cannot be a dict key, and reads arrays of lists, maps
    and arrays back with element type 0, and drops what follows a described value whose
    value is itself described (proton 0.40; its C codec reads all of them right)."""
    if isinstance(value, list | tuple):
        return all(proton_can(item) for item in value)
    if isinstance(value, dict):
        return all(not isinstance(key, bytes) and proton_can(item) for key, item in value.items())
    if isinstance(value, t.Described):
        inner = value.value
        if isinstance(inner, t.Described):
            return False
        return proton_can(value.descriptor) and proton_can(inner)
    if isinstance(value, t.Array):
        return value.type not in ("list", "map", "array") and proton_can(value.descriptor)
    return True


def proton_decode(data: bytes) -> Any:
    decoder = proton.Data()
    assert decoder.decode(data) == len(data)
    decoder.rewind()
    decoder.next()
    return from_proton(decoder.get_object())  # now: proton's memoryviews die with the Data


def proton_encode(value: Any) -> bytes:
    encoder = proton.Data()
    encoder.put_object(to_proton(value))
    return encoder.encode()


@settings(max_examples=300, deadline=None, derandomize=True)  # proton's quirks: not by chance
@given(values.filter(proton_can))
def test_leveret_encodes_what_proton_decodes(value):
    assert same(proton_decode(t.encode(value)), value)


@settings(max_examples=300, deadline=None, derandomize=True)  # proton's quirks: not by chance
@given(values.filter(proton_can))
def test_proton_encodes_what_leveret_decodes(value):
    data = proton_encode(value)
    decoded, end = t.decode(data)
    assert end == len(data)
    assert same(decoded, value)


@pytest.mark.parametrize(
    "value",
    [
        t.UInt(0),
        t.UInt(7),
        t.UInt(70000),
        t.ULong(0),
        t.ULong(9),
        t.Int(3),
        5,
        [],
        "s",
        t.Symbol("sym"),
        b"bin",
    ],
    ids=repr,
)
def test_both_choose_the_same_smallest_encoding(value):
    assert t.encode(value) == proton_encode(value)


def test_proton_writes_lists_and_maps_in_their_32_bit_forms():
    """Where the two differ: leveret writes list8/map8/array8 when they fit, proton
    always list32/map32/array32 (and sym32/str32 inside arrays); each reads the other's."""
    values = ([None, t.UInt(1), "x"], {t.Symbol("k"): "v"}, t.Array("symbol", (t.Symbol("a"), t.Symbol("b"))))
    for value in values:
        ours, theirs = t.encode(value), proton_encode(value)
        assert ours[0] in (t.LIST8, t.MAP8, t.ARRAY8) and theirs[0] in (t.LIST32, t.MAP32, t.ARRAY32)
        assert same(t.decode(theirs)[0], value) and same(proton_decode(ours), value)


def _engine_bytes() -> bytes:
    """What proton's engine writes to open a connection, session and link and send a
    message (a Transport with no peer; the output is read, not sent)."""
    connection = proton.Connection()
    connection.container = "proton-client"
    connection.hostname = "localhost"
    transport = proton.Transport()
    transport.max_frame_size = 65536
    transport.idle_timeout = 30
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("sender-link")
    sender.target.address = "/queues/q"
    sender.open()
    out = b""
    while (pending := transport.pending()) > 0:
        out += transport.peek(pending)
        transport.pop(pending)
    return out


def test_the_frames_proton_writes_read_back():
    data = _engine_bytes()
    items = f.FrameReader().feed(data)
    header, *frames = items
    assert header == f.ProtocolHeader(f.PROTOCOL_AMQP)
    bodies = [frame.body for frame in frames]
    open_, begin, attach = bodies[:3]
    assert (
        isinstance(open_, p.Open) and open_.container_id == "proton-client" and open_.hostname == "localhost"
    )
    assert (
        open_.max_frame_size == 65536 and open_.idle_time_out == 15_000
    )  # proton advertises half its timeout
    assert isinstance(begin, p.Begin) and begin.remote_channel is None
    assert isinstance(attach, p.Attach) and attach.name == "sender-link" and attach.role == p.ROLE_SENDER
    assert isinstance(attach.target, p.Target) and attach.target.address == "/queues/q"
    for frame in frames:  # and each re-encodes to something proton reads as the same
        ours = f.encode_frame(frame.body, frame.channel)[8:]
        theirs = proton_decode(ours)
        assert same(from_proton(theirs), t.decode(ours)[0])
