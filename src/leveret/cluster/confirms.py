"""Publisher confirms that wait for the owners of remote queues (docs/cluster.md).

A publish routed to a :class:`~leveret.core.queues.remote.RemoteQueue` is forwarded to
the queue's owner on a link channel in confirm mode and enqueued as STORED, so the
publisher's confirm waits for the vhost's store (:meth:`.core.publish.Publisher._settle`:
``store.batch_token()`` groups the publishes, ``store.when_durable`` calls each group
back). On an active node ``vhost.store`` is a :class:`ClusterConfirms`: the node's
store, whose ``when_durable`` also waits for every link's forwards sent so far.

- A group (:meth:`ClusterConfirms.batch_token`) lasts one event-loop turn at most
  (less when the store starts a new batch of writes meanwhile): its callbacks wait for
  the store's batch (registered when the group's first callback comes, as the store
  alone would) and, at the end of the turn, on each link with forwards not yet
  confirmed, for the highest forward sent by then. The groups of one turn wait for the
  links together (one seal per link): a publish forwards before it asks for the batch
  token, so a forward made as the store started a new batch belongs to the next group,
  and its nack fails every group of the turn. A forward made after a turn's seal
  belongs to a later turn, so it is never confirmed by an earlier group.
- Groups are called back in the order they were made (a publisher's confirms stay in
  publish order), each with True only if its store writes succeeded and none of the
  forwards it waited for was nacked or lost with its link (a negative confirm, as
  RabbitMQ's for a message a queue's node could not take).

No task or future per message: one callback per group and link.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

Callback = Callable[[bool], None]


class ConfirmingLink(Protocol):
    """What the wrapper needs of a link (:class:`.peers.PeerLink`)."""

    def seal(self, done: Callback) -> bool:
        """Wait for the forwards sent since the last seal and those still unconfirmed:
        True if ``done(ok)`` will be called, False if there is nothing to wait for."""


class _Group:
    __slots__ = ("callbacks", "changes", "inner", "ok", "stored", "waiting")

    def __init__(self, inner: object) -> None:
        self.inner = inner  # the store's batch token when the group began
        self.callbacks: list[Callback] = []
        self.waiting = 1  # released when sealed
        self.ok = True
        self.stored = False  # waits for the store already
        self.changes = 0  # the store's definition_changes when it started to


class ClusterConfirms:
    """``store`` (every other attribute is the store's) whose :meth:`when_durable` and
    :meth:`batch_token` also wait for the forwards of ``links()`` (the node's peer links
    of this vhost, or all of them)."""

    def __init__(self, store: Any, links: Callable[[], Iterable[ConfirmingLink]]) -> None:
        self._store = store
        self._links = links
        self._open: _Group | None = None  # gathering callbacks in this turn
        self._turn: list[_Group] = []  # closed in this turn: wait for the links at its end
        self._groups: deque[_Group] = deque()  # sealed, in order, not called back yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seal_soon = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if callable(value) and hasattr(value, "__self__"):
            setattr(self, name, value)  # a bound method: looked up once
        return value

    @property
    def store(self) -> Any:
        """The node's store underneath."""
        return self._store

    @property
    def local(self) -> Any:
        """The node's store alone (see :attr:`leveret.store.base.Store.local`): what a
        peer's forwarded publish waits for."""
        return self._store

    @property
    def pending(self) -> bool:
        """Whether store writes or forwards are in flight."""
        return self._open is not None or bool(self._groups) or self._store.pending

    def batch_token(self) -> object:
        """The group gathering callbacks now: until the end of this turn, or until the
        store starts a new batch of writes."""
        inner = self._store.batch_token()
        group = self._open
        if group is not None and group.inner is not inner:
            self._close()
            group = None
        if group is None:
            group = self._open = _Group(inner)
            if not self._seal_soon:
                self._seal_soon = True
                if self._loop is None:
                    self._loop = asyncio.get_running_loop()
                self._loop.call_soon(self._end_of_turn)
        return group

    def when_durable(self, callback: Callback) -> None:
        """``callback(ok)`` once every store write queued so far is on disk and every
        forward sent so far (by the end of this turn) is confirmed by its owner."""
        group = self.batch_token()
        assert isinstance(group, _Group)
        self._wait_store(group)
        group.callbacks.append(callback)

    def _wait_store(self, group: _Group) -> None:
        """The group waits for the store, once, and again after definition changes (the
        cluster's replicating store then also waits for every node to apply them)."""
        store = self._store
        changes = getattr(store, "definition_changes", 0)
        if store.pending and (not group.stored or changes != group.changes):
            group.stored = True
            group.changes = changes
            group.waiting += 1
            store.when_durable(lambda ok: self._done(group, ok))

    def _end_of_turn(self) -> None:
        self._seal_soon = False
        self._seal()

    def _close(self) -> None:
        """Close the open group (no more callbacks): it waits for the store, and for the
        links with the turn's other groups (:meth:`_seal`)."""
        group, self._open = self._open, None
        if group is None or not group.callbacks:
            return
        self._groups.append(group)
        self._wait_store(group)
        self._turn.append(group)

    def _seal(self) -> None:
        """The end of the turn: the groups closed in it wait for the links' forwards
        sent so far, together."""
        self._close()
        turn, self._turn = self._turn, []
        if not turn:
            return

        def done(ok: bool) -> None:
            for group in turn:
                self._done(group, ok)

        for link in self._links():
            for group in turn:
                group.waiting += 1
            if not link.seal(done):
                for group in turn:
                    group.waiting -= 1
        for group in turn:
            self._done(group, True)

    def _done(self, group: _Group, ok: bool) -> None:
        group.waiting -= 1
        if not ok:
            group.ok = False
        groups = self._groups
        while groups and groups[0].waiting == 0:
            finished = groups.popleft()
            for callback in finished.callbacks:
                callback(finished.ok)
