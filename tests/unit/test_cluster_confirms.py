"""leveret.cluster.confirms: confirm groups wait for the store and for the forwards of
the links, in order, and a forward is never confirmed by a group sealed before it.

The store is a real SQLite store (its writer thread commits); the link is a minimal
implementation of the ConfirmingLink interface whose owner confirms when the test says."""

from __future__ import annotations

import asyncio
from pathlib import Path

from leveret.cluster.confirms import ClusterConfirms
from leveret.store.sqlite import SQLiteStore


class Link:
    """Forwards numbered 1, 2, …; :meth:`confirm` plays the owner's basic.ack/nack."""

    def __init__(self) -> None:
        self.sent = self.settled = self.sealed = 0
        self.waits: list[tuple[int, object]] = []

    def forward(self) -> None:
        self.sent += 1

    def seal(self, done) -> bool:
        self.sealed = self.sent
        if self.sent <= self.settled:
            return False
        self.waits.append((self.sent, done))
        return True

    def confirm(self, upto: int, ok: bool = True) -> None:
        self.settled = upto
        for wait in [w for w in self.waits if w[0] <= upto]:
            self.waits.remove(wait)
            wait[1](ok)


def run(loop: asyncio.AbstractEventLoop, seconds: float = 0.05) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def make(tmp_path: Path, link: Link):
    loop = asyncio.new_event_loop()
    store = SQLiteStore(tmp_path)
    store.start(loop)
    return loop, store, ClusterConfirms(store, lambda: [link])


def test_a_later_forward_waits_for_its_own_confirm(tmp_path: Path) -> None:
    link = Link()
    loop, store, confirms = make(tmp_path, link)
    seen: list[tuple[str, bool]] = []
    try:
        async def first_turn() -> object:
            link.forward()
            token = confirms.batch_token()
            confirms.when_durable(lambda ok: seen.append(("first", ok)))
            link.forward()  # a second publish of the same turn joins the group
            assert confirms.batch_token() is token
            return token

        token = loop.run_until_complete(first_turn())
        run(loop)

        async def second_turn() -> None:
            link.forward()
            assert confirms.batch_token() is not token  # sealed at the end of the turn
            confirms.when_durable(lambda ok: seen.append(("second", ok)))

        loop.run_until_complete(second_turn())
        run(loop)
        link.confirm(1)
        assert seen == []  # the first group also waits for the turn's second forward
        link.confirm(2)
        assert seen == [("first", True)]
        link.confirm(3, ok=False)
        assert seen == [("first", True), ("second", False)]
    finally:
        store.close()
        loop.close()


def test_groups_are_called_back_in_order(tmp_path: Path) -> None:
    link = Link()
    loop, store, confirms = make(tmp_path, link)
    seen: list[str] = []
    try:
        async def publish(name: str, forward: bool, write: bool) -> None:
            if forward:
                link.forward()
            if write:
                store.save_definition("exchange", "/", name, {"type": "direct"})
            confirms.batch_token()
            confirms.when_durable(lambda ok: seen.append(name))

        loop.run_until_complete(publish("stored", False, True))
        loop.run_until_complete(publish("forwarded", True, False))
        link.confirm(1)  # before the store's commit came back
        assert seen == []
        for _ in range(1000):  # the writer thread's commit: up to 10 s on a loaded machine
            run(loop, 0.01)
            if seen:
                break
        assert seen == ["stored", "forwarded"]
        assert not confirms.pending
    finally:
        store.close()
        loop.close()


class RangeLink(Link):
    """As :class:`leveret.cluster.peers.PeerLink` does: a seal waits for the forwards
    sent since the previous seal, and a nack fails only the wait whose range holds it."""

    def seal(self, done) -> bool:
        lo, hi = self.sealed, self.sent
        self.sealed = hi
        if hi <= self.settled:
            return False
        self.waits.append([lo, hi, done, True])  # type: ignore[arg-type]
        return True

    def nack(self, position: int) -> None:
        for wait in self.waits:
            if wait[0] < position <= wait[1]:  # type: ignore[index]
                wait[3] = False  # type: ignore[index]

    def confirm(self, upto: int, ok: bool = True) -> None:
        self.settled = upto
        for wait in [w for w in self.waits if w[1] <= upto]:  # type: ignore[index]
            self.waits.remove(wait)
            wait[2](wait[3])  # type: ignore[index]


def test_a_forward_made_as_the_store_starts_a_new_batch_counts_for_its_publish(tmp_path: Path) -> None:
    """The store hands its batch to the writer in mid-turn (its writer's previous commit
    came back: ``_written`` submits at once); the next publish forwards, then asks for
    the batch token: its forward was nacked by the owner, so its confirm is negative."""
    link = RangeLink()
    loop, store, confirms = make(tmp_path, link)
    seen: list[tuple[str, bool]] = []
    try:
        async def turn() -> None:
            store.save_definition("exchange", "/", "x", {"type": "direct"})  # a persistent publish
            confirms.batch_token()
            confirms.when_durable(lambda ok: seen.append(("stored", ok)))
            store._submit()  # what BatchedStore._written does when the writer is done
            link.forward()  # the next publish: forwarded to the owner, then settled
            confirms.batch_token()
            confirms.when_durable(lambda ok: seen.append(("forwarded", ok)))

        loop.run_until_complete(turn())
        run(loop)
        link.nack(1)
        link.confirm(1)
        for _ in range(1000):  # the writer thread's commit
            run(loop, 0.01)
            if len(seen) == 2:
                break
        assert ("forwarded", False) in seen, seen
    finally:
        store.close()
        loop.close()
