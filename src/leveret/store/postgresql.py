"""The shared store: PostgreSQL (psycopg 3), for a master and standbys.

Everything the SQLite store keeps, kept the same way (:class:`~.batched.BatchedStore`:
group commit, one transaction per batch, background chunked range deletions), in the
tables of one PostgreSQL schema per cluster (``cluster`` names it, default
``leveret``). A confirm or commit-ok goes out only after PostgreSQL has committed
(``synchronous_commit`` as the server is configured: ``on`` by default, ``remote_apply``
to wait for a replica as well).

Master and standbys: the broker whose writer session holds the session-level advisory
lock ``pg_advisory_lock(hashtext('leveret'), hashtext(cluster))`` is the master; every
write goes through that same session, so a broker that lost the lock cannot write
either. Others wait in :meth:`PostgreSQLStore.wait_for_master`. The lock goes with the
session: a master killed or cut off from the database lets a standby in as soon as
PostgreSQL sees the session end, and the old master, finding its session gone (a failed
write or the writer's ping every :data:`PING_EVERY` s), is fenced (``on_fenced``).
Unlike ActiveMQ's JDBC lock table there is no lease to renew and no row to poll. Both
ends of the writer's session use short TCP keepalives (:data:`KEEPALIVES`,
:data:`SERVER_KEEPALIVES`), so a master whose machine vanished loses the lock in about
5 s, not after the server's default two hours.

The schema is created and migrated by leveret (table ``schema_version``), under the
master lock, never by hand.

Cluster nodes (``node`` given: an active node of an active-active cluster, see
:mod:`leveret.cluster`): the writer session takes the node's own lock,
``pg_try_advisory_lock(hashtext('leveret-node'), hashtext(cluster || '/' || node))``,
instead of the master lock (a second process of the same node name waits for it, as a
standby does). Every node writes the same tables, its own queues' rows only: message,
scheduled-row and queue ids come in chunks from counters in ``meta`` (:data:`ID_CHUNK`
ids at a time, one round trip on the event loop per chunk), so ids never collide;
:meth:`PostgreSQLStore.load` counts only the node's queues (``queue_owners``) and its
scheduled rows (``scheduled.node``). A node's batches also carry its definition changes
for the others (:meth:`~PostgreSQLStore.log_change`, the ``changes`` table and a NOTIFY)
and its non-durable definitions (``transient_definitions``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .base import SEQ_BLOCK_BITS, StoreError
from .batched import BLOCK, DELETE_CHUNK, Batch, BatchedStore, Connection, _encode_table
from .ops import DeleteTransient, LogChange, SaveTransient

log = logging.getLogger("leveret.store")

PING_EVERY = 0.5  # seconds between the idle writer's checks that its session lives
#: Ids a cluster node takes at a time from a shared counter (messages, per seq block;
#: scheduled rows); queue ids come :data:`QUEUE_ID_CHUNK` at a time.
ID_CHUNK = 1 << 20
QUEUE_ID_CHUNK = 1000
#: The first key of a cluster node's advisory lock (the second: hashtext(cluster/node)).
NODE_LOCK = "leveret-node"
RETRY_CONNECT = 1.0  # seconds between a standby's attempts to reach the database
POLL_LOCK = 0.1  # seconds between a standby's attempts to take the master lock
#: libpq keepalives: a master cut off from the database notices within ~5 s.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
    "connect_timeout": 5,
}

#: The same on PostgreSQL's side of the writer's session (seconds; ms for the timeout):
#: the server ends a dead master's session, and frees the lock, within about 5 s.
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": 2,
    "tcp_keepalives_interval": 1,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 5000,
}

#: Migrations, in order: the schema is at version ``len(MIGRATIONS)``. Never edit one
#: that has shipped; append.
MIGRATIONS = [
    """
    CREATE TABLE definitions (
        ord BIGINT GENERATED ALWAYS AS IDENTITY, kind TEXT NOT NULL, vhost TEXT NOT NULL,
        name TEXT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (kind, vhost, name));
    CREATE TABLE messages (
        id BIGINT PRIMARY KEY, queue_id BIGINT NOT NULL, seq BIGINT NOT NULL,
        delivery_count INTEGER NOT NULL, exchange TEXT NOT NULL, routing_key TEXT NOT NULL,
        header BYTEA NOT NULL, body BYTEA NOT NULL, transient SMALLINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, published_at DOUBLE PRECISION NOT NULL,
        size BIGINT NOT NULL, meta TEXT, available_at DOUBLE PRECISION NOT NULL DEFAULT 0);
    -- bodies are stored as they came: compressing them costs CPU on every publish
    ALTER TABLE messages ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE INDEX messages_by_queue ON messages (queue_id, seq) INCLUDE (size);
    CREATE INDEX messages_transient ON messages (id) WHERE transient=1;
    CREATE INDEX messages_expiring ON messages (queue_id, expires_at) WHERE expires_at > 0;
    CREATE TABLE pending_deletes (
        ord BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue_id BIGINT NOT NULL,
        low BIGINT NOT NULL, high BIGINT NOT NULL);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
    CREATE TABLE dedup (
        ord BIGINT GENERATED ALWAYS AS IDENTITY, queue_id BIGINT NOT NULL, key TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (queue_id, key));
    CREATE TABLE scheduled (
        id BIGINT PRIMARY KEY, vhost TEXT NOT NULL, job_id TEXT NOT NULL,
        due_at DOUBLE PRECISION NOT NULL, exchange TEXT NOT NULL, routing_key TEXT NOT NULL,
        header BYTEA NOT NULL, body BYTEA NOT NULL, meta TEXT, schedule TEXT NOT NULL,
        transient SMALLINT NOT NULL);
    CREATE INDEX scheduled_by_due ON scheduled (due_at, id);
    CREATE INDEX scheduled_by_job ON scheduled (job_id);
    """,
    # 2: failed deliveries counted apart from deliveries (RabbitMQ 4.3's delivery-count)
    """
    ALTER TABLE messages ADD COLUMN failed_count INTEGER NOT NULL DEFAULT 0;
    """,
    # 3: an active-active cluster (leveret.cluster): members, queue owners, the change log,
    # non-durable definitions, the cluster's secret; scheduled rows belong to a node (NULL:
    # a single broker's), set by the writer session's ``leveret.node`` setting
    """
    CREATE TABLE cluster_nodes (
        name TEXT PRIMARY KEY, number INTEGER NOT NULL UNIQUE, host TEXT NOT NULL,
        amqp_port INTEGER NOT NULL, http_port INTEGER NOT NULL, state TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL, applied BIGINT NOT NULL DEFAULT 0, writer_pid INTEGER);
    CREATE TABLE queue_owners (
        vhost TEXT NOT NULL, name TEXT NOT NULL, queue_id BIGINT NOT NULL, node TEXT NOT NULL,
        durable BOOLEAN NOT NULL, PRIMARY KEY (vhost, name));
    CREATE INDEX queue_owners_by_node ON queue_owners (node);
    CREATE TABLE changes (
        epoch BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, node TEXT, kind TEXT NOT NULL,
        vhost TEXT NOT NULL, name TEXT NOT NULL, data BYTEA);
    CREATE TABLE transient_definitions (
        ord BIGINT GENERATED ALWAYS AS IDENTITY, kind TEXT NOT NULL, vhost TEXT NOT NULL,
        name TEXT NOT NULL, node TEXT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (kind, vhost, name));
    CREATE INDEX transient_definitions_by_node ON transient_definitions (node);
    CREATE TABLE cluster_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    ALTER TABLE scheduled ADD COLUMN node TEXT DEFAULT current_setting('leveret.node', true);
    CREATE INDEX scheduled_by_node ON scheduled (node, due_at, id);
    """,
]


def redact(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def escape_text(text: str) -> str:
    """A string PostgreSQL's ``text`` can hold: NUL (legal in AMQP names and routing
    keys, refused by PostgreSQL) as ``\\0``, a backslash doubled."""
    if "\\" in text or "\x00" in text:
        return text.replace("\\", "\\\\").replace("\x00", "\\0")
    return text


def unescape_text(text: str) -> str:
    """The inverse of :func:`escape_text`."""
    if "\\" not in text:
        return text
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "0" else m.group(1), text)


def node_key(cluster: str, node: str) -> str:
    """The text whose ``hashtext`` is the second key of ``node``'s advisory lock."""
    return f"{cluster}/{node}"


