"""core.consumer_timeout's deadlines on a ManualClock: a delivery is reported no earlier
than its timeout and at most its group's granularity later, one timer per group, marks
bounded by the timeout, settled deliveries never reported; and the queue settings."""

from __future__ import annotations

import pytest

from leveret.core.clock import ManualClock
from leveret.core.consumer_timeout import MAX_LATENESS, MIN_LATENESS, Deadlines, granularity
from leveret.core.errors import PreconditionFailed
from leveret.core.queues.features import build


class Channel:
    """What an adapter gives Deadlines: its unacknowledged tags and their group."""

    def __init__(self, clock: ManualClock) -> None:
        self.unacked: dict[int, str] = {}
        self.tag = 0
        self.expired: list[tuple[float, str, list[int]]] = []
        self.clock = clock
        self.deadlines = Deadlines(clock, self.unacked.get, self.on_expired, lambda: self.tag)

    def on_expired(self, key, tags) -> None:
        self.expired.append((self.clock.now, key, tags))
        for tag in tags:
            del self.unacked[tag]

    def deliver(self, key: str, timeout_ms: int) -> int:
        self.tag += 1
        self.unacked[self.tag] = key
        self.deadlines.delivered(key, timeout_ms, self.tag)
        return self.tag


def test_granularity_is_a_64th_of_the_timeout_within_bounds():
    assert granularity(64.0) == 1.0
    assert granularity(1800.0) == MAX_LATENESS
    assert granularity(0.0) == MIN_LATENESS


def test_never_early_at_most_the_granularity_late():
    clock = ManualClock()
    ch = Channel(clock)
    start = clock.now
    tags = []
    for _ in range(100):  # one every 10 ms for a second
        tags.append(ch.deliver("a", 64_000))
        clock.advance(0.01)
    clock.advance(64 - 1 + 0.005)  # the first is due at +64 s: not reported before it
    assert ch.expired == [] or ch.expired[0][0] - start >= 64
    clock.advance(3)
    reported = [tag for _, _, tags in ch.expired for tag in tags]
    assert reported == tags
    for when, _, group in ch.expired:
        for tag in group:
            delivered = start + 0.01 * (tag - 1)
            assert 64 <= when - delivered <= 64 + granularity(64) + 1e-9


def test_settled_deliveries_are_never_reported_and_one_timer_per_group():
    clock = ManualClock()
    ch = Channel(clock)
    for _ in range(1000):
        tag = ch.deliver("a", 10_000)
        ch.deliver("b", 20_000)
        del ch.unacked[tag]  # every "a" settles at once
        clock.advance(0.05)
    assert ch.deadlines.pending_timers() == 2
    assert len(ch.deadlines.groups["a"].marks) <= 10 / granularity(10) + 2
    clock.advance(100)
    assert {key for _, key, _ in ch.expired} == {"b"}
    assert len([t for _, _, tags in ch.expired for t in tags]) == 1000
    assert ch.deadlines.pending_timers() == 0


def test_close_cancels_every_timer():
    clock = ManualClock()
    ch = Channel(clock)
    ch.deliver("a", 1000)
    ch.deadlines.close()
    clock.advance(10)
    assert ch.expired == []


def test_rewind_watches_a_restored_delivery_again():
    clock = ManualClock()
    ch = Channel(clock)
    tag = ch.deliver("a", 1000)
    del ch.unacked[tag]  # settled (in a transaction)
    clock.advance(5)
    assert ch.expired == []
    ch.unacked[tag] = "a"  # tx.rollback
    ch.deadlines.rewind("a", 1000, tag)
    clock.advance(2)
    assert [tags for _, _, tags in ch.expired] == [[tag]]


@pytest.mark.parametrize("arguments, policy, expected", [
    ({}, None, (None, None)),
    ({"x-consumer-timeout": 5000}, None, (5000, None)),
    ({"x-consumer-timeout": 5000}, {"consumer-timeout": 3000}, (3000, None)),
    ({"x-consumer-timeout": 2000}, {"consumer-timeout": 3000}, (2000, None)),
    ({}, {"consumer-timeout": 0, "consumer-timeout-mode": "graceful"}, (0, "graceful")),
    ({"x-consumer-timeout-mode": "close"}, {"consumer-timeout-mode": "graceful"}, (None, "close")),
])
def test_queue_settings(arguments, policy, expected):
    config = build(arguments, policy, " for queue 'q' in vhost '/'")
    assert (config.consumer_timeout, config.consumer_timeout_mode) == expected


@pytest.mark.parametrize("policy", [{"consumer-timeout": -5}, {"consumer-timeout": "x"},
                                    {"consumer-timeout-mode": "off"}])
def test_invalid_policy_values_are_refused_at_declaration(policy):
    with pytest.raises(PreconditionFailed):
        build({}, policy, " for queue 'q' in vhost '/'")


def test_the_config_file_and_the_cli_set_the_broker_wide_timeout(tmp_path):
    from click.testing import CliRunner

    from leveret.cli.server import server
    from leveret.config import ConfigError, Settings, load

    path = tmp_path / "leveret.toml"
    path.write_text("[server]\nconsumer_timeout = 0\n")
    assert load(path).limits.consumer_timeout == 0
    assert Settings().limits.consumer_timeout == 1_800_000  # RabbitMQ's 30 minutes
    path.write_text("[server]\nconsumer_timeout = -1\n")
    with pytest.raises(ConfigError, match="consumer_timeout"):
        load(path)
    result = CliRunner().invoke(server, ["--consumer-timeout", "-5"])
    assert result.exit_code == 2 and "--consumer-timeout" in result.output
