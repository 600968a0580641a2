# cython: language_level=3, boundscheck=True, wraparound=True, embedsignature=True
"""Compiled twin of :mod:`leveret.protocol.stomp.frames`: ``FrameParser``, ``encode``,
``message_head``, ``escape`` and ``unescape`` with the same results and the same
FrameError texts (tests/unit/protocol/stomp/test_cframes.py compares the two on any
input). ``frames`` takes these names from here at import unless ``LEVERET_PURE_PYTHON``
is set (:mod:`leveret.compiled`); ``Frame``, ``FrameError`` and the limits are the pure
module's own.

Memory safety on hostile input: the parser reads its bytearray through a pointer and
the size taken at the same moment (the buffer is resized only after a read, in
``feed``'s ``finally``, and no Python code that could feed it runs between), and only
through :func:`_find`, :func:`_rfind`,
:func:`_find_end_of_head`, :func:`_byte` and :func:`_copy`, which clamp every index to
``[0, size)``. The header bytes of a frame not seen lately are read by the pure code's
own steps (compiled), after a byte loop that takes the common case (ASCII, no escapes,
no CR) and leaves any other to them, so an error is always the pure code's error.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memchr, memcpy

from leveret.protocol.stomp.frames import (
    HEAD_CACHE_ENTRIES as _HEAD_CACHE_ENTRIES,
    HEAD_CACHE_MAX_BYTES as _HEAD_CACHE_MAX_BYTES,
    MAX_BODY as _MAX_BODY,
    MAX_COMMAND_LINE as _MAX_COMMAND_LINE,
    MAX_HEADER_LINE as _MAX_HEADER_LINE,
    MAX_HEADERS as _MAX_HEADERS,
    Frame,
    FrameError,
)

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t items)

cdef Py_ssize_t MAX_COMMAND_LINE = _MAX_COMMAND_LINE
cdef Py_ssize_t MAX_HEADER_LINE = _MAX_HEADER_LINE
cdef Py_ssize_t MAX_HEADERS = _MAX_HEADERS
cdef Py_ssize_t HEAD_CACHE_MAX_BYTES = _HEAD_CACHE_MAX_BYTES
cdef Py_ssize_t HEAD_CACHE_ENTRIES = _HEAD_CACHE_ENTRIES
# past this many bytes a head cannot be within the limits
cdef Py_ssize_t MAX_HEAD = MAX_COMMAND_LINE + (MAX_HEADER_LINE + 1) * MAX_HEADERS

# Frame is a plain class with __slots__ (no __new__ of its own): allocated as object() would
if Frame.__new__ is not object.__new__:
    raise ImportError("frames.Frame has its own __new__: _cframes must call it")
cdef PyTypeObject* _FRAME = <PyTypeObject*>Frame  # the module holds Frame
cdef dict _UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\c": ":"}
cdef dict _UNESCAPE_12 = {**_UNESCAPE, "\\r": "\r"}


# -- bounds-checked access to a buffer (p, size) ------------------------------------------
cdef inline Py_ssize_t _find(const char* p, Py_ssize_t size, char c, Py_ssize_t start,
                             Py_ssize_t end) noexcept:
    """The first index of ``c`` in ``p[start:end]`` (both clamped to the buffer), -1 if none."""
    if start < 0:
        start = 0
    if end > size:
        end = size
    if start >= end:
        return -1
    cdef const char* hit = <const char*>memchr(p + start, c, <size_t>(end - start))
    return -1 if hit == NULL else hit - p


cdef inline Py_ssize_t _rfind(const char* p, Py_ssize_t size, char c, Py_ssize_t start) noexcept:
    """The last index of ``c`` in ``p[start:size]``, -1 if none."""
    cdef Py_ssize_t i = size - 1
    if start < 0:
        start = 0
    while i >= start:
        if p[i] == c:
            return i
        i -= 1
    return -1


cdef inline int _byte(const char* p, Py_ssize_t size, Py_ssize_t i) noexcept:
    """The byte at ``i`` (0-255), -1 past either end."""
    if i < 0 or i >= size:
        return -1
    return <unsigned char>p[i]


cdef inline Py_ssize_t _find_end_of_head(const char* p, Py_ssize_t size, Py_ssize_t start) noexcept:
    """The first index ``i >= start`` with ``p[i:i+2] == b"\\n\\n"``, -1 if none."""
    cdef Py_ssize_t i = _find(p, size, b"\n", start, size)
    while i != -1:
        if _byte(p, size, i + 1) == 10:
            return i
        i = _find(p, size, b"\n", i + 1, size)
    return -1


cdef inline bytes _copy(const char* p, Py_ssize_t size, Py_ssize_t start, Py_ssize_t end):
    """``bytes(p[start:end])``, the bounds clamped."""
    if start < 0:
        start = 0
    if end > size:
        end = size
    if end < start:
        end = start
    return PyBytes_FromStringAndSize(p + start, end - start)


# -- the parser ------------------------------------------------------------------------
cdef class FrameParser:
    """Turns bytes into frames; the twin of ``frames.FrameParser`` (see its docs)."""

    cdef str _version
    cdef public Py_ssize_t max_body  # bytes (a C integer: no Python code runs mid-read)
    cdef readonly dict _heads  # SEND head bytes -> (command, headers, content-length)
    cdef bytearray _buffer
    # a frame whose headers are read, waiting for its body
    cdef str _command
    cdef dict _headers
    cdef Py_ssize_t _length  # -1: the body ends at the first NUL
    cdef Py_ssize_t _searched  # bytes already searched for the NUL (no content-length)
    cdef Py_ssize_t _head_scanned  # bytes already searched for the end of the headers
    cdef Py_ssize_t _pos  # where the next frame starts in the buffer, during feed()
    cdef bint _remembered  # whether _read_new_head put its head in _heads

    def __init__(self, max_body=_MAX_BODY):
        self._version = "1.2"
        self.max_body = max_body
        self._heads = {}
        self._buffer = bytearray()
        self._command = ""
        self._headers = None
        self._length = -1
        self._searched = 0
        self._head_scanned = 0
        self._pos = 0

    @property
    def version(self):
        return self._version

    @version.setter
    def version(self, version):
        self._version = version
        self._heads.clear()  # escaping and trimming depend on it

    @property
    def buffered(self):
        """Bytes received but not yet part of a frame."""
        return PyByteArray_GET_SIZE(self._buffer) - self._pos

    def feed(self, data):
        """The frames (and ``HEARTBEAT`` markers) ``data`` completes, in order. Raises
        FrameError; the parser is then unusable."""
        cdef bytearray buffer = self._buffer
        cdef const char* p
        cdef Py_ssize_t pos, size
        cdef int byte
        cdef list out = []
        buffer += data
        self._pos = 0
        try:
            while True:
                if self._headers is None:
                    # end-of-lines between frames are heart-beats
                    p = PyByteArray_AS_STRING(buffer)
                    size = PyByteArray_GET_SIZE(buffer)
                    pos = self._pos
                    while True:
                        byte = _byte(p, size, pos)
                        if byte == 10:
                            out.append(None)
                        elif byte != 13:
                            break
                        pos += 1
                    self._pos = pos
                    if pos >= size or not self._read_head():
                        return out
                frame = self._read_body()
                if frame is None:
                    return out
                out.append(frame)
        finally:
            if self._pos:
                del buffer[: self._pos]
                self._pos = 0

    cdef bint _read_head(self) except -1:
        """Read the command and headers if they are all here; False if not yet."""
        cdef bytearray buffer = self._buffer
        cdef const char* p = PyByteArray_AS_STRING(buffer)
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(buffer)
        cdef Py_ssize_t start = self._pos
        cdef Py_ssize_t scanned = start + self._head_scanned
        cdef Py_ssize_t head_end, line_end, skip = 2
        cdef int after, after2
        # the head ends at the first empty line ("\n" then "\n" or "\r\n"); what was
        # searched before is not searched again (a client may send it a byte at a time)
        head_end = _find_end_of_head(p, size, max(start, scanned - 1))
        if head_end != -1 and _find(p, size, b"\r", start, head_end) == -1:
            line_end = -1  # the common case: lines end with \n alone
        else:
            head_end = -1
            line_end = _find(p, size, b"\n", scanned, size)
        while line_end != -1:
            after = _byte(p, size, line_end + 1)
            after2 = _byte(p, size, line_end + 2)
            if after == 10:
                head_end, skip = line_end, 2
                break
            if after == 13 and after2 == 10:
                head_end, skip = line_end, 3
                break
            if after == -1 or (after == 13 and after2 == -1):  # not all here yet
                break
            if line_end - start > MAX_HEAD:
                raise FrameError(f"the frame has more than {MAX_HEADERS} headers")
            line_end = _find(p, size, b"\n", line_end + 1, size)
        if head_end == -1:
            self._head_scanned = (line_end if line_end != -1 else max(start, size - 1)) - start
            self._check_partial_head()
            return False
        self._head_scanned = 0
        self._pos = head_end + skip
        head_bytes = _copy(p, size, start, head_end)
        known = self._heads.get(head_bytes)
        shared = known is not None
        if not shared:
            known = self._read_new_head(head_bytes)
            shared = self._remembered
        command, headers, length = <tuple>known
        self._command = command
        # a handler may take a header out: a remembered head's headers are copied
        self._headers = (<dict>headers).copy() if shared else headers
        self._length = -1 if length is None else length
        self._searched = 0
        return True

    cdef tuple _read_new_head(self, bytes head_bytes):
        """Check and read a header block not seen lately: its command, headers and
        content-length (None: the body ends at the first NUL), remembered."""
        cdef str command
        cdef dict headers
        read = self._plain_head(head_bytes) if self._version != "1.0" else None
        if read is None:
            read = self._any_head(head_bytes)
        command, headers = read
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
        self._remembered = command == "SEND" and PyBytes_GET_SIZE(head_bytes) <= HEAD_CACHE_MAX_BYTES
        if self._remembered:  # not other commands: ACKs' ids differ
            if len(self._heads) >= HEAD_CACHE_ENTRIES:
                self._heads.clear()
            self._heads[head_bytes] = known
        return known

    cdef tuple _plain_head(self, bytes head_bytes):
        """(command, headers) of a head in ASCII without NUL, backslash or CR and within
        the limits, read byte by byte (1.1 and 1.2, where no escape means no change);
        None for any other head (:meth:`_any_head` reads it, or says what is wrong)."""
        cdef const char* p = PyBytes_AS_STRING(head_bytes)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(head_bytes)
        cdef Py_ssize_t i, line, end, colon, count = 0
        cdef unsigned char byte
        for i in range(size):
            byte = <unsigned char>p[i]
            if byte >= 0x80 or byte == 0 or byte == 13 or byte == 92:  # 92: backslash
                return None
        end = _find(p, size, b"\n", 0, size)
        if end == -1:
            end = size
        if end > MAX_COMMAND_LINE:
            return None
        command = PyUnicode_DecodeASCII(p, end, NULL)
        cdef dict headers = {}
        line = end + 1
        while line <= size and end < size:
            end = _find(p, size, b"\n", line, size)
            if end == -1:
                end = size
            count += 1
            if count > MAX_HEADERS or end - line > MAX_HEADER_LINE:
                return None
            colon = _find(p, size, b":", line, end)
            if colon == -1:
                return None
            name = PyUnicode_DecodeASCII(p + line, colon - line, NULL)
            if name not in headers:  # a repeated header: the first wins
                headers[name] = PyUnicode_DecodeASCII(p + colon + 1, end - colon - 1, NULL)
            line = end + 1
        return command, headers

    cdef tuple _any_head(self, bytes head_bytes):
        """(command, headers) of any head, read as the pure parser reads it (the same
        steps, so the same FrameError)."""
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
        return command, self._parse_headers(command, lines[1:])

    cdef int _check_partial_head(self) except -1:
        """Headers not complete yet: refuse them already if they are past the limits."""
        cdef bytearray buffer = self._buffer
        cdef const char* p = PyByteArray_AS_STRING(buffer)
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(buffer)
        cdef Py_ssize_t start = self._pos
        cdef Py_ssize_t first = _find(p, size, b"\n", start, size)
        if first == -1:
            if size - start > MAX_COMMAND_LINE + 1:
                raise FrameError(f"the command line is longer than {MAX_COMMAND_LINE} bytes")
            return 0
        cdef Py_ssize_t last = _rfind(p, size, b"\n", start)
        if size - last - 1 > MAX_HEADER_LINE:
            raise FrameError(f"a header line is longer than {MAX_HEADER_LINE} bytes")
        if size - start > MAX_HEAD:
            raise FrameError(f"the frame has more than {MAX_HEADERS} headers")
        return 0

    cdef dict _parse_headers(self, str command, list lines):
        version = self._version
        escaped = version != "1.0" and command not in ("CONNECT", "STOMP", "CONNECTED")
        trim = version == "1.0"
        cdef dict headers = {}
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

    cdef object _read_body(self):
        cdef bytearray buffer = self._buffer
        cdef const char* p = PyByteArray_AS_STRING(buffer)
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(buffer)
        cdef Py_ssize_t start = self._pos
        cdef Py_ssize_t length = self._length
        cdef Py_ssize_t end
        if length >= 0:
            if size - start <= length:
                return None
            if _byte(p, size, start + length) != 0:
                raise FrameError("the body is not followed by a NUL byte (content-length is wrong)")
            body = _copy(p, size, start, start + length)
            self._pos = start + length + 1
        else:
            end = _find(p, size, 0, start + self._searched, size)
            if end == -1:
                self._searched = size - start
                if self._searched > self.max_body:
                    raise FrameError(f"the body is longer than {self.max_body} bytes")
                return None
            if end - start > self.max_body:
                raise FrameError(f"the body is longer than {self.max_body} bytes")
            body = _copy(p, size, start, end)
            self._pos = end + 1
        # what Frame(command, headers, body) does, without a Python call to __init__
        frame = PyType_GenericAlloc(_FRAME, 0)
        frame.command = self._command
        frame.headers = self._headers
        frame.body = body
        self._headers = None
        return frame


# -- header values ------------------------------------------------------------------------
def unescape(text, version):
    """A header value as ``version`` escapes it, read back; FrameError for an escape
    sequence the version does not know (see ``frames.unescape``)."""
    if "\\" not in text:
        return text
    cdef dict table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE
    cdef list out = []
    cdef Py_ssize_t i = 0, j
    while True:
        j = text.find("\\", i)
        if j == -1:
            out.append(text[i:])
            break
        out.append(text[i:j])
        pair = text[j : j + 2]
        replaced = table.get(pair)
        if replaced is None:
            raise FrameError(f"invalid escape sequence '{pair}' in a header")
        out.append(replaced)
        i = j + 2
    return "".join(out)


def escape(value, version):
    """A header value as ``version`` writes it (see ``frames.escape``)."""
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


def encode(command, headers, body, version):
    """One frame's bytes (see ``frames.encode``)."""
    items = headers.items() if isinstance(headers, dict) else headers
    if command == "CONNECTED":
        lines = [f"{name}:{value}" for name, value in items]
    else:
        lines = [f"{escape(name, version)}:{escape(value, version)}" for name, value in items]
    head = command + "\n" + "".join([line + "\n" for line in lines]) + "\n"
    return head.encode() + body + b"\x00"


