"""Recovery at start-up: a broker's definitions and messages come back from its store.

Recovery follows RabbitMQ: durable exchanges, durable queues (not exclusive ones) and
bindings between durable ends come back; persistent messages of durable queues return
in publish order, ``redelivered`` set on those that had been delivered before.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from .exchange import Binding, exchange_class
from .queues import ClassicQueue, Queue, queue_class
from .queues.stream import CHUNK_KIND, StreamQueue

if TYPE_CHECKING:
    from ..store import Snapshot, Store
    from .vhost import VirtualHost

log = logging.getLogger("leveret.recovery")


class RecoveringBroker(Protocol):
    """What recovery needs of the broker (:class:`.broker.BrokerCore` is one)."""

    vhosts: dict[str, VirtualHost]

    def add_vhost(self, name: str) -> VirtualHost:
        """The virtual host ``name``, created if missing."""


def recover(core: RecoveringBroker, snapshot: Snapshot, store: Store) -> int:
    """Rebuild ``core`` from ``snapshot`` (definitions, then messages) and attach
    ``store`` to every virtual host; returns the number of messages recovered."""
    started = time.monotonic()
    defs = snapshot.definitions
    for vhost_name, _, data in defs.get("vhost", []):
        vhost = core.add_vhost(vhost_name)  # (saves a new vhost's row anew: limits below)
        limits = data.get("limits") if isinstance(data, dict) else None
        if limits:
            vhost.limits = {str(k): int(v) for k, v in limits.items()}
            store.save_definition("vhost", vhost_name, "", {"limits": dict(vhost.limits)})
    by_id: dict[int, Queue] = {}
    for vhost_name, name, data in defs.get("exchange", []):
        vhost = core.add_vhost(vhost_name)
        cls = exchange_class(str(data["type"]))
        vhost.exchanges[name] = cls(
            name, True, bool(data["auto_delete"]), bool(data["internal"]), dict(data["arguments"])
        )
    for vhost_name, name, data in defs.get("queue", []):
        vhost = core.add_vhost(vhost_name)
        arguments = dict(data["arguments"])
        queue = queue_class(arguments)(vhost, name, True, None, bool(data["auto_delete"]), arguments)
        queue.store, queue.queue_id = store, int(data["queue_id"])
        vhost.queues[name] = queue
        by_id[queue.queue_id] = queue
    for vhost_name, _, data in defs.get("binding", []):
        vhost = core.add_vhost(vhost_name)
        source = vhost.exchanges.get(str(data["source"]))
        table = vhost.queues if data["destination_type"] == "queue" else vhost.exchanges
        destination = table.get(str(data["destination"]))
        if source is None or destination is None:
            log.warning("vhost %s: dropping binding to a missing end: %s", vhost_name, data)
            continue
        binding = Binding(source, destination, str(data["routing_key"]), dict(data["arguments"]))
        if source.add_binding(binding) and isinstance(destination, Queue):
            destination.bindings.append(binding)
    for vhost in core.vhosts.values():
        vhost.store = store
    for vhost_name, name, data in defs.get("lease", []):
        queue_name, _, group = name.partition("\x00")
        leased = core.vhosts[vhost_name].queues.get(queue_name) if vhost_name in core.vhosts else None
        # Only classic queues lease (Queue.lease refuses the other types).
        if isinstance(leased, ClassicQueue) and leased.queue_id == data["queue_id"]:
            leased.restore_lease(group, int(data["next_seq"]))
    for queue_id, keys in snapshot.dedup.items():
        found = by_id.get(queue_id)
        if found is not None and found.dedup is not None:
            for key, expires_at in keys:
                found.dedup.restore(key, expires_at)
    count = 0
    for queue_id, (queued, last_seq, size) in snapshot.queues.items():
        found = by_id.get(queue_id)
        if found is None:  # its queue was deleted before the purge reached the disk
            store.remove_queue(queue_id)
            continue
        found.restore_paged(queued, last_seq, size)
        count += queued
    _recover_stream_indexes(snapshot, store, by_id)
    log.info(
        "recovered %d exchanges, %d queues, %d bindings and %d messages in %.2f s",
        len(defs.get("exchange", [])),
        len(by_id),
        len(defs.get("binding", [])),
        count,
        time.monotonic() - started,
    )
    return count


def _recover_stream_indexes(snapshot: Snapshot, store: Store, by_id: dict[int, Queue]) -> None:
    """Streams' chunk indexes: the saved summaries (forgotten when their stream is
    gone), then each stream rebuilds what was not saved (:meth:`StreamQueue.rebuild_index`)."""
    for vhost_name, name, data in snapshot.definitions.get(CHUNK_KIND, []):
        queue_id, _, chunk = name.partition(":")
        stream = by_id.get(int(queue_id)) if queue_id.isdigit() else None
        if isinstance(stream, StreamQueue) and chunk.isdigit():
            stream.restore_chunk(int(chunk), data)
        else:
            store.delete_definition(CHUNK_KIND, vhost_name, name)
    for queue in by_id.values():
        if isinstance(queue, StreamQueue):
            queue.rebuild_index()
