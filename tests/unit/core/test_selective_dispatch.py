"""Consumers with JMS selectors on a classic queue, driven through core alone: each gets
only what its selector matches, round-robin among those that match, a backlog of
messages nobody's selector wants never hides the ones behind it (ActiveMQ looks at 200
paged-in messages only), and each message is looked at once per consumer, not at every
dispatch."""

from __future__ import annotations

from leveret.core import BrokerCore, Message
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queues import Queue, QueuedMessage
from leveret.core.queues.classic import SCAN_BUDGET
from leveret.core.selector import Selector, compile_selector


class Counting:
    """A selector that counts how often it is evaluated."""

    def __init__(self, text: str) -> None:
        self.inner: Selector = compile_selector(text)
        self.calls = 0

    def matches(self, lookup) -> bool:
        self.calls += 1
        return self.inner.matches(lookup)


class Consumer:
    def __init__(self, tag: str, selector: str | None = None, prefetch: int = 0, priority: int = 0) -> None:
        self.tag, self.prefetch, self.exclusive, self.no_ack, self.arguments = tag, prefetch, False, False, {}
        self.priority = priority
        self.global_prefetch = 0
        self.selector = Counting(selector) if selector else None
        self.examined = 0
        self.held: list[tuple[Queue, QueuedMessage]] = []

    def can_accept(self) -> bool:
        return not self.prefetch or len(self.held) < self.prefetch

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None:
        self.held.append((queue, entry))

    def cancel_by_broker(self) -> None:
        pass

    def bodies(self) -> list[str]:
        return [entry.message.body.decode() for _, entry in self.held]


def setup() -> Queue:
    core = BrokerCore(ManualClock())
    return core.vhosts["/"].declare_queue("q", owner=None)


def publish(queue: Queue, body: str, **headers) -> None:
    queue.enqueue(Message.build("", "q", body.encode(), Properties(headers=headers)))


def test_each_consumer_gets_what_its_selector_matches_round_robin():
    queue = setup()
    red_a, red_b, blue = (Consumer("a", "color = 'red'"), Consumer("b", "color = 'red'"),
                          Consumer("c", "color = 'blue'"))
    for consumer in (red_a, red_b, blue):
        queue.add_consumer(consumer)
    for i, color in enumerate(["red", "blue", "red", "green", "red", "blue"]):
        publish(queue, f"{color}{i}", color=color)
    assert red_a.bodies() == ["red0", "red4"] and red_b.bodies() == ["red2"]
    assert blue.bodies() == ["blue1", "blue5"]
    assert queue.message_count == 1  # green3: nobody's


def test_a_backlog_nobody_wants_does_not_hide_what_is_behind_it():
    queue = setup()
    for i in range(50_000):
        publish(queue, f"old{i}", kind="old")
    publish(queue, "wanted", kind="new")
    consumer = Consumer("c", "kind = 'new'")
    queue.add_consumer(consumer)
    while not consumer.held and queue.timers._timers:  # the scan resumes turn by turn
        queue.drain()
    assert consumer.bodies() == ["wanted"]
    assert consumer.selector.calls == 50_001  # each message looked at once
    publish(queue, "also wanted", kind="new")
    publish(queue, "not this", kind="old")
    assert consumer.bodies() == ["wanted", "also wanted"]
    assert consumer.selector.calls == 50_003  # the backlog was not looked at again
    assert queue.message_count == 50_001


def test_the_scan_is_bounded_per_turn():
    queue = setup()
    for i in range(SCAN_BUDGET + 10):
        publish(queue, f"old{i}", kind="old")
    publish(queue, "wanted", kind="new")
    consumer = Consumer("c", "kind = 'new'")
    queue.add_consumer(consumer)
    assert consumer.held == [] and consumer.selector.calls == SCAN_BUDGET
    queue.drain()  # the next turn goes on where it stopped
    assert consumer.bodies() == ["wanted"]


def test_a_scan_that_runs_out_of_budget_goes_on_by_itself_every_time():
    queue = setup()
    clock = queue.host.clock
    for round_ in range(3):  # the resume timer must arm again after it has fired
        for i in range(SCAN_BUDGET + 10):
            publish(queue, f"old{round_}-{i}", kind="old")
        publish(queue, f"wanted{round_}", kind="new")
        consumer = Consumer("c", "kind = 'new'")
        queue.add_consumer(consumer)  # a new consumer looks at the whole backlog
        assert consumer.held == []
        for _ in range(round_ + 1):
            clock.advance(0)
        assert consumer.bodies() == [f"wanted{round_}"]
        queue.remove_consumer(consumer)


def test_a_consumer_without_selector_takes_what_selectors_leave():
    queue = setup()
    picky, anything = Consumer("p", "n > 2"), Consumer("any")
    queue.add_consumer(picky)
    queue.add_consumer(anything)
    for n in range(6):
        publish(queue, str(n), n=n)
    assert sorted(picky.bodies() + anything.bodies()) == ["0", "1", "2", "3", "4", "5"]
    assert all(int(body) > 2 for body in picky.bodies())