def changes_channel(cluster: str) -> str:
    """The NOTIFY channel of ``cluster``'s change log (PostgreSQL's 63-byte limit)."""
    return f"leveret_changes_{cluster}".encode()[:63].decode(errors="ignore")


def _text_adapters(conn: Any) -> None:
    """Every string in and out of ``conn`` goes through escape_text / unescape_text."""
    from psycopg.types.string import StrDumperUnknown, TextLoader

    class Dumper(StrDumperUnknown):
        def dump(self, obj: str) -> Any:
            return super().dump(escape_text(obj))

    class Loader(TextLoader):
        def load(self, data: Any) -> str:
            return unescape_text(str(super().load(data)))

    conn.adapters.register_dumper(str, Dumper)
    conn.adapters.register_loader("text", Loader)


def connect(
    url: str, cluster: str, application_name: str, *, server_keepalives: bool = False, node: str | None = None
) -> Any:
    """A psycopg session for ``cluster``'s schema (made if missing, then the search
    path): autocommit, libpq keepalives (:data:`KEEPALIVES`), every string escaped
    (:func:`escape_text`); ``server_keepalives``: PostgreSQL's end too
    (:data:`SERVER_KEEPALIVES`: a session holding a lock must not outlive its machine by
    the server's default 2 h); ``node``: a cluster node's session (the ``leveret.node``
    setting names it, see migration 3). psycopg.Error when it cannot be opened."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True, application_name=application_name, **KEEPALIVES)
    _text_adapters(conn)
    if server_keepalives:
        for setting, value in SERVER_KEEPALIVES.items():
            try:
                conn.execute(f"SET {setting} = {value}")
            except psycopg.Error as exc:  # an old server, a pooler: still usable
                log.warning("store %s: cannot SET %s: %s", redact(url), setting, exc)
    schema = cluster.replace('"', "")
    try:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    except psycopg.errors.UniqueViolation:  # made meanwhile by another session: fine
        pass
    conn.execute(f'SET search_path TO "{schema}"')
    if node is not None:
        conn.execute("SELECT set_config('leveret.node', %s, false)", (node,))
    return conn


def migrate(db: Any, name: str, cluster: str | None = None) -> None:
    """Bring the schema of ``db``'s session (a :class:`PgConnection`) to the latest
    version. ``cluster``: several writers may start at once (cluster nodes), so the
    migration runs in one transaction under a cluster-wide transaction lock.
    StoreError if the schema is newer than this leveret; psycopg.Error if it fails."""
    if cluster is not None:
        db.execute("BEGIN")
        try:
            db.execute("SELECT pg_advisory_xact_lock(hashtext('leveret-migrate'), hashtext(?))", (cluster,))
            _migrate_steps(db, name, nested=True)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    else:
        _migrate_steps(db, name, nested=False)


def _migrate_steps(db: Any, name: str, nested: bool) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = db.execute("SELECT max(version) FROM schema_version").fetchone()
    version = row[0] or 0
    if version > len(MIGRATIONS):
        raise StoreError(
            f"store {name}: schema version {version} is newer than this leveret "
            f"knows ({len(MIGRATIONS)}): upgrade leveret"
        )
    for number in range(version + 1, len(MIGRATIONS) + 1):
        if not nested:
            db.execute("BEGIN")
        db.execute(MIGRATIONS[number - 1])
        db.execute("INSERT INTO schema_version VALUES (?)", (number,))
        if not nested:
            db.execute("COMMIT")
        log.info("store %s: schema migrated to version %d", name, number)


class PgConnection:
    """A psycopg connection in autocommit mode that takes ``?`` placeholders (the SQL
    of :class:`BatchedStore` is written once, for both stores)."""

    def __init__(self, conn: Any, reopen: Callable[[], Any] | None = None) -> None:
        self.conn = conn
        #: makes a new session when this one broke (the reader's: reads may go on)
        self.reopen = reopen
        self._sql: dict[str, str] = {}

    def _q(self, sql: str) -> str:
        text = self._sql.get(sql)
        if text is None:
            text = self._sql[sql] = sql.replace("?", "%s")
        return text

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        try:
            return self.conn.execute(self._q(sql), params or None)
        except Exception:
            if self.reopen is None or not self.conn.broken:
                raise
            self.conn = self.reopen()  # once: a second failure is the caller's
            return self.conn.execute(self._q(sql), params or None)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any:
        with self.conn.cursor() as cursor:
            cursor.executemany(self._q(sql), params)

    def close(self) -> None:
        self.conn.close()


class PostgreSQLStore(BatchedStore):
    """The store in PostgreSQL at ``url`` (``postgresql://user:pass@host:port/db``),
    schema ``cluster``; ``node``: as that active node of the cluster (see the module's
    doc), None: a master or standby. StoreError (naming the URL, without its password)
    when the database cannot be reached or read."""

    _order = "ord"
    _idle_every = PING_EVERY

    def __init__(self, url: str, cluster: str = "leveret", node: str | None = None) -> None:
        super().__init__(redact(url))
        import psycopg  # only a broker that uses PostgreSQL loads the driver

        self._psycopg = psycopg
        self._errors = (psycopg.Error,)
        self.url = url
        self.cluster = cluster
        self.node = node
        #: when the master (or node) lock was taken (monotonic seconds), None while standby
        self.master_since: float | None = None
        #: why the last attempt to reach the database failed (None: it did not)
        self.unreachable: str | None = None
        #: the writer session's backend pid once it holds the lock: a cluster node's
        #: fencing token (leveret.cluster.catalog checks it in SQL)
        self.writer_pid: int | None = None
        #: time.monotonic() of the writer's last successful round trip (a committed
        #: batch, the idle ping every PING_EVERY s): a node's lease runs from it
        self.last_ok = 0.0
        #: the highest change-log epoch this writer committed (log_change), 0: none
        self.last_epoch = 0
        if node is not None:
            self._owned_sql = (
                "queue_id IN (SELECT queue_id FROM queue_owners WHERE node = current_setting('leveret.node'))"
            )
            self._mine_sql = " AND node = current_setting('leveret.node')"
            self._id_end = 0  # chunks of ids from the shared counters (load takes the first)
            # the chunk's end checked before each message, by a node only: a single
            # broker's add_message stays as it was
            self.add_message = self._add_in_chunks  # type: ignore[method-assign]
            self._scheduled_end = 0
            self._queue_id_end = 0

    def _open(self, role: str) -> PgConnection:
        return PgConnection(self._session(role), (lambda: self._session(role)) if role == "reader" else None)

    def _session(self, role: str) -> Any:
        return connect(
            self.url, self.cluster, f"leveret-{role}", server_keepalives=role == "writer", node=self.node
        )

    # -- the master lock ---------------------------------------------------------------
    def try_master(self) -> bool:
        """One attempt to become the master (a cluster node: to take the node's lock):
        connect the writer's session if needed and try the lock. OSError-free: a
        database that cannot be reached is False."""
        if self.node is None:
            sql, key = (
                "SELECT pg_try_advisory_lock(hashtext('leveret'), hashtext(?)), pg_backend_pid()",
                self.cluster,
            )
        else:
            sql = f"SELECT pg_try_advisory_lock(hashtext('{NODE_LOCK}'), hashtext(?)), pg_backend_pid()"
            key = node_key(self.cluster, self.node)
        try:
            if self._db is None:
                self._db = self._open("writer")
            row = self._db.execute(sql, (key,)).fetchone()
        except self._psycopg.Error as exc:
            log.debug("store %s: cannot take the master lock: %s", self.name, exc)
            self.unreachable = str(exc).strip()
            self._drop_writer()
            return False
        self.unreachable = None
        if row[0]:
            self.master_since = self.last_ok = time.monotonic()
            self.writer_pid = row[1]
            return True
        return False

    def wait_for_master(self, cancel: threading.Event, first_after: float = 0.0) -> bool:
        """Block until this broker holds the master lock (True) or ``cancel`` is set
        (False), trying first after ``first_after`` seconds. Logs once that it is a
        standby, and why while it cannot connect."""
        said: str | None = None  # what was last logged
        if cancel.wait(first_after):
            return False
        while not cancel.is_set():
            if self.try_master():
                return True
            if self._db is None:  # cannot connect
                if said != "unreachable":
                    log.warning("store %s: standby: the database cannot be reached, retrying", self.name)
                    said = "unreachable"
                cancel.wait(RETRY_CONNECT)
                continue
            if said != "standby":
                if self.node is None:
                    log.info("store %s: standby: cluster %r has another master", self.name, self.cluster)
                else:
                    log.info(
                        "store %s: standby: node %r of cluster %r is running elsewhere",
                        self.name,
                        self.node,
                        self.cluster,
                    )
                said = "standby"
            cancel.wait(POLL_LOCK)
        return False

    def _drop_writer(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except self._psycopg.Error:
                pass
            self._db = None

    # -- BatchedStore's hooks ---------------------------------------------------------------
    def _connect(self) -> Connection:
        """The writer's session, which must hold the master lock (StoreError if it
        cannot get it now), with the schema migrated to the latest version."""
        if self.master_since is None and not self.try_master():
            if self.unreachable is not None:
                raise StoreError(f"cannot open store {self.name}: {self.unreachable}")
            if self.node is not None:
                raise StoreError(
                    f"store {self.name}: node {self.node!r} of cluster {self.cluster!r} is running elsewhere"
                )
            raise StoreError(f"store {self.name}: not the master of cluster {self.cluster!r}")
        db = self._db
        assert db is not None
        try:
            self._migrate(db)
        except self._psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.name}: {exc}") from None
        return db

    def _migrate(self, db: Connection) -> None:
        migrate(db, self.name, self.cluster if self.node is not None else None)

    def _connect_reader(self) -> Connection:
        return self._open("reader")

    def _idle(self, db: Connection) -> None:
        db.execute("SELECT 1")
        self.last_ok = time.monotonic()

    def _write_batch(self, db: Connection, batch: Batch) -> None:
        epoch = self._write(db, batch)
        self.last_ok = time.monotonic()
        if epoch > self.last_epoch:
            self.last_epoch = epoch

    @classmethod
    def _delete_chunk(cls, db: Connection, limit: int | None = DELETE_CHUNK) -> bool:
        """:meth:`BatchedStore._delete_chunk`, skipping a range that another writer works
        on (``FOR UPDATE SKIP LOCKED``: cluster nodes share the table; whether any range
        deletion is still pending, for this writer)."""
        if db.execute("SELECT 1 FROM pending_deletes LIMIT 1").fetchone() is None:
            return False
        db.execute("BEGIN")
        try:
            row = db.execute(
                "SELECT ord, queue_id, low, high FROM pending_deletes ORDER BY ord LIMIT 1 "
                "FOR UPDATE SKIP LOCKED"
            ).fetchone()
            if row is None:
                db.execute("COMMIT")
                return False
            cls._delete_rows(db, row, limit)
            db.execute("COMMIT")
        except BaseException:
            try:
                db.execute("ROLLBACK")
            except Exception:  # the session is gone: the caller hears of it
                pass
            raise
        return True

    # -- a cluster node's ids: chunks of shared counters ---------------------------------
    def _load_ids(self, db: Connection) -> None:
        if self.node is None:
            super()._load_ids(db)
            return
        self._next_ids.clear()
        self._block_ends.clear()
        self._next_id = self._id_chunk(0, db)
        self._next_scheduled_id = self._scheduled_chunk(db)
        self._next_queue_id = self._queue_chunk(db)

    def _add_in_chunks(self, queue_id: int, seq: int, *args: Any, **kwargs: Any) -> int:
        """A cluster node's :meth:`add_message`: a new chunk of ids first when block 0's
        is used up (the other blocks' are checked by :meth:`_block_id`)."""
        if seq < BLOCK and self._next_id >= self._id_end:
            self._next_id = self._id_chunk(0)
        return BatchedStore.add_message(self, queue_id, seq, *args, **kwargs)

    def _take(
        self, counter: str, first_sql: str, first_params: tuple, size: int, db: Connection | None
    ) -> int:
        """The first of ``size`` ids of ``counter`` (a ``meta`` row: the next id free
        for any node), made at ``first_sql``'s answer (the first id above those on
        disk) when new. On ``db``, else the loop's reader session (one round trip per
        chunk). StoreError when the database cannot be reached."""
        db = db or self._reader
        assert db is not None
        try:
            row = db.execute(
                f"INSERT INTO meta (key, value) SELECT ?, ({first_sql}) + ? ON CONFLICT (key) DO UPDATE "
                "SET value = meta.value + ? RETURNING value",
                (counter, *first_params, size, size),
            ).fetchone()
        except self._psycopg.Error as exc:
            raise self._error("allocate ids in", exc) from None
        return int(row[0]) - size

    def _id_chunk(self, block: int, db: Connection | None = None) -> int:
        if self.node is None:
            return super()._id_chunk(block)
        low = block << SEQ_BLOCK_BITS
        first = self._take(
            f"message_ids_{block}",
            "SELECT COALESCE(max(id), ?) + 1 FROM messages WHERE id >= ? AND id < ?",
            (low, low, low + BLOCK),
            ID_CHUNK,
            db,
        )
        end = first + ID_CHUNK
        if end > low + BLOCK:
            raise StoreError(f"store {self.name}: out of message ids in seq block {block}")
        if block == 0:
            self._id_end = end
        else:
            self._block_ends[block] = end
        return first

    def _scheduled_chunk(self, db: Connection | None = None) -> int:
        if self.node is None:
            return super()._scheduled_chunk()
        first = self._take(
            "scheduled_ids", "SELECT COALESCE(max(id), 0) + 1 FROM scheduled", (), ID_CHUNK, db
        )
        self._scheduled_end = first + ID_CHUNK
        return first

    def _queue_chunk(self, db: Connection | None = None) -> int:
        # the single broker's counter (``next_queue_id``: the next id free), shared
        first = self._take("next_queue_id", "SELECT 1", (), QUEUE_ID_CHUNK, db)
        self._queue_id_end = first + QUEUE_ID_CHUNK
        return first

    def new_queue_id(self) -> int:
        """A single broker: :meth:`BatchedStore.new_queue_id`. A cluster node: the next
        of its chunk of the shared ``next_queue_id`` counter (a round trip on the loop
        every :data:`QUEUE_ID_CHUNK` queues)."""
        if self.node is None:
            return super().new_queue_id()
        queue_id = self._next_queue_id
        if queue_id >= self._queue_id_end:
            queue_id = self._queue_chunk()
        self._next_queue_id = queue_id + 1
        return queue_id

    # -- a cluster node's change log and non-durable definitions ---------------------------
    def _node_name(self) -> str:
        if self.node is None:
            raise StoreError(f"store {self.name}: not a cluster node")
        return self.node

    def log_change(self, kind: str, vhost: str, name: str, data: dict | None) -> None:
        """A cluster node: log a definition change for the other nodes, in the current
        batch (``data`` an AMQP field table, None: deleted), with a NOTIFY on
        :func:`changes_channel`. Once the batch is durable (:meth:`when_durable`),
        :attr:`last_epoch` is at least its epoch. StoreError on a single broker."""
        node = self._node_name()
        self.definition_changes += 1
        blob = None if data is None else _encode_table(data)
        op = LogChange(node, kind, vhost, name, blob, changes_channel(self.cluster), self.cluster)
        self._changed().ops.append(op)

    def save_transient(self, kind: str, vhost: str, name: str, data: dict) -> None:
        """A cluster node: create or replace a non-durable definition (a queue,
        exchange or binding: visible to every node, deleted when this node goes), in
        the current batch. StoreError on a single broker."""
        op = SaveTransient(self._node_name(), kind, vhost, name, _encode_table(data), self.cluster)
        self.definition_changes += 1
        self._changed().ops.append(op)

    def delete_transient(self, kind: str, vhost: str, name: str) -> None:
        """A cluster node: forget a non-durable definition, in the current batch."""
        self._node_name()
        self.definition_changes += 1
        self._changed().ops.append(DeleteTransient(kind, vhost, name, self.cluster))

    def _lost_session(self, exc: BaseException) -> bool:
        db = self._db
        return isinstance(exc, self._psycopg.OperationalError) and (
            db is None or (isinstance(db, PgConnection) and db.conn.broken)
        )

    def _out_of_room(self, exc: BaseException) -> bool:
        return isinstance(exc, self._psycopg.errors.DiskFull)
