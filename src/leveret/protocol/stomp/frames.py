"""STOMP 1.0-1.2 frames: a sans-I/O parser fed bytes, and the encoder.

A frame is a command line, header lines, an empty line, a body and a NUL (STOMP 1.2
"Augmented BNF"). Between frames a bare ``\\n`` (or ``\\r\\n``) is a heart-beat. The
body runs for ``content-length`` bytes when that header is present (a NUL must follow),
else up to the first NUL. Header values are escaped from 1.1 on (``\\\\``, ``\\n``,
``\\c``; 1.2 adds ``\\r``), except in CONNECT and CONNECTED; STOMP 1.0 values are
trimmed, as ActiveMQ reads them. A header given twice keeps its first value (1.2).

Limits are ActiveMQ 5.17's (``StompWireFormat``): a command line of 1024 bytes, a
header line of 10240 bytes, 1000 headers, a body of ``max_body`` bytes (100 MiB).
Anything malformed or past a limit raises :class:`FrameError`: the connection
answers with an ERROR frame and closes.

``_cframes.pyx`` is the compiled twin of :class:`FrameParser`, :func:`encode`,
:func:`message_head`, :func:`escape` and :func:`unescape` (:mod:`leveret.compiled`):
these names are its objects when it is built, unless ``LEVERET_PURE_PYTHON=1``; the pure
ones stay reachable as ``PyFrameParser``, ``py_encode``, … for the tests that compare the
two. Both make the same :class:`Frame` objects and raise the same :class:`FrameError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...compiled import twin

MAX_COMMAND_LINE = 1024  # bytes
MAX_HEADER_LINE = 10 * 1024  # bytes
MAX_HEADERS = 1000
MAX_BODY = 100 * 1024 * 1024  # bytes (ActiveMQ's maxDataLength)
#: SEND header blocks up to this size are remembered once read: a producer sends the
#: same headers frame after frame, and a repeat costs a dict lookup and a copy.
HEAD_CACHE_MAX_BYTES = 512
HEAD_CACHE_ENTRIES = 128  # per connection; the cache starts afresh when full

#: What the parser returns for each heart-beat (an end of line between frames).
HEARTBEAT = None

#: Commands a client sends (1.2 §"Client Frames"); others are refused by name.
CLIENT_COMMANDS = frozenset(
    (
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    )
)

_UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\c": ":"}
_UNESCAPE_12 = {**_UNESCAPE, "\\r": "\r"}


class FrameError(Exception):
    """A frame that cannot be read (malformed, or over a limit); the text is the ERROR
    frame's ``message``."""


