"""An active node of the cluster: :class:`ClusterNode` starts and stops the cluster's
parts around the broker (docs/cluster.md).

Start (before the listeners open): the node registers in ``cluster_nodes`` with the
addresses others reach it on and its writer's backend pid (the fencing token of its
catalog writes), becomes ``core.cluster``, and sorts the recovered queues: those it
owns (``queue_owners``; an unclaimed durable queue is claimed) stay real, every other
one becomes a :class:`~leveret.core.queues.remote.RemoteQueue` of its owner. Then the
replication of definition changes, the links to the peers, the takeover loop
(:mod:`.takeover`) and the lease watchdog (:mod:`.lease`) start.

Stop: gracefully (SIGTERM), the node swaps its durable queues for stand-ins that refuse
publishes (so nothing is stored after its last commit), and hands them to live peers (balanced;
:meth:`Catalog.move_queue` writes the ``changes`` row each new owner acts on), sets its
state ``left`` and releases its lock when the store closes, so a rolling restart moves
queues without waiting GRACE; with no live peer it keeps them (they come back with it,
or a node that starts meanwhile takes them over). Fenced (lease lost, session gone): it
stops serving at once and the broker exits non-zero (``leveret server``), for its
supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..core.queues import Queue
from ..core.queues.remote import RemoteQueue
from ..store import StoreError
from .confirms import ClusterConfirms
from .lease import LeaseWatchdog, grace_seconds, lease_seconds
from .owner import accept_peers, refuse_peers
from .peers import FlowGate, PeerLink, Peers
from .replication import Replication
from .restore import make_remote, restore_queue
from .takeover import Takeover

if TYPE_CHECKING:
    from ..config import Settings
    from ..core.broker import BrokerCore

log = logging.getLogger("leveret.cluster")

#: seconds an owner change may take to be applied by every live node before the
#: queues it moved leave their transition anyway (logged)
SETTLE_TIMEOUT = 5.0


class ClusterNode:
    """Node ``settings.node_name`` of cluster ``settings.store_cluster``: ``core`` is the
    broker, ``store`` its PostgreSQL store in node mode (started), ``catalog`` the
    cluster's :class:`~leveret.cluster.catalog.Catalog`."""

    def __init__(
        self,
        core: BrokerCore,
        settings: Settings,
        store: Any,
        catalog: Any,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.settings = settings
        self.store = store
        self.catalog = catalog
        assert settings.node_name is not None
        #: this node's name
        self.node: str = settings.node_name
        #: the cluster's name (the PostgreSQL schema)
        self.cluster = settings.store_cluster
        #: definition changes to and from the other nodes (:mod:`.replication`)
        self.replication: Replication | None = None
        #: the links to the other nodes (:mod:`.peers`)
        self.peers: Peers | None = None
        #: called once, on the loop, with the reason when the node is fenced (the
        #: broker stops at once)
        self.on_fenced: Callable[[str], None] | None = None
        #: why the node was fenced, None while it was not
        self.fenced: str | None = None
        #: seconds a dead node's queues wait after its lock was taken (see :mod:`.lease`)
        self.grace = grace_seconds()
        #: seconds without a database round trip before this node fences itself
        self.lease = lease_seconds()
        #: takeovers this node made: (dead node, queues it restored, seconds from the
        #: dead node's lock taken to its queues serving here)
        self.takeovers: list[tuple[str, int, float]] = []
        #: the addresses registered (the listeners' real ports once they are bound)
        self.host = settings.cluster_advertise
        self.amqp_port = settings.cluster_port or settings.amqp_port  # --nodes: a port of its own
        self.http_port = settings.http_port
        self.now = now
        self.started_at = time.time()
        self.watchdog = LeaseWatchdog(store, self.fence, self.lease, now)
        self.takeover = Takeover(self, now=now)
        self._rows: list[Any] = []  # catalog.nodes() at the last look
        self._live: set[str] = {self.node}
        self._owned: dict[str, int] = {}  # node -> queues it owns, at the last look
        self._acquiring: set[tuple[str, str]] = set()
        #: when the last queue given to this node may be served (its grace ends)
        self._grace_until = 0.0
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        #: the node that runs the cluster's dynamic shovels and exchange federation
        #: links: the live node with the lowest ``number`` (None before the first look)
        self.runner: str | None = None
        #: called with True / False when this node becomes / stops being :attr:`runner`
        #: (the shovel and federation managers start or stop their workers)
        self.runner_listeners: list[Callable[[bool], None]] = []

    # -- start and stop -----------------------------------------------------------------
    async def start(self) -> None:
        """Register, sort the recovered queues, start replication, peers, takeovers and
        the lease watchdog. StoreError / psycopg errors if the catalog cannot be written."""
        catalog = self.catalog
        await asyncio.to_thread(catalog.set_writer_pid, self.store.writer_pid)
        await asyncio.to_thread(catalog.register, self.host, self.amqp_port, self.http_port or 0)
        self.core.cluster = self
        self._rows = await asyncio.to_thread(catalog.nodes)
        self.peers = await self._make_peers()
        owners = await asyncio.to_thread(catalog.owners)
        await self._sort_queues(owners)
        self.replication = Replication(self)
        await self.replication.start()
        rows = await asyncio.to_thread(catalog.nodes)
        self.refresh(rows, await asyncio.to_thread(catalog.owners))
        self.watchdog.start()
        self.takeover.start()
        self._started = True
        log.info(
            "node %s of cluster %r: %d live nodes, owns %d queues (lease %.1f s, grace %.1f s)",
            self.node,
            self.cluster,
            len(self._live),
            self._owned.get(self.node, 0),
            self.lease,
            self.grace,
        )

    async def _make_peers(self) -> Peers:
        """The links to the other nodes; the owner side accepts theirs (the cluster
        secret: ``cluster_secret``, else the one kept in the catalog), and every vhost's
        store waits for the links' confirms (:mod:`.confirms`)."""
        secret = self.settings.cluster_secret or str(await asyncio.to_thread(self.catalog.secret))
        peers = Peers(secret, self.address_of, self.resolve)
        accept_peers(self.core, secret)
        gate = FlowGate(self.core.flow.set)  # publishers held by the store's backlog or the links'
        self.store.on_flow = gate.store
        peers.on_flow = gate.links
        self.peers = peers
        for vhost in self.core.vhosts.values():
            self.vhost_added(vhost)
        return peers

    def vhost_added(self, vhost: Any) -> None:
        """Every vhost of the node, those it starts with and those made later (core's
        ``add_vhost`` tells :class:`.replication.Replication`, which calls this): its
        publisher confirms also wait for the owners of its remote queues
        (:class:`.confirms.ClusterConfirms` on the vhost's store)."""
        peers = self.peers
        if peers is not None and vhost.store is not None and not isinstance(vhost.store, ClusterConfirms):
            vhost.store = ClusterConfirms(vhost.store, peers.vhost_links(vhost.name))

    def address_of(self, node: str) -> tuple[str, int] | None:
        """``(host, amqp port)`` node ``node`` registered (None: unknown)."""
        row = next((r for r in self._rows if r.name == node), None)
        return (row.host, row.amqp_port) if row is not None else None

    async def resolve(self, node: str) -> tuple[str, int] | None:
        """:meth:`address_of` after a fresh look at the catalog (a node that joined
        since the last look, at most 0.5 s ago); the catalog unreadable: what the node
        knew (the link fails and tries again, rather than wait forever)."""
        try:
            self._rows = await asyncio.to_thread(self.catalog.nodes)
        except Exception as exc:  # (CatalogError, psycopg's) not an OSError the link expects
            log.warning("cluster: cannot read the nodes' addresses: %s", exc)
        return self.address_of(node)

    async def advertise(self, amqp_port: int, http_port: int | None) -> None:
        """The listeners are bound: register the real ports of those given as 0 (a
        port registered otherwise stays: it may be one of the node's own, not the
        listener's)."""
        amqp = self.amqp_port or amqp_port
        http = self.http_port if self.http_port else http_port
        if (amqp, http) != (self.amqp_port, self.http_port):
            self.amqp_port, self.http_port = amqp, http
            await asyncio.to_thread(self.catalog.register, self.host, amqp, http or 0)

    async def _sort_queues(self, owners: dict[tuple[str, str], tuple[str, int]]) -> None:
        """Start-up: queues this node owns stay real; an unclaimed durable one is claimed
        (a store from before the cluster); the others become RemoteQueues."""
        for vhost in list(self.core.vhosts.values()):
            for name, queue in list(vhost.queues.items()):
                if isinstance(queue, RemoteQueue) or not queue.durable or not queue.queue_id:
                    continue
                found = owners.get((vhost.name, name))
                if found is None:
                    owner = await asyncio.to_thread(
                        self.catalog.claim_queue, vhost.name, name, queue.queue_id, self.node, True
                    )
                else:
                    owner = found[0]
                if owner != self.node:
                    make_remote(vhost, queue, owner, self.link(owner, vhost.name))

    async def stop(self, graceful: bool = True) -> None:
        """Stop the cluster's parts; ``graceful`` (not fenced): hand the durable queues
        to live peers and leave first (the store is still open: the caller closes it,
        which releases the node's lock)."""
        self.watchdog.stop()
        self.takeover.stop()
        for task in list(self._tasks):
            task.cancel()
        if graceful and self.fenced is None and self._started:
            try:
                await self._leave()
            except Exception as exc:  # the lock goes with the session: peers take over
                log.warning("node %s: could not hand its queues over: %s", self.node, exc)
        if self.replication is not None:
            self.replication.stop()
        if self.peers is not None:
            refuse_peers(self.core)
            try:
                await self.peers.close()
            except Exception:
                log.exception("closing the links to the other nodes failed")
        try:
            await asyncio.to_thread(self.catalog.close)
        except Exception as exc:
            log.debug("closing the catalog: %s", exc)

    async def _leave(self) -> None:
        """Hand every durable queue this node owns to the live peers (fewest queues
        first), once the store has written all it holds, then mark the node ``left``."""
        mine = [
            (vhost, queue)
            for vhost in self.core.vhosts.values()
            for queue in vhost.queues.values()
            if self._is_local_durable(queue)
        ]
        for index, (vhost, queue) in enumerate(mine):
            # nothing stored here any more (the new owner restores what the store holds
            # once it is committed below): a stand-in refuses publishes, forwarded ones
            # too (no link: in transition), until the node is gone
            stand_in = make_remote(vhost, queue, self.node, None)
            mine[index] = (vhost, stand_in)
        # queues given to this node and not served yet: their grace must run out before
        # the node says it left (a survivor then takes them without waiting)
        wait = self._grace_until - self.now()
        if wait > 0:
            await asyncio.sleep(wait)
        await self._durable()
        peers = await asyncio.to_thread(self.catalog.live_nodes)
        peers.discard(self.node)
        moved = 0
        if peers and mine:
            load = {peer: self._owned.get(peer, 0) for peer in peers}
            for vhost, queue in mine:
                target = min(sorted(load), key=load.__getitem__)
                try:
                    await asyncio.to_thread(self.catalog.move_queue, vhost.name, queue.name, target)
                except StoreError as exc:  # (CatalogError: the peer went meanwhile) kept
                    log.warning(
                        "node %s: could not hand queue '%s' to %s: %s", self.node, queue.name, target, exc
                    )
                    continue
                load[target] += 1
                moved += 1
        await asyncio.to_thread(self.catalog.leave)
        log.info(
            "node %s left cluster %r: %d queues handed to %s, %d kept",
            self.node,
            self.cluster,
            moved,
            ", ".join(sorted(peers)) or "no live peer",
            len(mine) - moved,
        )

    async def _durable(self) -> None:
        """Until what the store holds now is committed."""
        done = asyncio.Event()
        self.store.when_durable(lambda ok: done.set())
        await asyncio.wait_for(done.wait(), 10)

    @staticmethod
    def _is_local_durable(queue: Queue) -> bool:
        return (
            not isinstance(queue, RemoteQueue)
            and queue.durable
            and queue.exclusive_owner is None
            and bool(queue.queue_id)
        )

    # -- fencing --------------------------------------------------------------------------
    def fence(self, reason: str) -> None:
        """Stop serving at once: the lease is lost or the session gone (another node may
        own this node's queues soon). Calls :attr:`on_fenced` once."""
        if self.fenced is not None:
            return
        self.fenced = reason
        store = self.watchdog.store  # (the node's own store, under any wrapper)
        if getattr(store, "fenced", None) is None:
            store.fenced = reason  # it writes nothing more, and its close waits for nothing
        log.error("fenced: node %s of cluster %r: %s; stopping", self.node, self.cluster, reason)
        self.watchdog.stop()
        self.takeover.stop()
        if self.on_fenced is not None:
            self.on_fenced(reason)

    # -- ownership -------------------------------------------------------------------------
    def link(self, owner: str, vhost: str) -> PeerLink | None:
        """The link to node ``owner`` for ``vhost`` (None without peers)."""
        if self.peers is None or owner == self.node:
            return None
        return self.peers.link(owner, vhost)

    def owner_of(self, vhost: str, queue: str) -> str | None:
        """The node that owns ``queue`` of ``vhost`` as this node sees it (None: no such
        queue)."""
        host = self.core.vhosts.get(vhost)
        found = host.queues.get(queue) if host is not None else None
        if found is None:
            return None
        return found.owner if isinstance(found, RemoteQueue) else self.node

    def is_live(self, node: str) -> bool:
        """Whether ``node``'s lock was held at the last look (every 0.5 s)."""
        return node in self._live

    def refresh(self, rows: list[Any], owners: dict[tuple[str, str], tuple[str, int]]) -> None:
        """The takeover loop's look at the catalog: nodes and their queue counts."""
        self._rows = rows
        self._live = {row.name for row in rows if row.live} | {self.node}
        owned: dict[str, int] = {}
        for owner, _ in owners.values():
            owned[owner] = owned.get(owner, 0) + 1
        self._owned = owned
        numbered = [(row.number, row.name) for row in rows if row.name in self._live]
        runner = min(numbered)[1] if numbered else self.node
        if runner != self.runner:
            was = self.runs_singletons
            self.runner = runner
            if self.runs_singletons != was:
                log.info("node %s %s the cluster's shovels and federation links", self.node,
                         "runs" if self.runs_singletons else "no longer runs")  # fmt: skip
                for listener in list(self.runner_listeners):
                    try:
                        listener(self.runs_singletons)
                    except Exception:  # one manager must not stop the others
                        log.exception("a runner listener failed")

    @property
    def runs_singletons(self) -> bool:
        """Whether this node runs the cluster's dynamic shovels and exchange federation
        links (RabbitMQ runs each dynamic shovel on one node of the cluster): the live
        node with the lowest ``number``; chosen again at each look (0.5 s) so they move
        to a survivor when it dies. Queue federation links run on the queue's owner."""
        return self.runner == self.node and self.fenced is None

    def remote_queues(self, owner: str) -> Iterable[tuple[Any, RemoteQueue]]:
        """(vhost, queue) of every RemoteQueue of ``owner``."""
        for vhost in self.core.vhosts.values():
            for queue in vhost.queues.values():
                if isinstance(queue, RemoteQueue) and queue.owner == owner:
                    yield vhost, queue

    def peer_lost(self, owner: str) -> None:
        """``owner`` is not live (its session ended: it can never write again): its
        non-durable queues are deleted, as RabbitMQ deletes a down node's non-durable
        classic queues; its durable ones' consumers are cancelled (RabbitMQ's consumer
        cancel notification) and publishes to them fail until the takeover."""
        if self.peers is not None:
            self.peers.node_lost(owner)
        for vhost, queue in list(self.remote_queues(owner)):
            if queue.durable:
                queue.owner_lost()
            else:
                vhost.delete_queue(queue.name)

    def adopt(
        self, moved: list[tuple[str, str, int, str]], dead: str, serve_at: float, started: float
    ) -> None:
        """A takeover by this node: queues given to other nodes are retargeted now, those
        given to this node are restored once ``now() >= serve_at``."""
        mine = []
        retargeted = []
        for vhost_name, name, queue_id, owner in moved:
            vhost = self.core.vhosts.get(vhost_name)
            queue = vhost.queues.get(name) if vhost is not None else None
            if owner == self.node:
                mine.append((vhost_name, name, queue_id))
                if isinstance(queue, RemoteQueue):
                    queue.transition = True  # until restored (see _acquire)
            elif isinstance(queue, RemoteQueue):
                queue.retarget(owner, self.link(owner, vhost_name))
                retargeted.append(queue)
        if retargeted:
            self.settle(retargeted)
        self._spawn(self._acquire(mine, serve_at, started, dead))

    def settle(self, queues: list[RemoteQueue], epoch: int | None = None) -> None:
        """``queues`` changed owner by the change ``epoch`` (None: the last in the log):
        they are in transition (publishes to them refused, forwarded ones too:
        :attr:`RemoteQueue.in_transition`) until every live node applied it, so no
        node forwards a message to a new owner that does not know yet it owns the
        queue (it would skip it as another node's and confirm it: lost)."""
        for queue in queues:
            queue.transition = True
        self._spawn(self._settled(queues, epoch))

    async def _settled(self, queues: list[RemoteQueue], epoch: int | None) -> None:
        try:
            if epoch is None:
                epoch = int(await asyncio.to_thread(self.catalog.last_epoch))
            if not await asyncio.to_thread(self.catalog.wait_applied, epoch, SETTLE_TIMEOUT):
                log.warning("an owner change (epoch %d) is not applied by every live node yet", epoch)
        except Exception as exc:  # the database is away: the lease decides soon
            log.warning("waiting for an owner change to be applied everywhere: %s", exc)
        finally:
            for queue in queues:
                queue.transition = False

    def on_acquired(self, vhost: str, name: str, queue_id: int) -> None:
        """Replication's hook: another node's change made this node ``name``'s owner (a
        takeover, a move, a peer that left). A queue of a dead node that did not leave
        cleanly is served after GRACE; one handed over by a live or departed owner at
        once (the catalog is read again first: the view of the last look may be 0.5 s
        old)."""
        host = self.core.vhosts.get(vhost)
        queue = host.queues.get(name) if host is not None else None
        if isinstance(queue, RemoteQueue):  # (else already real here, or gone)
            queue.transition = True  # until restored: forwards to it are refused meanwhile
            self._spawn(self._acquire_handed(vhost, name, queue_id, queue.owner))

    async def _acquire_handed(self, vhost: str, name: str, queue_id: int, previous: str) -> None:
        started = self.now()
        rows = await asyncio.to_thread(self.catalog.nodes)
        row = next((r for r in rows if r.name == previous), None)
        handed = row is not None and (row.live or row.state == "left")
        if row is not None and row.live:
            # a move: the old owner switches to a RemoteQueue (and commits what its
            # queue stored) when it applies the change; restore only after that
            epoch = int(await asyncio.to_thread(self.catalog.last_epoch))
            await asyncio.to_thread(self.catalog.wait_applied, epoch, SETTLE_TIMEOUT)
        await self._acquire(
            [(vhost, name, queue_id)], started if handed else started + self.grace, started, previous
        )

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _acquire(
        self, queues: list[tuple[str, str, int]], serve_at: float, started: float, dead: str
    ) -> None:
        """Restore ``queues`` (vhost, name, queue_id) as real queues of this node at
        ``serve_at``; record the takeover's time."""
        queues = [q for q in queues if (q[0], q[1]) not in self._acquiring]
        self._grace_until = max(self._grace_until, serve_at)
        self._acquiring.update((v, n) for v, n, _ in queues)
        try:
            wait = serve_at - self.now()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.fenced is not None:
                return
            restored = 0
            for vhost_name, name, queue_id in queues:
                await self._deletions_done(queue_id)
                counts = await asyncio.to_thread(self.store.count_blocks, queue_id)
                dedup = await asyncio.to_thread(self.store.read_dedup, queue_id)
                vhost = self.core.vhosts.get(vhost_name)
                stand_in = vhost.queues.get(name) if vhost is not None else None
                if vhost is None or not isinstance(stand_in, RemoteQueue) or self.fenced is not None:
                    continue
                restore_queue(vhost, stand_in, queue_id, self.store, counts, dedup)
                restored += 1
            self.core.scheduler.adopt()  # the dead node's scheduled rows, if they came here
            if restored:
                seconds = self.now() - started
                self.takeovers.append((dead, restored, seconds))
                log.warning(
                    "took over %d queues of node %s: serving %.2f s after they were given here",
                    restored,
                    dead,
                    seconds,
                )
        finally:
            self._acquiring.difference_update((v, n) for v, n, _ in queues)

    async def _deletions_done(self, queue_id: int, timeout: float = 5.0) -> None:
        """Until no range deletion (a purge) of queue ``queue_id`` waits in the store:
        every node's writer does them in the background (at most ``timeout`` seconds,
        then logged: a purged message may come back, at least once)."""
        deadline = self.now() + timeout
        while await asyncio.to_thread(self.store.ranges_pending, queue_id):
            if self.now() > deadline:
                log.warning("queue id %d: a purge still waits in the store; restoring it anyway", queue_id)
                return
            await asyncio.sleep(0.05)

    # -- operations ------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        """Rows for ``/api/nodes`` (RabbitMQ's fields where they apply): every
        registered node at the last look (0.5 s), this one first."""
        now = time.time()
        found = []
        for row in self._rows:
            started = row.started_at
            if hasattr(started, "timestamp"):
                started = started.timestamp()
            live = row.name in self._live
            entry: dict[str, Any] = {
                "name": row.name,
                "type": "disc",
                "running": live,
                "state": row.state,
                "number": row.number,
                "uptime": int((now - float(started)) * 1000) if live and started else 0,
                "amqp": f"{row.host}:{row.amqp_port}",
                "http": f"{row.host}:{row.http_port}" if row.http_port else None,
                "queues": self._owned.get(row.name, 0),
                "applied": row.applied,
                "this_node": row.name == self.node,
            }
            if row.name == self.node:
                entry.update(self.takeover_figures())
            found.append(entry)
        found.sort(key=lambda e: (not e["this_node"], e["name"]))
        return found

    def takeover_figures(self) -> dict[str, Any]:
        """This node's takeovers: how many, queues restored, p50 and max seconds."""
        seconds = [s for _, _, s in self.takeovers]
        return {
            "takeovers": len(seconds),
            "takeover_queues": sum(q for _, q, _ in self.takeovers),
            "takeover_p50_s": round(statistics.median(seconds), 3) if seconds else None,
            "takeover_max_s": round(max(seconds), 3) if seconds else None,
        }
