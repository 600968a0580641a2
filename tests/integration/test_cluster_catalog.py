"""The PostgreSQL side of an active-active cluster, on the session's real server: node
stores of one cluster in one process (PostgreSQLStore with a node name) and their
catalogs (leveret.cluster.catalog): the node lock, ids that never collide, fencing of
catalog writes, take-over, the change log and its NOTIFY, wait_applied."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from eventually import eventually

from leveret.cluster.catalog import Catalog, CatalogError, Fenced
from leveret.store import StoreError
from leveret.store.base import SEQ_BLOCK_BITS, ScheduledRow
from leveret.store.postgresql import PostgreSQLStore

TIMEOUT = 10.0
_numbers = itertools.count()


class Member:
    """A node of the test cluster: its store (started on a loop of its own) and catalog."""

    def __init__(self, url: str, cluster: str, node: str) -> None:
        self.node = node
        self.loop = asyncio.new_event_loop()
        self.store = PostgreSQLStore(url, cluster, node=node)
        self.fenced: list[str] = []
        self.store.on_fenced = self.fenced.append
        self.snapshot = self.store.load()
        self.store.start(self.loop)
        self.catalog = Catalog(url, cluster, node)
        assert self.store.writer_pid is not None
        self.catalog.set_writer_pid(self.store.writer_pid)
        self.number = self.catalog.register("127.0.0.1", 5672, 15672)
        self.closed = False

    def durable(self) -> bool:
        future = self.loop.create_future()
        self.store.when_durable(future.set_result)
        return self.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))

    def spin(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.catalog.close()
            self.store.close()
            self.loop.close()


@pytest.fixture
def cluster_name() -> str:
    return f"test_cluster_catalog_{next(_numbers)}_{time.time_ns()}"


@pytest.fixture
def members(postgres, cluster_name) -> Iterator[list[Member]]:
    """Nodes a, b and c of a new cluster (started in that order: numbers 1, 2, 3)."""
    started = [Member(postgres.url, cluster_name, name) for name in "abc"]
    yield started
    for member in started:
        member.close()


def kill_writer(postgres, member: Member) -> None:
    """End the member's store writer session from outside, as a cut-off would, and
    wait until the backend is gone and no session holds the node's lock (what the
    catalog's fencing and liveness look at)."""
    pid = member.store.writer_pid
    assert pid is not None
    assert postgres.sql("SELECT pg_terminate_backend(%s)", pid) == [(True,)]
    held = (
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s UNION ALL SELECT 1 FROM pg_locks "
        "WHERE locktype = 'advisory' AND classid = hashtext('leveret-node')::oid "
        "AND objid = hashtext(%s)::oid"
    )
    key = f"{member.store.cluster}/{member.node}"
    gone = eventually(lambda: not postgres.sql(held, pid, key), TIMEOUT, 0.01)
    assert gone, f"{member.node}'s writer or lock is still there"


def test_the_node_lock_is_held_once_per_node_name(postgres, cluster_name):
    first = Member(postgres.url, cluster_name, "a")
    second = PostgreSQLStore(postgres.url, cluster_name, node="a")
    other = PostgreSQLStore(postgres.url, cluster_name, node="b")
    try:
        assert first.number == 1
        assert second.try_master() is False  # the same name: waits, as a standby
        with pytest.raises(StoreError, match="running elsewhere"):
            second.load()
        assert other.try_master() is True  # another name: its own lock
        took = threading.Event()
        cancel = threading.Event()
        waiter = threading.Thread(target=lambda: second.wait_for_master(cancel) and took.set())
        waiter.start()
        assert not took.wait(0.3)
        first.close()  # its writer session ends: the lock is free
        assert took.wait(TIMEOUT)
        waiter.join(TIMEOUT)
        assert second.writer_pid is not None and second.writer_pid != first.store.writer_pid
    finally:
        first.close()
        second.close()
        other.close()