@dataclass(slots=True)
class Frame:
    """One frame: ``headers`` maps each name to its first value."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def __repr__(self) -> str:
        return f"<Frame {self.command} {self.headers} {len(self.body)} B>"


class FrameParser:
    """Turns bytes into frames. ``version`` (``"1.0"``, ``"1.1"``, ``"1.2"``) decides
    escaping and trimming and may change after CONNECT; until then frames are read
    as 1.2 reads them, which CONNECT's own rules (no escaping) override."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self._version = "1.2"
        self.max_body = max_body
        # SEND head bytes -> (command, headers, content-length)
        self._heads: dict[bytes, tuple[str, dict[str, str], int | None]] = {}
        self._buffer = bytearray()
        # a frame whose headers are read, waiting for its body
        self._command = ""
        self._headers: dict[str, str] | None = None
        self._length: int | None = None
        self._searched = 0  # bytes already searched for the NUL (no content-length)
        self._head_scanned = 0  # bytes already searched for the end of the headers
        self._pos = 0  # where the next frame starts in the buffer, during feed()

    @property
    def version(self) -> str:
        return self._version

    @version.setter
    def version(self, version: str) -> None:
        self._version = version
        self._heads.clear()  # escaping and trimming depend on it

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a frame."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes) -> list[Frame | None]:
        """The frames (and :data:`HEARTBEAT` markers) ``data`` completes, in order.
        Raises FrameError; the parser is then unusable. Frames are read at a position
        in the buffer, which drops what was read once per call (a read of many small
        frames costs one pass, not one copy per frame)."""
        buffer = self._buffer
        buffer += data
        out: list[Frame | None] = []
        self._pos = 0
        try:
            while True:
                if self._headers is None:
                    # end-of-lines between frames are heart-beats
                    pos, size = self._pos, len(buffer)
                    while pos < size and buffer[pos] in (10, 13):
                        if buffer[pos] == 10:
                            out.append(HEARTBEAT)
                        pos += 1
                    self._pos = pos
                    if pos == size or not self._read_head():
                        return out
                frame = self._read_body()
                if frame is None:
                    return out
                out.append(frame)
        finally:
            if self._pos:
                del buffer[: self._pos]
                self._pos = 0

    def _read_head(self) -> bool:
        """Read the command and headers if they are all here; False if not yet."""
        buffer, start = self._buffer, self._pos
        # the head ends at the first empty line ("\n" then "\n" or "\r\n"); what was
        # searched before is not searched again (a client may send it a byte at a time)
        scanned = start + self._head_scanned
        head_end = buffer.find(b"\n\n", max(start, scanned - 1))
        if head_end != -1 and buffer.find(b"\r", start, head_end) == -1:
            pos = -1  # the common case: lines end with \n alone
            skip = 2
        else:
            head_end = -1
            pos = buffer.find(b"\n", scanned)
        while pos != -1:
            following = buffer[pos + 1 : pos + 3]
            if following[:1] == b"\n":
                head_end, skip = pos, 2
                break
            if following == b"\r\n":
                head_end, skip = pos, 3
                break
            if len(following) < 2 and following in (b"", b"\r"):  # not all here yet
                break
            if pos - start > MAX_COMMAND_LINE + (MAX_HEADER_LINE + 1) * MAX_HEADERS:
                raise FrameError(f"the frame has more than {MAX_HEADERS} headers")
            pos = buffer.find(b"\n", pos + 1)
        if head_end == -1:
            self._head_scanned = (pos if pos != -1 else max(start, len(buffer) - 1)) - start
            self._check_partial_head()
            return False
        self._head_scanned = 0
        self._pos = head_end + skip
        head_bytes = bytes(buffer[start:head_end])
        known = self._heads.get(head_bytes)
        if known is None:
            known = self._read_new_head(head_bytes)
        self._command, headers, self._length = known
        self._headers = headers.copy()  # a handler may take a header out
        self._searched = 0
        return True

    def _read_new_head(self, head_bytes: bytes) -> tuple[str, dict[str, str], int | None]:
        """Check and read a header block not seen lately: its command, headers and
        content-length (None: the body ends at the first NUL), remembered."""
        if head_bytes.find(0) != -1:
            raise FrameError("frame headers contain a NUL byte")
        try:
            head = head_bytes.decode()
        except UnicodeDecodeError:
            raise FrameError("frame headers are not valid UTF-8") from None
        lines = head.split("\n")
        command = lines[0].rstrip("\r")
        if len(lines[0]) > MAX_COMMAND_LINE:
            raise FrameError(f"the command line is longer than {MAX_COMMAND_LINE} bytes")
        if len(lines) - 1 > MAX_HEADERS:
            raise FrameError(f"the frame has more than {MAX_HEADERS} headers")
        headers = self._parse_headers(command, lines[1:])
        length_text = headers.get("content-length")
        length = None
        if length_text is not None:
            length_text = length_text.strip()
            if not (length_text.isascii() and length_text.isdigit()):
                raise FrameError(f"invalid content-length '{length_text[:40]}'")
            # leading zeros off, and no int() of thousands of digits (ValueError past 4300)
            digits = length_text.lstrip("0")
            length = int(digits) if 0 < len(digits) <= 18 else 0 if not digits else self.max_body + 1
            if length > self.max_body:
                raise FrameError(f"the body is longer than {self.max_body} bytes")
        known = (command, headers, length)
        if command == "SEND" and len(head_bytes) <= HEAD_CACHE_MAX_BYTES:  # ACKs' ids differ
            if len(self._heads) >= HEAD_CACHE_ENTRIES:
                self._heads.clear()
            self._heads[head_bytes] = known
        return known

    def _check_partial_head(self) -> None:
        """Headers not complete yet: refuse them already if they are past the limits."""
        buffer, start = self._buffer, self._pos
        first = buffer.find(b"\n", start)
        if first == -1:
            if len(buffer) - start > MAX_COMMAND_LINE + 1:
                raise FrameError(f"the command line is longer than {MAX_COMMAND_LINE} bytes")
            return
        last = buffer.rfind(b"\n", start)
        if len(buffer) - last - 1 > MAX_HEADER_LINE:
            raise FrameError(f"a header line is longer than {MAX_HEADER_LINE} bytes")
        if len(buffer) - start > MAX_COMMAND_LINE + (MAX_HEADER_LINE + 1) * MAX_HEADERS:
            raise FrameError(f"the frame has more than {MAX_HEADERS} headers")

    def _parse_headers(self, command: str, lines: list[str]) -> dict[str, str]:
        version = self.version
        escaped = version != "1.0" and command not in ("CONNECT", "STOMP", "CONNECTED")
        trim = version == "1.0"
        headers: dict[str, str] = {}
        for line in lines:
            if len(line) > MAX_HEADER_LINE:
                raise FrameError(f"a header line is longer than {MAX_HEADER_LINE} bytes")
            if line.endswith("\r"):
                line = line[:-1]
            name, colon, value = line.partition(":")
            if not colon:
                raise FrameError(f"header line without a colon: '{line[:60]}'")
            if escaped:
                name, value = unescape(name, version), unescape(value, version)
            elif trim:
                name, value = name.strip(), value.strip()
            headers.setdefault(name, value)  # a repeated header: the first wins
        return headers

    def _read_body(self) -> Frame | None:
        buffer, start = self._buffer, self._pos
        length = self._length
        if length is not None:
            if len(buffer) - start <= length:
                return None
            if buffer[start + length] != 0:
                raise FrameError("the body is not followed by a NUL byte (content-length is wrong)")
            body = bytes(buffer[start : start + length])
            self._pos = start + length + 1
        else:
            end = buffer.find(0, start + self._searched)
            if end == -1:
                self._searched = len(buffer) - start
                if self._searched > self.max_body:
                    raise FrameError(f"the body is longer than {self.max_body} bytes")
                return None
            if end - start > self.max_body:
                raise FrameError(f"the body is longer than {self.max_body} bytes")
            body = bytes(buffer[start:end])
            self._pos = end + 1
        headers, self._headers = self._headers, None
        assert headers is not None  # _read_body runs after _read_head
        return Frame(self._command, headers, body)