def test_requeued_messages_are_looked_at_again_and_prefetch_is_respected():
    queue = setup()
    first = Consumer("first", "n >= 0", prefetch=1)
    queue.add_consumer(first)
    for n in range(3):
        publish(queue, str(n), n=n)
    assert first.bodies() == ["0"]
    held_queue, entry = first.held.pop()
    second = Consumer("second", "n = 0")
    queue.add_consumer(second)
    assert second.held == []  # 0 is with the first consumer
    held_queue.requeue([entry])  # it comes back: the second one's selector sees it again
    assert second.bodies() == ["0"]  # served least recently, it goes first
    assert first.bodies() == ["1"]  # and the first, with room again, takes the next
    assert queue.message_count == 1


# -- message groups ------------------------------------------------------------------------
def test_a_message_group_sticks_to_one_consumer_until_it_leaves_or_the_group_closes():
    queue = setup()
    first, second = Consumer("first"), Consumer("second")
    queue.add_consumer(first)
    queue.add_consumer(second)
    for i in range(6):
        publish(queue, f"{'AB'[i % 2]}{i}", JMSXGroupID="AB"[i % 2])
    groups = {consumer.tag: {body[0] for body in consumer.bodies()} for consumer in (first, second)}
    assert sorted(map(sorted, groups.values())) == [["A"], ["B"]]  # one group each, whole
    owner_of_a = first if groups["first"] == {"A"} else second
    other = second if owner_of_a is first else first
    queue.remove_consumer(owner_of_a)
    publish(queue, "A6", JMSXGroupID="A")
    assert other.bodies()[-1] == "A6"  # the group moved with its consumer gone
    third = Consumer("third")
    queue.add_consumer(third)
    publish(queue, "A7", JMSXGroupID="A", JMSXGroupSeq=-1)  # still the owner's; closes the group
    assert other.bodies()[-1] == "A7" and third.bodies() == []
    publish(queue, "A8", JMSXGroupID="A")
    assert third.bodies() == ["A8"]  # served least recently: the closed group may go there


def test_a_group_waits_for_its_busy_consumer_without_blocking_other_messages():
    queue = setup()
    busy, free = Consumer("busy", prefetch=1), Consumer("free")
    queue.add_consumer(busy)
    publish(queue, "g1", JMSXGroupID="g")
    queue.add_consumer(free)
    publish(queue, "g2", JMSXGroupID="g")  # busy is full: g2 waits for it
    publish(queue, "other")
    assert busy.bodies() == ["g1"] and free.bodies() == ["other"]
    held_queue, entry = busy.held.pop()
    held_queue.ack(entry)
    queue.drain()
    assert busy.bodies() == ["g2"]


def test_a_busy_group_does_not_make_every_dispatch_rescan_the_queue():
    """Found by review: 10,500 messages of a group whose consumer is full used to be
    rescanned from the head at every dispatch (a core busy, other messages starved)."""
    queue = setup()
    owner, idle = Consumer("owner", prefetch=1), Consumer("idle")
    queue.add_consumer(owner)
    for i in range(SCAN_BUDGET + 500):
        publish(queue, f"g{i}", JMSXGroupID="G")
    queue.add_consumer(idle)  # looks at the group's messages once (two turns of the budget)
    queue.drain()
    publish(queue, "free")
    assert idle.bodies() == ["free"] and owner.bodies() == ["g0"]
    # the idle consumer's bookmark is past the group's messages: they are not looked at again
    assert idle.examined == SCAN_BUDGET + 500
    publish(queue, "free again")
    assert idle.bodies() == ["free", "free again"] and idle.examined == SCAN_BUDGET + 500


def test_after_a_group_closes_its_skipped_messages_are_looked_at_again():
    """Found by review: a selector consumer skipped a group's message while another
    owned the group, and never looked again after the group closed."""
    queue = setup()
    a, b = Consumer("a", "x = 1"), Consumer("b", "x = 2")
    queue.add_consumer(a)
    queue.add_consumer(b)
    publish(queue, "g1", JMSXGroupID="G", x=1)
    publish(queue, "g2", JMSXGroupID="G", x=2)  # the group is a's: b skips it
    publish(queue, "n3", x=5)
    publish(queue, "g4", JMSXGroupID="G", JMSXGroupSeq=-1, x=1)  # a takes it, the group closes
    publish(queue, "n5", x=2)
    assert a.bodies() == ["g1", "g4"]
    assert b.bodies() == ["g2", "n5"]


def test_a_higher_priority_gets_what_its_selector_matches_and_a_lower_one_the_rest():
    queue = setup()
    low = Consumer("low", "color IS NOT NULL")
    high = Consumer("high", "color = 'red'", priority=5)
    higher_but_full = Consumer("full", prefetch=1, priority=9)
    for consumer in (low, high, higher_but_full):
        queue.add_consumer(consumer)
    assert [c.tag for c in queue.consumers] == ["full", "high", "low"]
    for i, color in enumerate(["red", "blue", "red", "red", "green"]):
        publish(queue, f"{color}{i}", color=color)
    assert higher_but_full.bodies() == ["red0"]  # then its window is full
    assert high.bodies() == ["red2", "red3"]
    assert low.bodies() == ["blue1", "green4"]
    queue.remove_consumer(higher_but_full)
    queue.remove_consumer(high)
    assert queue.prioritized == 0 and list(queue.consumers) == [low]