# -- MESSAGE -----------------------------------------------------------------------------
cdef inline Py_ssize_t _decimal(long long value, char* out) noexcept:
    """``value`` (>= 0) in decimal into ``out`` (20 bytes at least); its length."""
    cdef char digits[20]
    cdef Py_ssize_t n = 0, i
    while True:
        digits[n] = <char>(48 + value % 10)
        value //= 10
        n += 1
        if value == 0 or n == 20:
            break
    for i in range(n):
        out[i] = digits[n - 1 - i]
    return n


cdef bytes _number_text(object value, char* out, Py_ssize_t* size):
    """A number header's value: written into ``out`` (``size`` set) when ``value`` is an
    int from 0 to 10**18, else returned as the pure code's f-string would write it."""
    cdef long long number
    if type(value) is int and 0 <= value < 10**18:
        number = value
        size[0] = _decimal(number, out)
        return None
    return format(value, "").encode()


def message_head(str start, ack, redelivered, counts, length, block):
    """A MESSAGE frame up to its body, in one allocation (see ``frames.message_head``)."""
    cdef char ack_digits[24]
    cdef char length_digits[24]
    cdef Py_ssize_t ack_size = 0, length_size = 0, start_size, extra_size = 0, block_size, total
    cdef bytes ack_text = None, length_text = None, extra = None
    cdef bytes block_bytes = block if type(block) is bytes else bytes(block)
    cdef const char* start_p = PyUnicode_AsUTF8AndSize(start, &start_size)
    cdef bint again = redelivered
    if ack is not None:
        ack_text = _number_text(ack, ack_digits, &ack_size)
        if ack_text is not None:
            ack_size = PyBytes_GET_SIZE(ack_text)
    if counts:
        extra = "".join([f"{name}:{value}\n" for name, value in counts]).encode()
        extra_size = PyBytes_GET_SIZE(extra)
    if length is not None:
        length_text = _number_text(length, length_digits, &length_size)
        if length_text is not None:
            length_size = PyBytes_GET_SIZE(length_text)
    block_size = PyBytes_GET_SIZE(block_bytes)
    total = start_size + block_size + 1 + extra_size
    if ack is not None:
        total += 5 + ack_size  # "ack:" digits "\n"
    if again:
        total += 17  # "redelivered:true\n"
    if length is not None:
        total += 16 + length_size  # "content-length:" digits "\n"
    cdef bytes head = PyBytes_FromStringAndSize(NULL, total)
    cdef char* out = PyBytes_AS_STRING(head)
    cdef Py_ssize_t at = 0
    cdef const char* source
    memcpy(out, start_p, start_size)
    at = start_size
    if ack is not None:
        memcpy(out + at, b"ack:", 4)
        at += 4
        source = <const char*>ack_digits if ack_text is None else PyBytes_AS_STRING(ack_text)
        memcpy(out + at, source, ack_size)
        at += ack_size
        out[at] = b"\n"
        at += 1
    if again:
        memcpy(out + at, b"redelivered:true\n", 17)
        at += 17
    if extra is not None:
        memcpy(out + at, PyBytes_AS_STRING(extra), extra_size)
        at += extra_size
    if length is not None:
        memcpy(out + at, b"content-length:", 15)
        at += 15
        source = <const char*>length_digits if length_text is None else PyBytes_AS_STRING(length_text)
        memcpy(out + at, source, length_size)
        at += length_size
        out[at] = b"\n"
        at += 1
    memcpy(out + at, PyBytes_AS_STRING(block_bytes), block_size)
    at += block_size
    out[at] = b"\n"
    at += 1
    assert at == total
    return head