def test_numbers_are_given_once_and_kept_across_restarts(postgres, cluster_name, members):
    a, b, c = members
    assert (a.number, b.number, c.number) == (1, 2, 3)
    b.close()
    again = Member(postgres.url, cluster_name, "b")
    try:
        assert again.number == 2
        assert [(n.name, n.number, n.live) for n in again.catalog.nodes()] == [
            ("a", 1, True),
            ("b", 2, True),
            ("c", 3, True),
        ]
    finally:
        again.close()


def test_ids_of_two_nodes_never_collide_and_each_loads_its_own_queues(postgres, cluster_name, members):
    a, b, _ = members
    queue_ids = {m.node: [m.store.new_queue_id() for _ in range(3)] for m in (a, b)}
    assert not set(queue_ids["a"]) & set(queue_ids["b"])
    for member in (a, b):
        for number, queue_id in enumerate(queue_ids[member.node]):
            owner = member.catalog.claim_queue("/", f"{member.node}{number}", queue_id, member.node, True)
            assert owner == member.node
    stored: dict[int, tuple[str, int, int]] = {}
    for round_ in range(2):  # interleaved, both batches on their way at once
        for member in (a, b):
            for queue_id in queue_ids[member.node]:
                # FIFO seqs, and a priority level's
                for seq in (round_ * 10 + 1, round_ * 10 + 2, (3 << SEQ_BLOCK_BITS) + round_ + 1):
                    body = f"{member.node}/{queue_id}/{seq}".encode()
                    store_id = member.store.add_message(queue_id, seq, "ex", "rk", b"H", body)
                    assert store_id not in stored
                    stored[store_id] = (member.node, queue_id, seq)
    scheduled = [m.store.new_scheduled_id() for m in (a, b) for _ in range(3)]
    assert len(set(scheduled)) == len(scheduled)
    assert a.durable() and b.durable()
    rows = postgres.sql(f'SELECT id, queue_id, seq, body FROM "{cluster_name}".messages')
    assert len(rows) == len(stored) == 2 * 3 * 6
    for store_id, queue_id, seq, body in rows:
        node, want_queue, want_seq = stored[store_id]
        assert (queue_id, seq, bytes(body)) == (want_queue, want_seq, f"{node}/{queue_id}/{seq}".encode())
    # each node reads back its own queue's rows
    assert [m.seq for m in b.store.read_queue(queue_ids["b"][0], 0, 100)] == [
        1,
        2,
        11,
        12,
        (3 << SEQ_BLOCK_BITS) + 1,
        (3 << SEQ_BLOCK_BITS) + 2,
    ]
    # a restart: its counts are its own queues', and new ids go on after every node's
    a.close()
    again = Member(postgres.url, cluster_name, "a")
    try:
        assert set(again.snapshot.queues) == set(queue_ids["a"])
        assert again.snapshot.queues[queue_ids["a"][0]][0] == 6
        fresh = again.store.add_message(queue_ids["a"][0], 30, "ex", "rk", b"H", b"new")
        assert fresh not in stored
        assert again.store.new_queue_id() not in queue_ids["a"] + queue_ids["b"]
        assert again.durable()
    finally:
        again.close()


def test_a_catalog_write_is_fenced_once_the_writer_session_is_gone(postgres, members):
    a, b, _ = members
    assert a.catalog.claim_queue("/", "q1", a.store.new_queue_id(), "a", True) == "a"
    a.catalog.mark_applied(0)
    kill_writer(postgres, a)
    with pytest.raises(Fenced):
        a.catalog.claim_queue("/", "q2", 99, "a", True)
    with pytest.raises(Fenced):
        a.catalog.mark_applied(1)
    with pytest.raises(Fenced):
        a.catalog.move_queue("/", "q1", "b")
    assert a.catalog.owners() == {("/", "q1"): ("a", 1)}  # reads go on
    assert b.catalog.live_nodes() == {"b", "c"}
    # the store hears of it at its next idle ping (PING_EVERY, 0.5 s)
    assert eventually(lambda: a.fenced, TIMEOUT, 0.05, a.spin), "the store did not notice"
    assert a.store.fenced


