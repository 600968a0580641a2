"""Hostile input costs only its sender: deeply nested field tables and invalid UTF-8 in
arguments get the protocol's error (502 SYNTAX_ERROR, 406 PRECONDITION_FAILED) and one
log line, never an internal error (541) with a traceback. Driven without sockets."""

from __future__ import annotations

import logging
import struct

import pytest
from pamqp import commands
from sans_io import Harness, method_frame

from leveret.amqp.field_table import MAX_NESTING, nests_deeper
from leveret.amqp.frames import encode_frame

BAD_UTF8 = b"\xff\xfeab"


def shortstr(text: str) -> bytes:
    return bytes([len(text)]) + text.encode()


def nested_table(depth: int) -> bytes:
    """A field table holding a table holding ...: ``depth`` levels in all, written by
    hand (pamqp's encoder recurses too, and gives up long before 2,000)."""
    inner = b""
    for _ in range(depth - 1):
        inner = b"\x01tF" + struct.pack(">I", len(inner)) + inner
    return struct.pack(">I", len(inner)) + inner


def table(key: str, raw: bytes) -> bytes:
    inner = shortstr(key) + b"S" + struct.pack(">I", len(raw)) + raw
    return struct.pack(">I", len(inner)) + inner


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return encode_frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def last(harness: Harness):
    return harness.frames()[-1][1]


def test_nests_deeper_counts_tables_and_arrays():
    value: object = 1
    for level in range(10):
        value = {"t": value} if level % 2 else [value]
    assert not nests_deeper(value, 10) and nests_deeper(value, 9)
    assert nests_deeper({"a": 1, "b": [1, 2], "c": {}}, 1) and not nests_deeper({"b": [1, 2]}, 2)


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 570])  # 570 levels: a frame of ~4,070 bytes
def test_client_properties_nested_too_deep_get_502_before_login(depth, caplog):
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    args = nested_table(depth) + shortstr("PLAIN") + struct.pack(">I", 12) + b"\x00guest\x00guest"
    with caplog.at_level(logging.INFO, "leveret.amqp"):
        harness.feed(method(0, 10, 11, args + shortstr("en_US")))
    close = last(harness)
    assert isinstance(close, commands.Connection.Close)
    text = ("SYNTAX_ERROR - cannot decode Connection.StartOk: "
            f"field tables nested more than {MAX_NESTING} deep")
    assert (close.reply_code, close.reply_text) == (502, text)
    assert len(caplog.records) == 1 and not caplog.records[0].exc_info  # one line, no traceback
    assert harness.transport.closed or harness.connection.state == "closing"


def test_a_start_ok_larger_than_4096_bytes_is_a_frame_error():
    """Until tune-ok a frame is at most RabbitMQ's 4,096 bytes (protocol/prelogin.py):
    2,000 levels of tables (14 kB) are refused from the frame header, unread."""
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    args = nested_table(2000) + shortstr("PLAIN") + struct.pack(">I", 12) + b"\x00guest\x00guest"
    harness.feed(method(0, 10, 11, args + shortstr("en_US")))
    close = last(harness)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 501
    assert "exceeds frame_max 4096" in close.reply_text


def test_frames_up_to_the_negotiated_frame_max_pass_after_tune_ok():
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    harness.feed(method_frame(0, commands.Connection.StartOk(
        mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US")))
    harness.feed(method_frame(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0)))
    harness.feed(method_frame(0, commands.Connection.Open(virtual_host="/")))
    harness.feed(method_frame(1, commands.Channel.Open()))
    args = struct.pack(">H", 0) + shortstr("q") + b"\x00" + table("x-pad", b"p" * 10_000)
    harness.feed(method(1, 50, 10, args))  # a queue.declare of 10 kB: over 4,096 bytes
    assert isinstance(last(harness), commands.Queue.DeclareOk)


def test_frames_sent_with_tune_ok_in_one_write_get_its_frame_max():
    """A client may write tune-ok, open and more at once: what follows tune-ok is read
    with the frame_max tune-ok chose, not the 4,096 bytes before it (RabbitMQ reads
    frame by frame likewise)."""
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    args = struct.pack(">H", 0) + shortstr("q") + b"\x00" + table("x-pad", b"p" * 10_000)
    harness.feed(
        method_frame(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest",
                                                    locale="en_US"))
        + method_frame(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0))
        + method_frame(0, commands.Connection.Open(virtual_host="/"))
        + method_frame(1, commands.Channel.Open())
        + method(1, 50, 10, args)
    )
    assert isinstance(last(harness), commands.Queue.DeclareOk)


def test_a_large_frame_before_tune_ok_in_the_same_write_is_still_refused():
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    big = method(0, 10, 11, table("pad", b"p" * 5000) + shortstr("PLAIN") + struct.pack(">I", 12)
                 + b"\x00guest\x00guest" + shortstr("en_US"))
    tune_ok = commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0)
    harness.feed(big + method_frame(0, tune_ok))
    close = last(harness)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 501


def test_tables_as_deep_as_allowed_are_accepted():
    harness = Harness()
    harness.feed(b"AMQP\x00\x00\x09\x01")
    args = nested_table(MAX_NESTING) + shortstr("PLAIN") + struct.pack(">I", 12) + b"\x00guest\x00guest"
    harness.feed(method(0, 10, 11, args + shortstr("en_US")))
    assert isinstance(last(harness), commands.Connection.Tune)


def test_queue_arguments_nested_too_deep_get_502():
    harness = Harness()
    harness.handshake()
    harness.feed(method(1, 50, 10, struct.pack(">H", 0) + shortstr("q") + b"\x00" + nested_table(500)))
    close = last(harness)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 502


def test_message_headers_nested_too_deep_get_502():
    harness = Harness()
    harness.handshake()
    headers = nested_table(MAX_NESTING + 5)
    properties = struct.pack(">H", 0x2000) + headers  # the headers flag only
    header = struct.pack(">HHQ", 60, 0, 1) + properties
    harness.feed(method(1, 60, 40, struct.pack(">H", 0) + shortstr("") + shortstr("q") + b"\x00")
                 + encode_frame(2, 1, header) + encode_frame(3, 1, b"x"))
    close = last(harness)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 502
    assert "headers nested more than" in close.reply_text


@pytest.mark.parametrize("key", ["x-overflow", "x-dead-letter-exchange", "x-queue-type", "x-queue-mode",
                                 "x-dead-letter-strategy"])
def test_invalid_utf8_in_a_string_queue_argument_gets_406(key):
    harness = Harness()
    harness.handshake()
    harness.feed(method(1, 50, 10, struct.pack(">H", 0) + shortstr("q") + b"\x00" + table(key, BAD_UTF8)))
    close = last(harness)
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/': not valid UTF-8")
