"""The sliced work behind large management lists, without a server: the sliced sort is
``sorted`` (stable, reversed too), the queue-name index follows declares and deletes
(a few, and many at once), and its queue list reads deleted queues as None."""

from __future__ import annotations

import asyncio
import random

import pytest

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.management import slicing
from leveret.management.queue_index import QueueIndex
from leveret.management.slicing import Slicer


@pytest.mark.parametrize("reverse", [False, True])
def test_the_sliced_sort_is_pythons_stable_sort(monkeypatch, reverse):
    monkeypatch.setattr(slicing, "RUN", 7)  # many runs to merge
    rng = random.Random(27)
    items = [(rng.randrange(5), index) for index in range(200)]  # many equal keys

    async def sort() -> list:
        return list(await Slicer().sorted(items, lambda item: item[0], reverse))

    assert asyncio.run(sort()) == sorted(items, key=lambda item: item[0], reverse=reverse)


def test_the_slicer_gives_the_loop_turns_when_a_slice_is_used_up():
    turns = []

    async def other() -> None:
        while True:
            turns.append(1)
            await asyncio.sleep(0)

    async def work() -> int:
        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = len(turns)
        found = await Slicer(seconds=0).map(lambda n: n * 2, range(1000), step=10)
        task.cancel()
        return len(turns) - before if found == [n * 2 for n in range(1000)] else -1

    assert asyncio.run(work()) >= 90  # a turn after each step of 10


def test_the_name_index_follows_declares_and_deletes(monkeypatch):
    monkeypatch.setattr("leveret.management.queue_index.FEW", 5)
    core = BrokerCore(ManualClock())
    vhost = core.vhosts.get("/") or core.add_vhost("/")
    rng = random.Random(1)
    names = [f"q{rng.randrange(10**6):06d}-{i}" for i in range(300)]
    for name in names:
        vhost.declare_queue(name, None)
    index = QueueIndex()

    async def listed() -> list[str]:
        return await index.names(vhost, Slicer())

    assert asyncio.run(listed()) == sorted(vhost.queues)
    first = asyncio.run(listed())
    for name in names[:3]:  # a few changes: bisect
        vhost.delete_queue(name)
    vhost.declare_queue("aaa-new", None)
    assert asyncio.run(listed()) == sorted(vhost.queues)
    assert "aaa-new" not in first and names[0] in first  # lists handed out are not changed
    for name in names[3:100]:  # many: merged in slices
        vhost.delete_queue(name)
    for i in range(50):
        vhost.declare_queue(f"zz-{i}", None)
    assert asyncio.run(listed()) == sorted(vhost.queues)


def test_the_queue_list_reads_queues_when_read_and_none_once_deleted():
    core = BrokerCore(ManualClock())
    vhost = core.vhosts.get("/") or core.add_vhost("/")
    for name in ("b", "a", "c"):
        vhost.declare_queue(name, None)
    queues = asyncio.run(QueueIndex().queues([vhost], Slicer()))
    vhost.delete_queue("b")
    assert len(queues) == 3
    assert [q.name if q is not None else None for q in queues] == ["a", None, "c"]
    assert queues[-1] is vhost.queues["c"] and queues[0:2][1] is None


def test_the_rate_sampler_forgets_deleted_queues_and_sums_the_rest():
    from leveret.management.rates import RateSampler

    core = BrokerCore(ManualClock())
    vhost = core.vhosts.get("/") or core.add_vhost("/")
    for i in range(100):  # several steps of the sampler
        vhost.declare_queue(f"q{i}", None).counters.published = i
    sampler = RateSampler(core)
    sampler.sample()
    assert len(sampler.queues) == 100
    vhost.delete_queue("q7")
    vhost.declare_queue("q7", None)  # declared again: counts anew
    vhost.delete_queue("q8")
    sampler.sample()
    assert ("/", "q8") not in sampler.queues and len(sampler.queues) == 99
    assert sampler.queues[("/", "q7")][0] is vhost.queues["q7"]
    assert sampler.vhosts["/"][-1][1]["publish"] == sum(range(100)) - 7 - 8


def test_the_name_index_loses_no_change_when_two_listings_overlap(monkeypatch):
    """A listing merging many changes in slices, and another one meanwhile: the index
    ends up with every queue (the second must not work from the first's old list)."""
    monkeypatch.setattr("leveret.management.queue_index.FEW", 5)
    core = BrokerCore(ManualClock())
    vhost = core.vhosts.get("/") or core.add_vhost("/")
    names = [f"q{i:04d}" for i in range(300)]
    for name in names:
        vhost.declare_queue(name, None)
    index = QueueIndex()

    async def race() -> list[str]:
        await index.names(vhost, Slicer(seconds=0))
        for name in names[:50]:  # many changes: merged in slices, a turn after each
            vhost.delete_queue(name)
        first = asyncio.create_task(index.names(vhost, Slicer(seconds=0)))
        await asyncio.sleep(0)  # the first listing is inside its merge
        vhost.declare_queue("zz-late", None)
        await index.names(vhost, Slicer(seconds=0))
        await first
        return await index.names(vhost, Slicer(seconds=0))

    assert asyncio.run(race()) == sorted(vhost.queues)