def test_a_claim_keeps_the_first_owner_and_refuses_a_dead_target(postgres, members):
    a, b, c = members
    assert a.catalog.claim_queue("/", "q", 1, "a", True) == "a"
    assert b.catalog.claim_queue("/", "q", 2, "b", True) == "a"  # lost the race
    assert a.catalog.claim_queue("/", "placed", 3, "c", True) == "c"  # balanced placement
    kill_writer(postgres, c)
    with pytest.raises(CatalogError, match="not running"):
        a.catalog.claim_queue("/", "elsewhere", 4, "c", True)
    assert a.catalog.release_queue("/", "q") is True
    assert a.catalog.release_queue("/", "q") is False
    assert set(b.catalog.owners()) == {("/", "placed")}


def test_take_over_waits_for_the_owner_to_die_then_balances_its_queues(postgres, cluster_name, members):
    a, b, c = members
    for number in range(4):
        a.catalog.claim_queue("/", f"a{number}", 100 + number, "a", True)
    for number in range(2):
        b.catalog.claim_queue("/", f"b{number}", 200 + number, "b", True)
    a.catalog.claim_queue("/", "a-transient", 150, "a", False)
    a.store.save_transient("queue", "/", "a-transient", {"durable": False})
    a.store.add_message(100, 1, "ex", "rk", b"H", b"kept")
    a.store.add_message(100, 2, "ex", "rk", b"H", b"paged-out transient", transient=True)
    a.store.add_message(150, 1, "ex", "rk", b"H", b"of a non-durable queue", transient=True)
    due = time.time() + 60
    a.store.save_scheduled(
        ScheduledRow(a.store.new_scheduled_id(), "/", "job", due, "ex", "rk", b"H", b"later", None, "{}")
    )
    assert a.durable()
    before = b.catalog.last_epoch()

    assert b.catalog.take_over("a") == []  # a lives: its lock cannot be taken
    assert a.catalog.owners()[("/", "a0")] == ("a", 100)

    kill_writer(postgres, a)
    eventually(lambda: "a" not in b.catalog.live_nodes(), TIMEOUT, 0.05)
    moved = b.catalog.take_over("a")
    # (vhost, name, queue id, new owner)
    assert {(vhost, name, queue_id) for vhost, name, queue_id, _ in moved} == {
        ("/", f"a{n}", 100 + n) for n in range(4)
    }
    # c had none, b two: c is given queues until they tie, then one each
    assert Counter(owner for *_, owner in moved) == {"c": 3, "b": 1}
    owners = c.catalog.owners()
    assert Counter(node for node, _ in owners.values()) == {"b": 3, "c": 3}
    assert ("/", "a-transient") not in owners  # a non-durable queue goes with its node
    changes = c.catalog.changes_since(before)
    assert [(ch.kind, ch.name, ch.data) for ch in changes if ch.kind == "owner"] == [
        ("owner", name, {"node": owner, "queue_id": queue_id}) for _, name, queue_id, owner in moved
    ]
    assert ("queue", "a-transient", None) in [(ch.kind, ch.name, ch.data) for ch in changes]
    assert all(ch.node == "b" for ch in changes)
    assert c.catalog.transient_definitions() == []
    state = {n.name: (n.state, n.live) for n in c.catalog.nodes()}
    assert state["a"] == ("down", False)
    schema = f'"{cluster_name}"'
    assert postgres.sql(f"SELECT node FROM {schema}.scheduled") == [("b",)]
    # the dead owner's paged-out transient message is lost (RabbitMQ's classic queues)
    assert postgres.sql(f"SELECT body FROM {schema}.messages WHERE queue_id = 100") == [(b"kept",)]
    # the non-durable queue's messages: deleted in the background by a live node's writer
    left = (
        f"SELECT (SELECT count(*) FROM {schema}.messages WHERE queue_id = 150), "
        f"(SELECT count(*) FROM {schema}.pending_deletes)"
    )
    eventually(lambda: postgres.sql(left) == [(0, 0)], TIMEOUT, 0.05)
    assert c.catalog.take_over("a") == []  # nothing left


