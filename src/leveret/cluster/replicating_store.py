"""The store of a cluster node: every definition change also becomes a ``changes`` row.

:class:`ReplicatingStore` wraps the node's :class:`~leveret.store.postgresql.PostgreSQLStore`
(node mode) and is what core writes to. It forwards every call; a save or delete of a
shared definition (:data:`REPLICATED`) also queues ``log_change`` in the same batch, so
the definition row and its change row commit in one transaction (with the store's
``pg_notify``). Message writes go straight to the wrapped store's own bound methods:
the wrapper costs nothing per message.

While :attr:`ReplicatingStore.replaying` is set (the node applies another node's
changes through core's API) shared definitions are not written at all: the node that
made the change wrote them. Its other writes (a deleted queue's messages, which only
the owner writes) go on.

The -ok of a definition change waits for :meth:`ReplicatingStore.when_durable`: for a
batch that carried changes it calls back once the batch committed AND every live node
applied it (``catalog.wait_applied(last_epoch, APPLY_TIMEOUT)``, on a worker thread;
past the timeout a warning is logged and the -ok goes out anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.broker import BrokerCore
from ..store.base import ALL_SEQS, ScheduledRow, Snapshot, Store, StoredMessage

log = logging.getLogger("leveret.cluster")

#: The definition kinds every node shares (what core saves, less its node-local
#: kinds: ``audit``, ``meta``, ``lease``, ``stream_chunk``, adapters' kinds).
REPLICATED = BrokerCore.CORE_KINDS - {"audit", "meta", "lease", "stream_chunk"}

#: seconds a definition change's -ok waits for every live node to apply it
APPLY_TIMEOUT = 5.0

Callback = Callable[[bool], None]


class ReplicatingStore(Store):
    """``inner`` (a node-mode PostgreSQLStore) that logs the changes of shared
    definitions. Callbacks (``on_stall``, ``on_fenced``, ``on_flow``) and start/close are
    the inner store's: set and call them there; other attributes read through."""

    def __init__(self, inner: Any, node: str) -> None:
        self.inner = inner
        self.node = node
        #: set while another node's changes are applied (see the module doc)
        self.replaying = False
        #: shared definitions saved or deleted (what protocol adapters compare)
        self.definition_changes = 0
        #: ``wait_applied(epoch, timeout) -> bool`` (the catalog's), None: no waiting
        self.wait_applied: Callable[[int, float], bool] | None = None
        self._wait_threads: ThreadPoolExecutor | None = None
        #: the owner node of queue (vhost, name) as a change row names it
        self.owner_of: Callable[[str, str], str] = lambda vhost, name: self.node
        self._unwaited = False  # changes logged since the last when_durable
        self._waiting: list[Callback] | None = None  # callbacks waiting for the nodes
        self._waiting_token: object = None  # the inner batch they ride with
        # the per-message paths: the inner store's own methods, no forwarding call
        self.add_message = inner.add_message  # type: ignore[method-assign]
        self.remove_message = inner.remove_message  # type: ignore[method-assign]
        self.set_delivery_count = inner.set_delivery_count  # type: ignore[method-assign]
        self.set_available_at = inner.set_available_at  # type: ignore[method-assign]
        self.request_queue = inner.request_queue  # type: ignore[method-assign]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # -- definitions -------------------------------------------------------------------
    def save_definition(self, kind: str, vhost: str, name: str, data: dict) -> None:
        """Saved with a change row; dropped while replaying (shared kinds)."""
        if kind not in REPLICATED:
            self.definition_changes += 1
            self.inner.save_definition(kind, vhost, name, data)
            return
        if self.replaying:
            return
        self.inner.save_definition(kind, vhost, name, data)
        if kind == "queue":
            data = dict(data, node=self.owner_of(vhost, name), durable=True, exclusive=False)
        self.log_change(kind, vhost, name, data)

    def delete_definition(self, kind: str, vhost: str, name: str) -> None:
        """Deleted with a change row (NULL data); dropped while replaying (shared kinds)."""
        if kind not in REPLICATED:
            self.definition_changes += 1
            self.inner.delete_definition(kind, vhost, name)
            return
        if self.replaying:
            return
        self.inner.delete_definition(kind, vhost, name)
        self.log_change(kind, vhost, name, None)

    def log_change(self, kind: str, vhost: str, name: str, data: dict | None) -> None:
        """A ``changes`` row with the current batch; its -ok waits for every node."""
        self.definition_changes += 1
        self.inner.log_change(kind, vhost, name, data)
        self._unwaited = True

    def save_transient(self, kind: str, vhost: str, name: str, data: dict) -> None:
        """A non-durable queue, exchange or binding, visible cluster-wide (and its change)."""
        self.inner.save_transient(kind, vhost, name, data)
        self.log_change(kind, vhost, name, dict(data, transient=True))

    def delete_transient(self, kind: str, vhost: str, name: str) -> None:
        """The transient definition is gone (and its change row)."""
        self.inner.delete_transient(kind, vhost, name)
        self.log_change(kind, vhost, name, None)

    # -- durability ----------------------------------------------------------------------
    def when_durable(self, callback: Callback) -> None:
        """As the inner store's; the first call after changes were logged (and every
        call while its batch is still gathering) also waits for every live node to apply
        them (see the module doc). The batch may have gone to the writer in between (a
        wrapper that seals at the end of the turn): the wait then rides with the next
        one, committed after it."""
        token = self.inner.batch_token()
        if self._unwaited:
            self._unwaited = False
            if self._waiting is None or token is not self._waiting_token:
                waiting: list[Callback] = []
                self._waiting, self._waiting_token = waiting, token
                self.inner.when_durable(lambda ok: self._committed(ok, waiting))
        elif self._waiting is None or token is not self._waiting_token:
            self.inner.when_durable(callback)
            return
        self._waiting.append(callback)

    def _committed(self, ok: bool, callbacks: list[Callback]) -> None:
        if self._waiting is callbacks:
            self._waiting = self._waiting_token = None
        wait = self.wait_applied
        if not ok or wait is None:
            for callback in callbacks:
                callback(ok)
            return
        epoch = int(getattr(self.inner, "last_epoch", 0) or 0)
        loop = asyncio.get_running_loop()

        def waited(future: asyncio.Future) -> None:
            try:
                applied = bool(future.result())
            except Exception as exc:  # the catalog's session failed: the change is committed
                log.warning("cluster: cannot wait for the nodes to apply epoch %d: %s", epoch, exc)
                applied = False
            if not applied:
                log.warning(
                    "cluster: not every live node applied change %d within %.0f s; answering anyway",
                    epoch,
                    APPLY_TIMEOUT,
                )
            for callback in callbacks:
                callback(True)

        if self._wait_threads is None:
            # its own threads: a node slow to apply holds a waiter up to APPLY_TIMEOUT,
            # which must not starve the default executor the takeover loop runs on
            self._wait_threads = ThreadPoolExecutor(2, thread_name_prefix="leveret-apply-wait")
        loop.run_in_executor(self._wait_threads, wait, epoch, APPLY_TIMEOUT).add_done_callback(waited)

    def batch_token(self) -> object:
        return self.inner.batch_token()

    # -- the rest of the Store interface: forwarded ------------------------------------
    def load(self) -> Snapshot:
        return self.inner.load()

    def new_queue_id(self) -> int:
        return self.inner.new_queue_id()

    def add_message(self, *args: Any, **kwargs: Any) -> int:
        """The inner store's (:meth:`Store.add_message`): message rows are not replicated."""
        return self.inner.add_message(*args, **kwargs)

    def remove_range(self, queue_id: int, below_seq: int) -> None:
        self.inner.remove_range(queue_id, below_seq)

    def find_offset(self, queue_id: int, when: float) -> int | None:
        return self.inner.find_offset(queue_id, when)

    def request_offset(self, queue_id: int, when: float, answer: Callable[[int | None], None]) -> None:
        self.inner.request_offset(queue_id, when, answer)

    def request_queue(self, *args: Any, **kwargs: Any) -> None:
        """The inner store's (:meth:`Store.request_queue`)."""
        self.inner.request_queue(*args, **kwargs)

    def read_queue(
        self, queue_id: int, after_seq: int, limit: int, upto_seq: int = ALL_SEQS
    ) -> list[StoredMessage]:
        return self.inner.read_queue(queue_id, after_seq, limit, upto_seq)

    def count_blocks(self, queue_id: int) -> dict[int, tuple[int, int, int]]:
        return self.inner.count_blocks(queue_id)

    def remove_paged(self, queue_id: int, after_seq: int, upto_seq: int) -> None:
        self.inner.remove_paged(queue_id, after_seq, upto_seq)

    def save_dedup(self, queue_id: int, key: str, expires_at: float) -> None:
        self.inner.save_dedup(queue_id, key, expires_at)

    def delete_dedup(self, queue_id: int, key: str) -> None:
        self.inner.delete_dedup(queue_id, key)

    def set_delivery_count(self, store_id: int, count: int, failed: int = 0) -> None:
        self.inner.set_delivery_count(store_id, count, failed)

    def set_available_at(self, store_id: int, available_at: float) -> None:
        self.inner.set_available_at(store_id, available_at)

    def read_expired(
        self, queue_id: int, after_seq: int, upto_seq: int, now: float, limit: int
    ) -> list[StoredMessage]:
        return self.inner.read_expired(queue_id, after_seq, upto_seq, now, limit)

    def next_expiry(self, queue_id: int, after_seq: int, upto_seq: int, now: float) -> float | None:
        return self.inner.next_expiry(queue_id, after_seq, upto_seq, now)

    def remove_message(self, store_id: int) -> None:
        self.inner.remove_message(store_id)

    def remove_queue(self, queue_id: int) -> None:
        self.inner.remove_queue(queue_id)

    def new_scheduled_id(self) -> int:
        return self.inner.new_scheduled_id()

    def save_scheduled(self, row: ScheduledRow) -> None:
        self.inner.save_scheduled(row)

    def remove_scheduled(self, store_id: int) -> None:
        self.inner.remove_scheduled(store_id)

    def read_scheduled(self, after: tuple[float, int], limit: int) -> list[ScheduledRow]:
        return self.inner.read_scheduled(after, limit)

    def request_scheduled(
        self, after: tuple[float, int], limit: int, answer: Callable[[list[ScheduledRow]], None]
    ) -> None:
        self.inner.request_scheduled(after, limit, answer)

    def find_scheduled(self, job_id: str) -> ScheduledRow | None:
        return self.inner.find_scheduled(job_id)

    @property
    def pending(self) -> bool:
        return bool(self.inner.pending)

    def close(self) -> None:
        self.inner.close()
        if self._wait_threads is not None:
            self._wait_threads.shutdown(wait=False, cancel_futures=True)
