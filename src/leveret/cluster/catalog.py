"""The cluster's catalog in PostgreSQL: members, liveness, queue owners, the change log.

Blocking calls on sessions of their own (a few, pooled: call them from threads, or at
start-up), in the cluster's schema (made and migrated here too, see
:mod:`leveret.store.postgresql`, migration 3):

- ``cluster_nodes``: one row per node (its number, address, state ``running``,
  ``left`` after a graceful stop, ``down`` once taken over; ``applied``: the last
  change-log epoch it applied; ``writer_pid``: its fencing token).
- ``queue_owners``: the node that holds each queue (RabbitMQ's queue leader).
- ``changes``: the change log (definitions logged by the nodes' store writers, owner
  moves and deletions logged here), one epoch per row, visible in epoch order.
- ``transient_definitions``: non-durable definitions, deleted with their node.

Liveness is PostgreSQL's: a node is LIVE while its store writer session holds the node's
advisory lock (``pg_locks``, the pid recorded at :meth:`Catalog.register`). Fencing:
every write made for this node first locks the node's row, then checks in SQL that the
writer pid still holds the lock (:class:`Fenced` otherwise), so a write of a node whose
session ended never lands after a survivor's :meth:`Catalog.take_over` (which locks
that row for update).

RabbitMQ 3.10 keeps the same facts in Mnesia, replicated between nodes; here the
database is the single source of truth and the nodes hold no vote.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from ..store.base import ALL_SEQS, StoreError
from ..store.batched import _decode_table, _encode_table
from ..store.ops import LOCK_CHANGES_SQL, LOG_CHANGE_SQL
from ..store.postgresql import NODE_LOCK, PgConnection, changes_channel, connect, migrate, node_key, redact

log = logging.getLogger("leveret.cluster")

#: Sessions kept open for reuse (more are opened while more threads call at once).
IDLE_SESSIONS = 4
#: Seconds between a listener's attempts to reconnect.
LISTEN_RETRY = 1.0
#: Seconds between a listener's checks of close() while it waits for notifications.
LISTEN_CHECK = 0.25
#: wait_applied's polling: from FIRST_POLL seconds, doubling up to MAX_POLL.
FIRST_POLL = 0.002
MAX_POLL = 0.02

_DATABASE = "(SELECT oid FROM pg_database WHERE datname = current_database())"
#: Whether the node of row ``n`` is live: its recorded writer holds its advisory lock
#: (parameter: the cluster name).
LIVE_SQL = (
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    f"AND l.database = {_DATABASE} AND l.classid = hashtext('{NODE_LOCK}')::oid "
    "AND l.objid = hashtext(%s || '/' || n.name)::oid AND l.pid = n.writer_pid)"
)
#: Whether a pid holds a node's lock (parameters: the pid, :func:`node_key`).
HOLDS_SQL = (
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    f"AND l.database = {_DATABASE} AND l.classid = hashtext('{NODE_LOCK}')::oid "
    "AND l.objid = hashtext(%s)::oid AND l.pid = %s)"
)
_LOG_CHANGE = LOG_CHANGE_SQL.replace("?", "%s")
_LOCK_CHANGES = LOCK_CHANGES_SQL.replace("?", "%s")


class CatalogError(StoreError):
    """The catalog cannot be reached or refuses a change; the message says why (the
    database URL without its password)."""


class Fenced(CatalogError):
    """This node's writer session no longer holds the node's lock: the node lost its
    right to write and must stop serving (as a fenced master does)."""


class SessionLost(CatalogError):
    """The session broke under a call (the database restarted, a connection was cut):
    the calls that are safe to repeat are tried once more on a new session."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _once_more(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A call repeated once on a new session when its session was lost: reads, and
    writes whose repetition changes nothing (register, leave, claim, release, marking
    applied, pruning). Not move_queue, take_over, forget_node: their change rows."""

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except SessionLost:
            return method(*args, **kwargs)

    return call


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A member of the cluster: ``started_at`` epoch seconds of its last start,
    ``applied`` the last change-log epoch it applied, ``live`` whether its writer
    session holds its lock now."""

    name: str
    number: int
    host: str
    amqp_port: int
    http_port: int
    state: str
    live: bool
    started_at: float
    applied: int