def test_changes_are_logged_with_the_batch_and_notified(members):
    a, b, _ = members
    heard = threading.Event()
    b.catalog.listen(heard.set)
    eventually(heard.is_set, TIMEOUT, 0.05)  # once when it starts listening
    heard.clear()
    a.store.save_definition("exchange", "/", "x", {"type": "direct"})
    a.store.log_change("exchange", "/", "x", {"type": "direct"})
    a.store.log_change("exchange", "/", "gone", None)
    a.store.save_transient("exchange", "/", "t", {"type": "fanout"})
    assert a.durable()
    assert heard.wait(TIMEOUT)
    assert a.store.last_epoch > 0
    assert b.catalog.last_epoch() == a.store.last_epoch
    changes = b.catalog.changes_since(0)
    assert [(ch.node, ch.kind, ch.vhost, ch.name, ch.data) for ch in changes] == [
        ("a", "exchange", "/", "x", {"type": "direct"}),
        ("a", "exchange", "/", "gone", None),
    ]
    assert changes[-1].epoch == a.store.last_epoch
    assert b.catalog.changes_since(changes[0].epoch) == changes[1:]
    assert b.catalog.changes_since(0, limit=1) == changes[:1]
    [transient] = b.catalog.transient_definitions(exclude_node="b")
    assert (transient.kind, transient.name, transient.node) == ("exchange", "t", "a")
    assert transient.data == {"type": "fanout"}
    assert a.catalog.transient_definitions(exclude_node="a") == []
    a.store.delete_transient("exchange", "/", "t")
    assert a.durable()
    assert b.catalog.transient_definitions() == []


def test_concurrent_changes_become_visible_in_epoch_order(members):
    a = members[0]
    for round_ in range(20):
        for member in members:
            member.store.log_change("exchange", "/", f"{member.node}{round_}", {})
        for member in members:
            member.loop.run_until_complete(asyncio.sleep(0))  # all three batches on their way
    assert all(m.durable() for m in members)
    epochs = [ch.epoch for ch in a.catalog.changes_since(0)]
    assert len(epochs) == 60 and epochs == sorted(epochs)
    assert max(m.store.last_epoch for m in members) == epochs[-1]


def test_wait_applied_waits_for_every_live_node(postgres, members):
    a, b, c = members
    a.store.log_change("exchange", "/", "x", {})
    assert a.durable()
    epoch = a.store.last_epoch
    a.catalog.mark_applied(epoch)
    b.catalog.mark_applied(epoch)
    started = time.monotonic()
    assert a.catalog.wait_applied(epoch, 0.3) is False  # c has not applied it
    assert time.monotonic() - started >= 0.3
    threading.Timer(0.2, c.catalog.mark_applied, (epoch,)).start()
    assert a.catalog.wait_applied(epoch, TIMEOUT) is True
    assert {n.name: n.applied for n in a.catalog.nodes()} == {"a": epoch, "b": epoch, "c": epoch}
    a.catalog.mark_applied(epoch - 1)  # never lowered
    assert a.catalog.nodes()[0].applied == epoch
    kill_writer(postgres, c)  # a dead node is not waited for
    eventually(lambda: "c" not in a.catalog.live_nodes(), TIMEOUT, 0.05)
    for member in (a, b):
        member.catalog.mark_applied(epoch + 1)
    assert a.catalog.wait_applied(epoch + 1, TIMEOUT) is True


