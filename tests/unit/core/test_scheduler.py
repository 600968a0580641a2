"""The scheduler on a manual clock: ActiveMQ's delay, period, repeat and cron rounds,
delivery order, cancelling, and the headers a delivery carries."""

from __future__ import annotations

import datetime
import gc

import pytest

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.core.errors import PreconditionFailed
from leveret.core.message import Message, Properties
from leveret.core.scheduler import Schedule, schedule_from_headers

MINUTE = 60.0


def setup() -> tuple[BrokerCore, ManualClock]:
    # start on a whole minute of local time, so cron matches are easy to reason about
    start = datetime.datetime(2026, 11, 23, 10, 0, 0).astimezone().timestamp()
    clock = ManualClock(start)
    core = BrokerCore(clock)
    core.vhosts["/"].declare_queue("jobs", owner=None)
    return core, clock


def schedule(core: BrokerCore, body: str, headers: dict) -> None:
    job = schedule_from_headers(headers)
    assert job is not None
    message = Message.build("", "jobs", body.encode(), Properties(headers=headers, message_id=body))
    core.scheduler.schedule("/", "", message, job, body, tag_deliveries=True)


def drain(core: BrokerCore) -> list[str]:
    queue = core.vhosts["/"].queues["jobs"]
    taken = []
    while (entry := queue.get()) is not None:
        taken.append(entry.message.body.decode())
        queue.ack(entry)
    return taken


def test_delay_then_period_and_repeat_give_n_plus_one_deliveries():
    core, clock = setup()
    schedule(
        core, "tick", {"AMQ_SCHEDULED_DELAY": 1000, "AMQ_SCHEDULED_PERIOD": 500, "AMQ_SCHEDULED_REPEAT": 2}
    )
    clock.advance(0.999)
    assert drain(core) == []
    clock.advance(0.001)
    assert drain(core) == ["tick"]
    clock.advance(0.5)
    clock.advance(0.5)
    assert drain(core) == ["tick", "tick"]
    clock.advance(10)
    assert drain(core) == [] and core.scheduler.pending == 0


def test_jobs_fire_in_due_order_and_a_cancelled_one_never():
    core, clock = setup()
    for name, delay in (("c", 300), ("a", 100), ("gone", 150), ("b", 200)):
        schedule(core, name, {"AMQ_SCHEDULED_DELAY": delay})
    assert core.scheduler.cancel("gone") is True
    assert core.scheduler.cancel("gone") is False
    assert [job.job_id for job in core.scheduler.jobs()] == ["a", "b", "c"]
    clock.advance(1)
    assert drain(core) == ["a", "b", "c"]


def test_repeat_minus_one_goes_on_until_cancelled():
    core, clock = setup()
    schedule(core, "beat", {"AMQ_SCHEDULED_PERIOD": 125, "AMQ_SCHEDULED_REPEAT": -1})
    clock.advance(0)
    assert drain(core) == ["beat"]  # no delay: the first at once
    for _ in range(40):
        clock.advance(0.125)
    assert len(drain(core)) == 40
    core.scheduler.cancel("beat")
    clock.advance(5)
    assert drain(core) == []


def test_cron_rounds_of_delay_period_and_repeat():
    core, clock = setup()
    # every 5 minutes; each round: 1 s after the match, then 2 more, 10 s apart
    schedule(
        core,
        "round",
        {
            "AMQ_SCHEDULED_CRON": "*/5 * * * *",
            "AMQ_SCHEDULED_DELAY": 1000,
            "AMQ_SCHEDULED_PERIOD": 10_000,
            "AMQ_SCHEDULED_REPEAT": 2,
        },
    )
    clock.advance(4 * MINUTE)
    assert drain(core) == []
    clock.advance(MINUTE + 1)  # 10:05:01
    assert drain(core) == ["round"]
    clock.advance(20)  # 10:05:21
    assert drain(core) == ["round", "round"]
    clock.advance(4 * MINUTE)  # the next round starts at 10:10
    assert drain(core) == []
    clock.advance(MINUTE - 20)  # 10:10:01
    assert drain(core) == ["round"]
    (info,) = core.scheduler.jobs()
    assert info.cron == "*/5 * * * *"


def test_a_delivery_carries_the_job_id_and_loses_the_schedule_headers():
    core, clock = setup()
    schedule(core, "m1", {"AMQ_SCHEDULED_DELAY": 10, "AMQ_SCHEDULED_REPEAT": 0, "kept": "yes"})
    clock.advance(1)
    entry = core.vhosts["/"].queues["jobs"].get()
    assert entry is not None
    assert entry.message.headers == {"kept": "yes", "scheduledJobId": "m1"}


@pytest.mark.parametrize(
    "headers",
    [{"AMQ_SCHEDULED_DELAY": "soon"}, {"AMQ_SCHEDULED_CRON": "* * *"}, {"AMQ_SCHEDULED_CRON": "0 0 * * * *"}],
)
def test_headers_that_do_not_parse_are_refused(headers):
    with pytest.raises(PreconditionFailed):
        schedule_from_headers(headers)


def test_headers_without_a_schedule_schedule_nothing():
    assert schedule_from_headers({"AMQ_SCHEDULED_REPEAT": 3}) is None
    assert schedule_from_headers({"AMQ_SCHEDULED_DELAY": 0}) is None
    assert schedule_from_headers({"AMQ_SCHEDULED_DELAY": b"250"}) == Schedule(
        250,
        headers={
            "AMQ_SCHEDULED_DELAY": None,
            "AMQ_SCHEDULED_PERIOD": None,
            "AMQ_SCHEDULED_REPEAT": None,
            "AMQ_SCHEDULED_CRON": None,
        },
    )


def test_repeating_for_ever_needs_a_period():
    with pytest.raises(PreconditionFailed, match="AMQ_SCHEDULED_PERIOD"):
        schedule_from_headers({"AMQ_SCHEDULED_DELAY": 1, "AMQ_SCHEDULED_REPEAT": -1})


def test_cancelled_jobs_do_not_pile_up_in_memory():
    core, _clock = setup()
    for i in range(500):
        schedule(core, f"job{i}", {"AMQ_SCHEDULED_DELAY": 86_400_000})
        assert core.scheduler.cancel(f"job{i}")
    assert core.scheduler.pending == 0
    assert len(core.scheduler._due) == len(core.scheduler._memory) == 0


def test_jobs_in_memory_cost_the_garbage_collector_nothing():
    """A job in memory is a tuple of plain values, which CPython's cyclic collector
    stops tracking once it has looked at it: a window of jobs adds nothing to a full
    collection's pause."""
    core, clock = setup()
    for i in range(100):
        schedule(core, f"job{i}", {"AMQ_SCHEDULED_DELAY": 1000 + i, "AMQ_SCHEDULED_PERIOD": 10_000,
                                   "AMQ_SCHEDULED_REPEAT": 1})
    clock.advance(1.2)  # every job delivered once and rescheduled: new rows
    assert len(drain(core)) == 100 and core.scheduler.pending == 100
    gc.collect()
    scheduler = core.scheduler
    assert len(scheduler._memory) == 100
    assert not any(gc.is_tracked(row) for row in scheduler._memory.values())
    assert not any(gc.is_tracked(key) for key in scheduler._due)