def unescape(text: str, version: str) -> str:
    """A header value as ``version`` escapes it, read back (1.1: ``\\\\``, ``\\n``,
    ``\\c``; 1.2 also ``\\r``); FrameError for any other escape sequence."""
    if "\\" not in text:
        return text
    table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            pair = text[i : i + 2]
            replaced = table.get(pair)
            if replaced is None:
                raise FrameError(f"invalid escape sequence '{pair}' in a header")
            out.append(replaced)
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def escape(value: str, version: str) -> str:
    """A header value as ``version`` writes it (1.1: ``\\\\``, ``\\n``, ``\\c``; 1.2
    also ``\\r``; 1.0 cannot carry line breaks, which become spaces)."""
    if version == "1.0":
        return value.replace("\r", " ").replace("\n", " ") if ("\n" in value or "\r" in value) else value
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\n" in value:
        value = value.replace("\n", "\\n")
    if ":" in value:
        value = value.replace(":", "\\c")
    if "\r" in value:
        value = value.replace("\r", "\\r" if version == "1.2" else " ")
    return value


def encode(command: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes, version: str) -> bytes:
    """One frame's bytes; headers escaped as ``version`` requires (never in
    CONNECTED)."""
    items = headers.items() if isinstance(headers, dict) else headers
    if command == "CONNECTED":
        lines = [f"{name}:{value}" for name, value in items]
    else:
        lines = [f"{escape(name, version)}:{escape(value, version)}" for name, value in items]
    head = command + "\n" + "".join(line + "\n" for line in lines) + "\n"
    return head.encode() + body + b"\x00"


def message_head(
    start: str,
    ack: int | None,
    redelivered: bool,
    counts: tuple[tuple[str, int], ...],
    length: int | None,
    block: bytes,
) -> bytes:
    """A MESSAGE frame up to its body (written once per delivery): ``start`` (the
    command line and the header lines naming the destination and subscription, escaped
    already), ``ack:<ack>`` (a STOMP 1.2 delivery waiting for an ACK), ``redelivered:true``,
    the queue's integer ``counts`` (``x-delivery-count``, ``x-stream-offset``),
    ``content-length:<length>`` (None: a text message, whose body ends at its NUL, as
    ActiveMQ sends a TextMessage), the message's own header ``block`` and the empty line."""
    head = [start]
    if ack is not None:
        head.append(f"ack:{ack}\n")
    if redelivered:
        head.append("redelivered:true\n")
    for name, value in counts:
        head.append(f"{name}:{value}\n")
    if length is not None:
        head.append(f"content-length:{length}\n")
    return "".join(head).encode() + block + b"\n"


#: The pure-Python twins under their own names, whichever twin runs (the property
#: tests compare them with the compiled ones of ``_cframes.pyx``).
PyFrameParser = FrameParser
py_encode, py_escape, py_unescape, py_message_head = encode, escape, unescape, message_head

_compiled = twin("leveret.protocol.stomp._cframes")
if _compiled is not None:
    FrameParser = _compiled.FrameParser  # type: ignore[misc]
    encode = _compiled.encode
    escape = _compiled.escape
    unescape = _compiled.unescape
    message_head = _compiled.message_head