@dataclass(frozen=True, slots=True)
class Change:
    """A row of the change log: who logged it (``node``; None: not a node), what
    (``kind``: a definition kind, or ``owner`` for an owner move: data ``{"node",
    "queue_id"}``), and ``data`` (its field table; None: deleted)."""

    epoch: int
    node: str | None
    kind: str
    vhost: str
    name: str
    data: dict | None


@dataclass(frozen=True, slots=True)
class TransientDefinition:
    """A non-durable definition (queue, exchange, binding …) of ``node``."""

    kind: str
    vhost: str
    name: str
    node: str
    data: dict


class Catalog:
    """The catalog of ``cluster`` (the schema) at ``url``, as seen by node ``node``.

    Thread-safe: each call takes a session of its own from a small pool. Errors:
    :class:`CatalogError` (the database, or a refused change), :class:`Fenced` (a write
    for this node after its writer session lost the node's lock)."""

    def __init__(self, url: str, cluster: str, node: str) -> None:
        self.url = url
        self.cluster = cluster
        self.node = node
        self.name = redact(url)
        #: the fencing token: this node's store writer session's backend pid
        self.writer_pid: int | None = None
        self._key = node_key(cluster, node)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._migrated = False
        self._closed = threading.Event()
        self._listeners: list[threading.Thread] = []
        self._secret: str | None = None

    # -- sessions ----------------------------------------------------------------------
    def _open(self) -> Any:
        conn = connect(self.url, self.cluster, "leveret-catalog", server_keepalives=True, node=self.node)
        if not self._migrated:
            try:
                migrate(PgConnection(conn), self.name, self.cluster)
            except BaseException:
                conn.close()
                raise
            self._migrated = True
        return conn

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        """A session (pooled), psycopg errors turned into CatalogError; a broken
        session is dropped with every idle one, so the next call opens a new one."""
        import psycopg

        if self._closed.is_set():
            raise CatalogError(f"catalog {self.name}: closed")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = self._open()
            yield conn
        except psycopg.Error as exc:
            if conn is not None and not conn.broken and not conn.closed:
                self._put(conn)
            elif conn is not None:  # the database went, or restarted: so did the others
                conn.close()
                with self._lock:
                    idle, self._idle = self._idle, []
                for other in idle:
                    other.close()
                raise SessionLost(f"catalog {self.name}: {str(exc).strip()}") from None
            raise CatalogError(f"catalog {self.name}: {str(exc).strip()}") from None
        except BaseException:
            if conn is not None:
                self._put(conn)
            raise
        else:
            self._put(conn)

    def _put(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < IDLE_SESSIONS and not self._closed.is_set():
                self._idle.append(conn)
                return
        conn.close()

    def _fence(self, conn: Any, node: str | None = None) -> None:
        """Inside a transaction: lock this node's row (KEY SHARE: a take-over waits for
        this transaction) and check that its writer still holds its lock; Fenced if not.
        ``node``: also lock that node's row and check it is live (CatalogError)."""
        pid = self.writer_pid
        row = conn.execute(
            "SELECT 1 FROM cluster_nodes WHERE name = %s FOR KEY SHARE", (self.node,)
        ).fetchone()
        if row is None:
            raise Fenced(f"catalog {self.name}: node {self.node!r} is not registered")
        # evaluated after the row lock: a take-over that went first has ended the lock
        if pid is None or not conn.execute(f"SELECT {HOLDS_SQL}", (self._key, pid)).fetchone()[0]:
            raise Fenced(f"catalog {self.name}: node {self.node!r} lost its lock (writer pid {pid})")
        if node is not None and node != self.node:
            live = conn.execute(
                f"SELECT {LIVE_SQL} FROM cluster_nodes n WHERE n.name = %s FOR KEY SHARE",
                (self.cluster, node),
            ).fetchone()
            if live is None or not live[0]:
                raise CatalogError(f"catalog {self.name}: node {node!r} is not running")

    # -- membership ------------------------------------------------------------------
    def set_writer_pid(self, pid: int) -> None:
        """Record the fencing token: this node's store writer session's backend pid
        (``PostgreSQLStore.writer_pid``). Call it before :meth:`register`."""
        self.writer_pid = pid

    @_once_more
    def register(self, host: str, amqp_port: int, http_port: int) -> int:
        """Join (or rejoin) the cluster as ``running`` at ``host`` (where other nodes
        reach this node's AMQP port ``amqp_port``; ``http_port`` its management API,
        0: none), now; the node's number (1, 2 … given once, kept across restarts).
        Without :meth:`set_writer_pid`, the pid holding the node's lock is taken as the
        token. Fenced if no session holds this node's lock."""
        with self._session() as conn, conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('leveret-register'), hashtext(%s))", (self.cluster,)
            )
            if self.writer_pid is None:
                row = conn.execute(
                    "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
                    f"AND l.objsubid = 2 AND l.database = {_DATABASE} "
                    f"AND l.classid = hashtext('{NODE_LOCK}')::oid AND l.objid = hashtext(%s)::oid",
                    (self._key,),
                ).fetchone()
                if row is None:
                    raise Fenced(f"catalog {self.name}: no session holds the lock of node {self.node!r}")
                self.writer_pid = row[0]
            conn.execute("SELECT 1 FROM cluster_nodes WHERE name = %s FOR KEY SHARE", (self.node,))
            if not conn.execute(f"SELECT {HOLDS_SQL}", (self._key, self.writer_pid)).fetchone()[0]:
                raise Fenced(
                    f"catalog {self.name}: node {self.node!r} lost its lock (writer pid {self.writer_pid})"
                )
            row = conn.execute(
                "INSERT INTO cluster_nodes (name, number, host, amqp_port, http_port, state, started_at, "
                "writer_pid) SELECT %s, COALESCE(max(number), 0) + 1, %s, %s, %s, 'running', %s, %s "
                "FROM cluster_nodes ON CONFLICT (name) DO UPDATE SET host = excluded.host, "
                "amqp_port = excluded.amqp_port, http_port = excluded.http_port, state = 'running', "
                "started_at = excluded.started_at, writer_pid = excluded.writer_pid RETURNING number",
                (self.node, host, amqp_port, http_port, time.time(), self.writer_pid),
            ).fetchone()
        return int(row[0])

    @_once_more
    def leave(self) -> None:
        """A graceful stop: mark this node ``left`` (a survivor taking over what it
        still owns need not wait for its lease). Fenced."""
        with self._session() as conn, conn.transaction():
            self._fence(conn)
            conn.execute("UPDATE cluster_nodes SET state = 'left' WHERE name = %s", (self.node,))

    @_once_more
    def nodes(self) -> list[NodeRow]:
        """Every member, by number, with whether it is live now."""
        with self._session() as conn:
            rows = conn.execute(
                f"SELECT n.name, n.number, n.host, n.amqp_port, n.http_port, n.state, {LIVE_SQL}, "
                "n.started_at, n.applied FROM cluster_nodes n ORDER BY n.number",
                (self.cluster,),
            ).fetchall()
        return [NodeRow(*row) for row in rows]

    @_once_more
    def live_nodes(self) -> set[str]:
        """The names of the live members (their writer session holds their lock)."""
        with self._session() as conn:
            rows = conn.execute(f"SELECT n.name FROM cluster_nodes n WHERE {LIVE_SQL}", (self.cluster,))
            return {row[0] for row in rows}

    def forget_node(self, name: str) -> list[tuple[str, str, int, str]]:
        """``rabbitmqctl forget_cluster_node``: remove a node that is not running from
        the cluster, taking its queues over first (see :meth:`take_over`); the queues
        moved. CatalogError while it runs (or for this node); Fenced."""
        if name == self.node:
            raise CatalogError(f"catalog {self.name}: a node cannot forget itself")
        with self._session() as conn:
            if not self._lock_node(conn, name):
                raise CatalogError(f"catalog {self.name}: node {name!r} is running")
            try:
                with conn.transaction():
                    moved = self._take_over(conn, name)
                    conn.execute("DELETE FROM cluster_nodes WHERE name = %s", (name,))
            finally:
                self._unlock_node(conn, name)
        return moved

    # -- queue owners ----------------------------------------------------------------------
    @_once_more
    def owners(self) -> dict[tuple[str, str], tuple[str, int]]:
        """(vhost, queue name) -> (owner node, queue id), for every queue."""
        with self._session() as conn:
            rows = conn.execute("SELECT vhost, name, node, queue_id FROM queue_owners").fetchall()
        return {(vhost, name): (node, queue_id) for vhost, name, node, queue_id in rows}

    @_once_more
    def claim_queue(self, vhost: str, name: str, queue_id: int, node: str, durable: bool) -> str:
        """Record ``node`` (this one, or a live other: placement ``balanced``) as the owner
        of a new queue, unless it has one already; the owner after the claim (another
        node's if it won a race). Fenced; CatalogError if ``node`` is not live."""
        with self._session() as conn, conn.transaction():
            self._fence(conn, node)
            row = conn.execute(
                "INSERT INTO queue_owners (vhost, name, queue_id, node, durable) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (vhost, name) DO NOTHING RETURNING node",
                (vhost, name, queue_id, node, durable),
            ).fetchone()
            if row is None:  # it had an owner already
                row = conn.execute(
                    "SELECT node FROM queue_owners WHERE vhost = %s AND name = %s", (vhost, name)
                ).fetchone()
        return str(row[0])

    @_once_more
    def release_queue(self, vhost: str, name: str) -> bool:
        """Forget a deleted queue's owner; whether there was one. Fenced."""
        with self._session() as conn, conn.transaction():
            self._fence(conn)
            done = conn.execute(
                "DELETE FROM queue_owners WHERE vhost = %s AND name = %s", (vhost, name)
            ).rowcount
        return bool(done)

    def move_queue(self, vhost: str, name: str, node: str) -> int:
        """Make live ``node`` the owner of a queue (``leveret ctl move_queue``), logged as
        an ``owner`` change (data ``{"node", "queue_id"}``); the change's epoch (0: it
        already was). The old and the new owner hand the queue over on that change.
        Fenced; CatalogError if the queue has no owner or ``node`` is not live."""
        with self._session() as conn, conn.transaction():
            self._fence(conn, node)
            row = conn.execute(
                "SELECT node, queue_id FROM queue_owners WHERE vhost = %s AND name = %s FOR UPDATE",
                (vhost, name),
            ).fetchone()
            if row is None:
                raise CatalogError(f"catalog {self.name}: no queue {name!r} in vhost {vhost!r}")
            if row[0] == node:
                return 0
            conn.execute(
                "UPDATE queue_owners SET node = %s WHERE vhost = %s AND name = %s", (node, vhost, name)
            )
            data = _encode_table({"node": node, "queue_id": row[1]})
            return int(conn.execute(_LOG_CHANGE, self._change("owner", vhost, name, data)).fetchone()[0])

    def _change(self, kind: str, vhost: str, name: str, data: bytes | None) -> tuple:
        return (self.node, kind, vhost, name, data, self.cluster, changes_channel(self.cluster))

    # -- take-over ---------------------------------------------------------------------
    def take_over(self, dead: str) -> list[tuple[str, str, int, str]]:
        """Take over a node whose writer session has ended: its durable queues go to
        the live nodes, the fewest-queued first (``owner`` changes), its non-durable
        queues and definitions are deleted (RabbitMQ: a node's non-durable queues go
        with it; a change with no data each), the paged-out transient messages of its
        queues are dropped (as in RabbitMQ's classic queues), its scheduled messages
        move to this node (its scheduler reads them again), and its row is marked ``down``
        (``left`` stays). One transaction, under the dead node's advisory lock (taken
        by this session: only possible once its writer session ended; two survivors
        never both do it). Returns (vhost, queue, queue id, new owner) per queue moved;
        [] when the lock cannot be taken (the node lives, or another survivor is at
        it). Fenced; CatalogError."""
        if dead == self.node:
            return []
        with self._session() as conn:
            if not self._lock_node(conn, dead):
                return []
            try:
                with conn.transaction():
                    return self._take_over(conn, dead)
            finally:
                self._unlock_node(conn, dead)

    def _lock_node(self, conn: Any, node: str) -> bool:
        row = conn.execute(
            f"SELECT pg_try_advisory_lock(hashtext('{NODE_LOCK}'), hashtext(%s))",
            (node_key(self.cluster, node),),
        ).fetchone()
        return bool(row[0])

    def _unlock_node(self, conn: Any, node: str) -> None:
        import psycopg

        try:
            conn.execute(
                f"SELECT pg_advisory_unlock(hashtext('{NODE_LOCK}'), hashtext(%s))",
                (node_key(self.cluster, node),),
            )
        except psycopg.Error:  # a broken session has let the lock go with it
            conn.close()

    def _take_over(self, conn: Any, dead: str) -> list[tuple[str, str, int, str]]:
        """:meth:`take_over`'s transaction (the dead node's lock held)."""
        # the dead node's in-flight catalog writes (fenced: they lock its row) end first
        if (
            conn.execute("SELECT state FROM cluster_nodes WHERE name = %s FOR UPDATE", (dead,)).fetchone()
            is None
        ):
            return []
        self._fence(conn)
        # Lock order, against deadlocks: cluster_nodes rows, then the change log's lock,
        # then the rows changed (a node's writer takes that lock before its
        # transient_definitions rows, which this deletes).
        conn.execute(_LOCK_CHANGES, (self.cluster,))
        heap = [
            (count, number, name)
            for name, number, count in conn.execute(
                "SELECT n.name, n.number, (SELECT count(*) FROM queue_owners q WHERE q.node = n.name) "
                f"FROM cluster_nodes n WHERE n.name <> %s AND {LIVE_SQL} FOR KEY SHARE",
                (dead, self.cluster),
            )
        ]
        heapq.heapify(heap)
        queues = conn.execute(
            "SELECT vhost, name, queue_id FROM queue_owners WHERE node = %s AND durable ORDER BY queue_id",
            (dead,),
        ).fetchall()
        moved: list[tuple[str, str, int, str]] = []
        for vhost, name, queue_id in queues:
            count, number, owner = heapq.heappop(heap)
            heapq.heappush(heap, (count + 1, number, owner))
            moved.append((vhost, name, queue_id, owner))
        changes: list[tuple] = []
        if moved:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "UPDATE queue_owners SET node = %s WHERE vhost = %s AND name = %s",
                    [(owner, vhost, name) for vhost, name, _, owner in moved],
                )
            conn.execute(
                "DELETE FROM messages WHERE transient = 1 AND queue_id = ANY(%s)", ([m[2] for m in moved],)
            )
            changes += [
                self._change("owner", vhost, name, _encode_table({"node": owner, "queue_id": queue_id}))
                for vhost, name, queue_id, owner in moved
            ]
        gone = [
            row[0]
            for row in conn.execute("DELETE FROM queue_owners WHERE node = %s RETURNING queue_id", (dead,))
        ]
        if gone:  # its non-durable queues: their messages go in the background
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO pending_deletes (queue_id, low, high) VALUES (%s, 0, %s)",
                    [(queue_id, ALL_SEQS) for queue_id in gone],
                )
            conn.execute("DELETE FROM dedup WHERE queue_id = ANY(%s)", (gone,))
        for kind, vhost, name in conn.execute(
            "DELETE FROM transient_definitions WHERE node = %s RETURNING kind, vhost, name", (dead,)
        ).fetchall():
            changes.append(self._change(kind, vhost, name, None))
        conn.execute("DELETE FROM scheduled WHERE node = %s AND transient = 1", (dead,))
        conn.execute("UPDATE scheduled SET node = %s WHERE node = %s", (self.node, dead))
        if changes:
            with conn.cursor() as cursor:
                cursor.executemany(_LOG_CHANGE, changes)
        conn.execute(
            "UPDATE cluster_nodes SET state = CASE WHEN state = 'left' THEN 'left' ELSE 'down' END "
            "WHERE name = %s",
            (dead,),
        )
        if moved or changes:
            log.info(
                "catalog %s: node %s took over node %s: %d queues moved",
                self.name,
                self.node,
                dead,
                len(moved),
            )
        return moved

    # -- the change log -----------------------------------------------------------------
    @_once_more
    def changes_since(self, epoch: int, limit: int = 1000) -> list[Change]:
        """Up to ``limit`` changes after ``epoch``, in epoch order (epochs become
        visible in order: none will appear below the last one returned)."""
        with self._session() as conn:
            rows = conn.execute(
                "SELECT epoch, node, kind, vhost, name, data FROM changes WHERE epoch > %s "
                "ORDER BY epoch LIMIT %s",
                (epoch, limit),
            ).fetchall()
        return [
            Change(e, node, kind, vhost, name, None if data is None else _decode_table(data))
            for e, node, kind, vhost, name, data in rows
        ]

    @_once_more
    def last_epoch(self) -> int:
        """The highest epoch of the change log (0: empty)."""
        with self._session() as conn:
            return int(conn.execute("SELECT COALESCE(max(epoch), 0) FROM changes").fetchone()[0])

    @_once_more
    def prune_changes(self, keep: int = 1000) -> int:
        """Delete the changes every live node has applied, but the last ``keep``; how
        many went. A node that starts reads the definitions themselves (the store's
        load), not old changes; one that is running and behind keeps its changes."""
        with self._session() as conn:
            return int(
                conn.execute(
                    "DELETE FROM changes WHERE epoch <= LEAST("
                    f"(SELECT COALESCE(min(n.applied), 0) FROM cluster_nodes n WHERE {LIVE_SQL}), "
                    "(SELECT COALESCE(max(epoch), 0) FROM changes) - %s)",
                    (self.cluster, keep),
                ).rowcount
            )

    @_once_more
    def mark_applied(self, epoch: int) -> None:
        """Record that this node applied every change up to ``epoch`` (never lowers
        it). Fenced."""
        with self._session() as conn:
            done = conn.execute(
                f"UPDATE cluster_nodes SET applied = GREATEST(applied, %s) WHERE name = %s AND {HOLDS_SQL}",
                (epoch, self.node, self._key, self.writer_pid),
            ).rowcount
        if not done:
            raise Fenced(
                f"catalog {self.name}: node {self.node!r} lost its lock (writer pid {self.writer_pid})"
            )

    @_once_more
    def wait_applied(self, epoch: int, timeout: float) -> bool:
        """Block until every live node has applied ``epoch`` (True), or ``timeout``
        seconds passed (False). Polls every few ms. RabbitMQ answers a declare once
        Mnesia has the change on every running node: the same promise."""
        deadline = time.monotonic() + timeout
        pause = FIRST_POLL
        with self._session() as conn:
            while True:
                behind = conn.execute(
                    f"SELECT EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.applied < %s AND {LIVE_SQL})",
                    (epoch, self.cluster),
                ).fetchone()[0]
                if not behind:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._closed.is_set():
                    return False
                time.sleep(min(pause, left))
                pause = min(pause * 2, MAX_POLL)

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on a daemon thread) on each NOTIFY of the change log, and
        once each time the listening session (re)connects (changes may have come
        meanwhile). Errors reconnect after :data:`LISTEN_RETRY` s; stops at close()."""
        thread = threading.Thread(
            target=self._listening, args=(callback,), name="leveret-catalog-listen", daemon=True
        )
        self._listeners.append(thread)
        thread.start()

    def _listening(self, callback: Callable[[], None]) -> None:
        channel = changes_channel(self.cluster).replace('"', '""')
        said = False
        while not self._closed.is_set():
            conn = None
            try:
                conn = connect(self.url, self.cluster, "leveret-listen", server_keepalives=True)
                conn.execute(f'LISTEN "{channel}"')
                said = False
                self._call(callback)
                while not self._closed.is_set():
                    for _ in conn.notifies(timeout=LISTEN_CHECK):
                        self._call(callback)
                        if self._closed.is_set():
                            break
            except Exception as exc:  # the database went: listen again when it is back
                if not said and not self._closed.is_set():
                    log.warning("catalog %s: listening failed, retrying: %s", self.name, str(exc).strip())
                    said = True
                self._closed.wait(LISTEN_RETRY)
            finally:
                if conn is not None:
                    conn.close()

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("catalog: a change listener failed")

    # -- the rest -----------------------------------------------------------------------
    @_once_more
    def transient_definitions(self, exclude_node: str | None = None) -> list[TransientDefinition]:
        """Every node's non-durable definitions but ``exclude_node``'s, in the order they
        were first saved."""
        with self._session() as conn:
            rows = conn.execute(
                "SELECT kind, vhost, name, node, data FROM transient_definitions "
                "WHERE node IS DISTINCT FROM %s ORDER BY ord",
                (exclude_node,),
            ).fetchall()
        return [
            TransientDefinition(kind, vhost, name, node, _decode_table(data))
            for kind, vhost, name, node, data in rows
        ]

    @_once_more
    def secret(self) -> str:
        """The cluster's secret (the internal user ``leveret-cluster``'s password): a
        random token made once, the same for every node that reaches the database."""
        if self._secret is None:
            with self._session() as conn:
                conn.execute(
                    "INSERT INTO cluster_meta (key, value) VALUES ('secret', %s) "
                    "ON CONFLICT (key) DO NOTHING",
                    (secrets.token_urlsafe(32),),
                )
                self._secret = str(
                    conn.execute("SELECT value FROM cluster_meta WHERE key = 'secret'").fetchone()[0]
                )
        return self._secret

    def close(self) -> None:
        """Close the sessions and stop the listeners (within :data:`LISTEN_CHECK` s, or
        :data:`LISTEN_RETRY` s while one reconnects)."""
        self._closed.set()
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for thread in self._listeners:
            thread.join(LISTEN_RETRY * 2)
        self._listeners.clear()
