"""Fuzzing what a connection worker hands the core (leveret.amqp.handoff): any frames,
valid publishes or not, are either passed on as they are or parsed into one item that
stands for exactly the frames it replaced; nothing raises."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from sans_io import FUZZ
from twins import TWINS

from leveret.amqp import properties as wire
from leveret.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FrameReader,
    encode_publish,
    publish_fields,
)
from leveret.amqp.handoff import PARSED_PUBLISH, as_frames, parse_publishes


def frames_of(data: bytes) -> list[tuple[int, int, bytes]]:
    return FrameReader(1 << 20).feed(data)


def expand(items: list) -> list:
    out = []
    for item in items:
        out += as_frames(item[1], item[2]) if item[0] == PARSED_PUBLISH else [item]
    return out


def test_a_whole_publish_becomes_one_item_with_its_fields() -> None:
    data = encode_publish(
        3, "amq.topic", "a.b", b"hello", {"content_type": "text/plain"}, 4096, mandatory=True
    )
    frames = frames_of(data)
    (item,) = parse_publishes(frames)
    assert item[:2] == (PARSED_PUBLISH, 3)
    exchange, routing_key, mandatory, header, body, facts, payload = item[2]
    assert (exchange, routing_key, mandatory, body) == ("amq.topic", "a.b", True, b"hello")
    assert header == frames[1][2] and payload == frames[0][2]
    assert facts == wire.scan(header)
    assert expand([item]) == frames


def test_an_empty_body_takes_two_frames_and_a_split_body_is_left_alone() -> None:
    empty = frames_of(encode_publish(1, "", "q", b"", {}, 4096))
    assert len(empty) == 2 and [i[0] for i in parse_publishes(empty)] == [PARSED_PUBLISH]
    split = frames_of(encode_publish(1, "", "q", b"x" * 10_000, {}, 4096))  # three body frames
    assert len(split) == 5 and parse_publishes(split) == split


def test_immediate_and_incomplete_publishes_stay_frames() -> None:
    frames = frames_of(encode_publish(1, "", "q", b"body", {}, 4096))
    method = frames[0][2]
    immediate = (FRAME_METHOD, 1, method[:-1] + bytes((method[-1] | 2,)))
    assert publish_fields(immediate[2])[3] is True
    assert parse_publishes([immediate, *frames[1:]]) == [immediate, *frames[1:]]
    assert parse_publishes(frames[:2]) == frames[:2]  # the body is in the next read
    other_channel = [frames[0], (FRAME_HEADER, 2, frames[1][2]), frames[2]]
    assert parse_publishes(other_channel) == other_channel


payloads = st.binary(max_size=40)
frame = st.one_of(
    st.tuples(
        st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT]),
        st.integers(0, 3),
        payloads,
    ),
    # the start of a publish method, then anything: a valid one or a broken one
    st.tuples(st.just(FRAME_METHOD), st.integers(0, 3), payloads.map(lambda p: b"\x00\x3c\x00\x28" + p)),
    st.builds(
        lambda channel, body, key: frames_of(encode_publish(channel, "", key, body, {"priority": 1}, 4096)),
        st.integers(1, 3),
        st.binary(max_size=30),
        st.text(max_size=10),
    ),
)


@FUZZ
@pytest.mark.parametrize("twin", TWINS)
@given(st.lists(frame, max_size=12))
def test_any_frames_come_back_as_they_were(twin, parts: list) -> None:
    frames = []
    for part in parts:
        frames += part if isinstance(part, list) else [part]
    items = twin.handoff.parse_publishes(frames)
    assert expand(items) == frames
    for item in items:
        if item[0] == PARSED_PUBLISH:
            header, body = item[2][3], item[2][4]
            assert wire.declared_body_size(header) == len(body)
