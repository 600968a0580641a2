"""The login throttle on a stepped clock: leaky buckets of failures per address and per
user name, the cap of unauthenticated connections per address, bounded memory."""

from __future__ import annotations

import pytest

from leveret.config import ConfigError, load
from leveret.core.clock import ManualClock
from leveret.core.login_throttle import LoginThrottle, ThrottleSettings, source_of

SETTINGS = ThrottleSettings(
    address_burst=3, address_interval=0.5, user_burst=5, user_interval=1.0, max_unauthenticated=4, max_keys=10
)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def throttle(clock):
    return LoginThrottle(clock, SETTINGS)


def test_failures_past_the_burst_are_answered_one_interval_apart(throttle):
    delays = [throttle.failed("10.0.0.1", f"u{i}") for i in range(6)]  # a new user each time
    assert delays == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]
    assert throttle.failed("10.0.0.2", "v") == 0.0  # another address has its own bucket


def test_concurrent_failures_take_successive_slots_so_parallel_is_no_faster_than_sequential(clock, throttle):
    # 20 failures at the same instant: answered at the same times 20 sequential ones
    # (each sent when the previous was answered) would be
    parallel = [throttle.failed("10.0.0.1", None) for _ in range(20)]
    sequential_clock = ManualClock()
    sequential = LoginThrottle(sequential_clock, SETTINGS)
    for _ in range(20):
        sequential_clock.advance(sequential.failed("10.0.0.1", None))  # the next once answered
    assert parallel[-1] == pytest.approx(sequential_clock.now - ManualClock().now) == 8.5
    assert parallel == sorted(parallel)


def test_the_bucket_drains_at_its_rate_and_a_quiet_address_starts_afresh(clock, throttle):
    for _ in range(3):
        throttle.failed("10.0.0.1", None)
    assert throttle.failed("10.0.0.1", None) == 0.5
    clock.advance(0.5)  # one slot drained: the next failure waits one interval
    assert throttle.failed("10.0.0.1", None) == pytest.approx(0.5)
    clock.advance(10)
    assert [throttle.failed("10.0.0.1", None) for _ in range(3)] == [0.0] * 3


def test_a_successful_login_wipes_nothing(throttle):
    # there is no "succeeded": interleaved right passwords leave the buckets as they were
    assert not hasattr(throttle, "succeeded")
    for _ in range(4):
        throttle.failed("10.0.0.1", "guest")
    assert throttle.throttled("10.0.0.1")
    assert throttle.connection_opened("10.0.0.1")
    throttle.connection_settled("10.0.0.1")  # the right password: logged in
    assert throttle.failed("10.0.0.1", "guest") == 1.0


def test_guesses_for_one_user_from_many_addresses_are_slowed_by_the_user_bucket(throttle):
    delays = [throttle.failed(f"10.0.1.{i}", "alice") for i in range(8)]  # each address once
    assert delays == [0.0] * 5 + [1.0, 2.0, 3.0]
    assert throttle.failed("10.0.1.200", "bob") == 0.0  # another user
    assert throttle.failures(user="alice") == pytest.approx(8.0)


def test_a_refusal_waits_for_the_later_of_its_two_slots(throttle):
    for i in range(5):
        throttle.failed(f"10.0.2.{i}", "carol")  # the user's burst spent from elsewhere
    assert throttle.failed("10.0.0.9", "carol") == 1.0  # its address is fresh; the user is not
    assert throttle.failed("10.0.0.9", "dave") == 0.0  # and the address bucket was charged once


def test_unauthenticated_connections_are_capped_per_address_and_pending_refusals_count(clock, throttle):
    assert all(throttle.connection_opened("10.0.0.1") for _ in range(4))
    assert not throttle.connection_opened("10.0.0.1")  # the fifth is refused
    assert throttle.connection_opened("10.0.0.2")  # per address
    throttle.connection_settled("10.0.0.1")
    assert throttle.connection_opened("10.0.0.1")
    # refusals not yet due keep their place even once their connections are gone
    for _ in range(4):
        throttle.connection_settled("10.0.0.1")
    for _ in range(3 + 4):
        throttle.failed("10.0.0.1", None)  # the last 4 are answered 0.5 .. 2.0 s later
    assert throttle.unauthenticated("10.0.0.1") == 4
    assert not throttle.connection_opened("10.0.0.1") and not throttle.may_check("10.0.0.1")
    assert throttle.room_in("10.0.0.1") == 0.5
    clock.advance(0.5)  # the first refusal is due: room for one
    assert throttle.may_check("10.0.0.1") and throttle.connection_opened("10.0.0.1")
    assert not throttle.connection_opened("10.0.0.1")
    clock.advance(2)
    assert throttle.unauthenticated("10.0.0.1") == 1


def test_memory_is_bounded_by_max_keys(throttle):
    for i in range(1000):
        throttle.failed(f"10.1.{i // 256}.{i % 256}", f"user{i}")
    assert len(throttle._addresses) == len(throttle._users) == 10
    assert len(throttle._due) <= 10
    throttle.failed("10.9.9.9", "x" * 100_000)
    assert max(len(key) for key in throttle._users._tat) <= 255


def test_refused_connections_are_reported_once_a_minute_per_address(clock, throttle):
    assert throttle.report("10.0.0.1") and not throttle.report("10.0.0.1")
    assert throttle.report("10.0.0.2")
    clock.advance(60)
    assert throttle.report("10.0.0.1")


def test_ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4(throttle):
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert source_of("::ffff:10.0.0.1") == "10.0.0.1" and source_of("10.0.0.1") == "10.0.0.1"
    assert source_of("fe80::1%eth0") == "fe80::/64" and source_of("") == ""
    # one host rotating through its /64 gets one address's burst, not one per address
    delays = [throttle.failed(f"2001:db8:1:2::{i:x}", None) for i in range(5)]
    assert delays == [0.0, 0.0, 0.0, 0.5, 1.0]
    assert throttle.failed("2001:db8:1:3::1", None) == 0.0  # the next /64 is another source


def test_the_login_throttle_table_of_a_config_file(tmp_path):
    path = tmp_path / "leveret.toml"
    path.write_text("[login_throttle]\naddress_burst = 2\naddress_interval = 1\nmax_unauthenticated = 8\n")
    settings = load(path)
    expected = ThrottleSettings(address_burst=2, address_interval=1.0, max_unauthenticated=8)
    assert settings.login_throttle == expected
    assert settings.build_core(ManualClock()).login_throttle.settings == settings.login_throttle
    path.write_text("")
    assert load(path).login_throttle == ThrottleSettings()


@pytest.mark.parametrize(
    "table, message",
    [
        ("adress_burst = 2", "unknown key login_throttle.adress_burst"),
        ("address_burst = 1.5", "login_throttle.address_burst must be int"),
        ("user_interval = true", "login_throttle.user_interval must be float"),
        ("user_interval = 0", "must be above 0 seconds"),
        ("max_unauthenticated = 0", "must be 1 or more"),
    ],
)
def test_a_bad_login_throttle_setting_is_refused_with_its_name(tmp_path, table, message):
    path = tmp_path / "leveret.toml"
    path.write_text(f"[login_throttle]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        load(path)