def test_move_queue_and_forget_node(postgres, members):
    a, b, c = members
    a.catalog.claim_queue("/", "q", 7, "a", True)
    epoch = c.catalog.move_queue("/", "q", "b")
    assert epoch > 0 and a.catalog.owners()[("/", "q")] == ("b", 7)
    [change] = a.catalog.changes_since(epoch - 1)
    assert (change.kind, change.name, change.data) == ("owner", "q", {"node": "b", "queue_id": 7})
    assert c.catalog.move_queue("/", "q", "b") == 0
    with pytest.raises(CatalogError, match="no queue"):
        c.catalog.move_queue("/", "nothing", "b")
    with pytest.raises(CatalogError, match="is running"):
        a.catalog.forget_node("b")
    kill_writer(postgres, b)
    eventually(lambda: "b" not in a.catalog.live_nodes(), TIMEOUT, 0.05)
    with pytest.raises(CatalogError, match="not running"):
        a.catalog.move_queue("/", "q", "b")
    assert [(name, queue_id) for _, name, queue_id, _ in a.catalog.forget_node("b")] == [("q", 7)]
    assert [n.name for n in c.catalog.nodes()] == ["a", "c"]


def test_the_secret_is_made_once_for_every_node(members):
    a, b, _ = members
    secret = a.catalog.secret()
    assert len(secret) >= 32 and b.catalog.secret() == secret


def test_ids_come_in_chunks_from_the_shared_counters(postgres, cluster_name, monkeypatch):
    import leveret.store.postgresql as postgresql

    monkeypatch.setattr(postgresql, "ID_CHUNK", 3)
    monkeypatch.setattr(postgresql, "QUEUE_ID_CHUNK", 2)
    a, b = Member(postgres.url, cluster_name, "a"), Member(postgres.url, cluster_name, "b")
    try:
        ids: list[int] = []
        scheduled: list[int] = []
        queues: list[int] = []
        for seq in range(1, 11):  # chunks of 3, alternately: every id once
            for member in (a, b):
                ids.append(member.store.add_message(1, seq, "ex", "rk", b"H", b"x"))
                ids.append(member.store.add_message(1, (5 << SEQ_BLOCK_BITS) + seq, "ex", "rk", b"H", b"x"))
                scheduled.append(member.store.new_scheduled_id())
                queues.append(member.store.new_queue_id())
        for handed in (ids, scheduled, queues):
            assert len(set(handed)) == len(handed)
        assert all(i < 1 << SEQ_BLOCK_BITS for i in ids[0::2])
        assert all(5 << SEQ_BLOCK_BITS < i < 6 << SEQ_BLOCK_BITS for i in ids[1::2])
        assert a.durable() and b.durable()
        [(rows,)] = postgres.sql(f'SELECT count(DISTINCT id) FROM "{cluster_name}".messages')
        assert rows == 40
    finally:
        a.close()
        b.close()


def test_a_queue_taken_over_is_read_back_with_its_dedup_keys(postgres, members):
    a, b, _ = members
    queue_id = a.store.new_queue_id()
    a.catalog.claim_queue("/", "q", queue_id, "a", True)
    for seq in (1, 2, 3):
        a.store.add_message(queue_id, seq, "ex", "rk", b"H", b"12345")
    a.store.save_dedup(queue_id, "k1", 0.0)
    assert a.durable()
    kill_writer(postgres, a)
    eventually(lambda: "a" not in b.catalog.live_nodes(), TIMEOUT, 0.05)
    [(_, _, taken, owner)] = b.catalog.take_over("a")
    assert (taken, owner) in {(queue_id, "b"), (queue_id, "c")}
    assert b.store.queue_snapshot(queue_id) == ((3, 3, 15), [("k1", 0.0)])
    assert b.store.queue_snapshot(queue_id + 1000) == (None, [])


def test_changes_every_live_node_applied_can_be_pruned(members):
    a, b, c = members
    for number in range(5):
        a.store.log_change("exchange", "/", f"x{number}", {})
    assert a.durable()
    last = a.store.last_epoch
    for member in (a, b):
        member.catalog.mark_applied(last)
    c.catalog.mark_applied(last - 2)
    assert a.catalog.prune_changes(keep=0) == 3  # c is behind: its two stay
    assert [ch.epoch for ch in a.catalog.changes_since(0)] == [last - 1, last]
    c.catalog.mark_applied(last)
    assert a.catalog.prune_changes(keep=1) == 1
    assert [ch.epoch for ch in a.catalog.changes_since(0)] == [last]
    assert a.catalog.last_epoch() == last


