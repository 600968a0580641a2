"""Read coalescing decided read by read, with the fake loop's clock (tests/sans_io.py)
and a recording transport: when a socket is held, for how long, and when it must not
be."""

from __future__ import annotations

import pytest
from sans_io import FakeLoop

from leveret.server.read_coalescing import LARGE_READ, SMALL_READ, STREAK, STREAMING_GAP, ReadCoalescer

HOLD = 0.001


class Socket:
    """A transport that records pause/resume calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closing = False

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return self.closing


class Rig:
    def __init__(self, hold: float = HOLD) -> None:
        self.socket, self.loop = Socket(), FakeLoop()
        self.blocked = False
        self.holds = self.releases = 0
        self.coalescer = ReadCoalescer(
            self.socket, self.loop, hold, lambda: not self.blocked, self._held, self._released,
            now=self.loop.monotonic,
        )

    def _held(self) -> None:
        self.holds += 1

    def _released(self) -> None:
        self.releases += 1

    def read(self, size: int = 135, quiet: bool = True, gap: float = 20e-6) -> None:
        self.loop.advance(gap)
        self.coalescer.after_read(size, quiet)

    def expire(self) -> None:
        """Let the hold's time pass (its timer is the only one the coalescer sets)."""
        assert self.loop.pending() == [pytest.approx(self.loop.now + HOLD)]
        self.loop.advance(HOLD)
        assert self.loop.pending() == []


def test_a_stream_of_small_quiet_reads_is_held_once_it_is_a_stream():
    rig = Rig()
    for _ in range(STREAK):  # the first read has no predecessor, so STREAK + 1 reads
        rig.read()
    assert rig.socket.calls == []
    rig.read()
    assert rig.socket.calls == ["pause"] and rig.holds == 1
    assert rig.coalescer.holding and len(rig.loop.pending()) == 1


def test_the_read_after_a_hold_continues_the_stream_unless_it_is_large():
    rig = Rig()
    for _ in range(STREAK + 1):
        rig.read()
    rig.expire()
    assert rig.socket.calls == ["pause", "resume"] and not rig.coalescer.holding
    rig.read(size=20 * SMALL_READ, gap=1e-6)  # what accumulated, read at once: held again
    assert rig.socket.calls[-1] == "pause" and rig.holds == 2
    rig.expire()
    rig.read(size=LARGE_READ, gap=1e-6)  # large enough to pay for its own wake-up
    assert rig.socket.calls[-1] == "resume" and rig.holds == 2


@pytest.mark.parametrize(
    "read",
    [
        {"quiet": False},  # it asked for an answer (a reply, a confirm, a delivery)
        {"gap": STREAMING_GAP * 2},  # the client writes slower than the broker wakes
        {"size": SMALL_READ},  # a read this size is not the per-frame trickle
    ],
    ids=["answered", "slow", "large"],
)
def test_reads_that_are_not_a_quiet_fast_trickle_are_never_held(read):
    rig = Rig()
    for _ in range(10 * STREAK):
        rig.read(**read)
    assert rig.socket.calls == [] and rig.holds == 0


def test_one_answered_read_restarts_the_count():
    rig = Rig()
    for _ in range(STREAK):
        rig.read()
    rig.read(quiet=False)
    for _ in range(STREAK - 1):
        rig.read()
    assert rig.socket.calls == []
    rig.read()
    assert rig.socket.calls == ["pause"]


def test_hold_zero_turns_it_off():
    rig = Rig(hold=0)
    for _ in range(10 * STREAK):
        rig.read()
    assert rig.socket.calls == [] and rig.loop.pending() == []


def test_a_hold_ending_during_a_resource_alarm_leaves_the_socket_paused():
    """connection.blocked paused the socket too: only the alarm's end resumes it."""
    rig = Rig()
    for _ in range(STREAK + 1):
        rig.read()
    rig.blocked = True
    rig.expire()
    assert rig.socket.calls == ["pause"] and not rig.coalescer.holding


def test_a_hold_ending_after_the_socket_closed_does_not_touch_it():
    rig = Rig()
    for _ in range(STREAK + 1):
        rig.read()
    rig.socket.closing = True
    rig.expire()
    assert rig.socket.calls == ["pause"]


def test_released_early_the_caller_reads_and_the_stream_goes_on():
    """Another connection is about to be read: the listener ends the hold and reads the
    socket itself; the timer is cancelled and the next read may hold again."""
    rig = Rig()
    for _ in range(STREAK + 1):
        rig.read()
    assert len(rig.loop.pending()) == 1
    assert rig.coalescer.release() is True
    assert rig.loop.pending() == [] and not rig.coalescer.holding and rig.releases == 1  # cancelled
    assert rig.socket.calls == ["pause"]  # resuming is the caller's, after its read
    assert rig.coalescer.release() is False  # no hold: nothing to end
    rig.read(size=4 * SMALL_READ, gap=1e-6)
    assert rig.socket.calls == ["pause", "pause"] and rig.holds == 2


def test_released_early_during_an_alarm_the_caller_must_not_read():
    rig = Rig()
    for _ in range(STREAK + 1):
        rig.read()
    rig.blocked = True
    assert rig.coalescer.release() is False and rig.releases == 1


def test_a_hold_lifted_by_another_pause_ends_before_the_read_is_fed(tmp_path):
    """The store's answer resumes reading while a hold's timer still runs: the read the
    loop then delivers must be fed before anything drained from the socket (found by
    review: newer bytes overtook it)."""
    import socket

    from leveret.server.listener import ClientProtocol

    class Connection:
        reading_paused = False
        quiet = True
        peer = "x"

        def __init__(self) -> None:
            self.fed: list[bytes] = []

        def data_received(self, data: bytes, whole: bool = False) -> None:
            self.fed.append(data)

    class Listener:
        def __init__(self) -> None:
            self.held: set = set()

        def read_held(self) -> None:
            for protocol in list(self.held):
                if protocol in self.held:
                    protocol.read_now()

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    listener, protocol = Listener(), ClientProtocol.__new__(ClientProtocol)
    protocol.listener, protocol.connection, protocol.transport = listener, Connection(), Socket()
    protocol._fileno, protocol._sniffing = ours.fileno(), False
    loop = FakeLoop()
    protocol.coalescer = ReadCoalescer(
        protocol.transport, loop, HOLD, lambda: True, lambda: listener.held.add(protocol),
        lambda: listener.held.discard(protocol), now=loop.monotonic,
    )
    for i in range(STREAK + 1):
        loop.advance(1e-5)
        protocol.data_received(b"s%d" % i)
    assert protocol.coalescer.holding
    theirs.send(b"SECOND")
    protocol.data_received(b"FIRST")
    assert protocol.connection.fed[-1] == b"FIRST" and b"SECOND" not in protocol.connection.fed
    ours.close()
    theirs.close()