def test_the_listener_and_the_catalog_reconnect_after_their_sessions_end(postgres, members):
    a, b, _ = members
    heard = threading.Event()
    b.catalog.listen(heard.set)
    assert heard.wait(TIMEOUT)
    b.catalog.last_epoch()  # a catalog session in the pool
    heard.clear()
    sessions = "FROM pg_stat_activity WHERE application_name IN ('leveret-listen', 'leveret-catalog')"
    postgres.sql(f"SELECT pg_terminate_backend(pid) {sessions}")
    eventually(lambda: not postgres.sql(f"SELECT 1 {sessions}"), TIMEOUT, 0.01)
    # b's pooled session is gone: the read is made again, at once, on a new one
    assert b.catalog.live_nodes() == {"a", "b", "c"}
    assert b.catalog.claim_queue("/", "after", 5, "b", True) == "b"
    assert heard.wait(TIMEOUT)  # listening again (after LISTEN_RETRY s): called once
    heard.clear()
    a.store.log_change("queue", "/", "q", {})
    assert a.durable()
    assert heard.wait(TIMEOUT)  # and NOTIFY is heard again
    assert [ch.name for ch in b.catalog.changes_since(0)] == ["q"]


def test_a_node_reads_and_cleans_only_its_own_rows_at_start(postgres, cluster_name, members):
    a, b, _ = members
    queue_id = a.store.new_queue_id()
    a.catalog.claim_queue("/", "qa", queue_id, "a", True)
    a.store.add_message(queue_id, 1, "ex", "rk", b"H", b"paged-out", transient=True)
    due = time.time() + 60
    row = ScheduledRow(a.store.new_scheduled_id(), "/", "job-a", due, "ex", "rk", b"H", b"x", None, "{}")
    a.store.save_scheduled(row)
    assert a.durable()
    assert [r.job_id for r in a.store.read_scheduled((0.0, 0), 10)] == ["job-a"]
    assert b.store.read_scheduled((0.0, 0), 10) == [] and b.store.find_scheduled("job-a") is None
    b.close()  # a restart of b: a's transient row and scheduled row are not b's to drop
    again = Member(postgres.url, cluster_name, "b")
    try:
        assert again.snapshot.queues == {} and again.snapshot.scheduled == 0
        assert postgres.sql(f'SELECT count(*) FROM "{cluster_name}".messages') == [(1,)]
        assert postgres.sql(f'SELECT node FROM "{cluster_name}".scheduled') == [("a",)]
    finally:
        again.close()


def test_two_survivors_taking_over_at_once_move_each_queue_once(postgres, members):
    a, b, c = members
    for number in range(20):
        a.catalog.claim_queue("/", f"q{number}", 500 + number, "a", True)
    kill_writer(postgres, a)
    eventually(lambda: "a" not in b.catalog.live_nodes(), TIMEOUT, 0.05)
    results: dict[str, list] = {}
    start = threading.Barrier(2)

    def take(member: Member) -> None:
        start.wait()
        results[member.node] = member.catalog.take_over("a")

    threads = [threading.Thread(target=take, args=(m,)) for m in (b, c)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    moved = results["b"] + results["c"]
    assert [] in (results["b"], results["c"])  # the lock let one in; the other found nothing
    assert sorted(name for _, name, _, _ in moved) == sorted(f"q{n}" for n in range(20))
    assert Counter(node for node, _ in b.catalog.owners().values()) == {"b": 10, "c": 10}
    owner_changes = [ch for ch in b.catalog.changes_since(0) if ch.kind == "owner"]
    assert len(owner_changes) == 20
