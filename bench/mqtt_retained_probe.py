"""Probe of MQTT retained messages at scale (leveret.protocol.mqtt.state): 100,000
retained topics in one vhost, then ``retained_matching`` for filters with and without
wildcards, against a scan of every topic with ``topics.matches`` (what a plain dict
would need), and the cost of keeping them in the store (retain, then a restart).

    PYTHONPATH=src python bench/mqtt_retained_probe.py [--topics 100000] [--no-store]

Prints CPU microseconds (``time.process_time``, this process only) per call, the
matches found, and the RSS the retained messages add. Runs in a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.protocol.mqtt.state import MqttState, RetainedMessage, SessionRecord, SubscriptionOptions
from leveret.protocol.mqtt.topics import matches
from leveret.store.sqlite import SQLiteStore

NOW = 1_700_000_000.0


def topic_names(count: int) -> list[str]:
    """``site/S/building/B/floor/F/sensor/N``: 10 sites x 10 buildings x 10 floors x
    ``count / 1000`` sensors."""
    per_floor = max(count // 1000, 1)
    return [
        f"site/{s}/building/{b}/floor/{f}/sensor/{n}"
        for s in range(10)
        for b in range(10)
        for f in range(10)
        for n in range(per_floor)
    ][:count]


FILTERS = [
    "site/3/building/4/floor/5/sensor/42",  # no wildcard: a dict lookup
    "site/3/building/4/floor/5/sensor/+",
    "site/+/building/4/floor/5/sensor/42",
    "+/+/+/+/+/+/sensor/7",
    "site/3/#",
    "#",
]


def cpu_us(fn, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - started) / repeat * 1e6


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def retain_all(state: MqttState, names: list[str]) -> float:
    """Retain a 100-byte message on each topic of vhost ``/``; returns the CPU seconds."""
    started = time.process_time()
    for name in names:
        state.retain("/", RetainedMessage(name, b"x" * 100, 1))
    return time.process_time() - started


def open_state(data_dir: str, loop: asyncio.AbstractEventLoop) -> tuple[SQLiteStore, MqttState]:
    """A broker core on the SQLite store in ``data_dir`` (started on ``loop``, so what it
    holds is loaded) and its MQTT state."""
    store = SQLiteStore(data_dir)
    core = BrokerCore(ManualClock(NOW))
    core.attach_store(store)
    store.start(loop)
    return store, MqttState.of(core)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--no-store", action="store_true", help="in memory only (no SQLite part)")
    args = parser.parse_args()
    names = topic_names(args.topics)
    core = BrokerCore(ManualClock(NOW))
    before = rss_kib()
    state = MqttState.of(core)
    built = retain_all(state, names)
    print(
        f"{len(names)} retained topics (100 B payloads): {built / len(names) * 1e6:.1f} µs CPU per retain "
        f"(in memory), RSS +{(rss_kib() - before) / 1024:.0f} MiB"
    )
    print(f"{'filter':40} {'matches':>8} {'index µs':>10} {'scan µs':>10}")
    for topic_filter in FILTERS:
        found = len(state.retained_matching("/", topic_filter, NOW))
        repeat = 2000 if found < 200 else max(3, 20_000 // found)
        index = cpu_us(lambda f=topic_filter: state.retained_matching("/", f, NOW), repeat)
        scan = cpu_us(lambda f=topic_filter: [t for t in names if matches(f, t)], 3)
        print(f"{topic_filter:40} {found:8} {index:10.1f} {scan:10.0f}")
    if args.no_store:
        return
    with tempfile.TemporaryDirectory(prefix="leveret-retained-") as data_dir:
        loop = asyncio.new_event_loop()
        store, state = open_state(data_dir, loop)
        queued = retain_all(state, names)
        wall = time.monotonic()
        future = loop.create_future()
        state.when_durable(future.set_result)
        assert loop.run_until_complete(future)
        print(
            f"stored: {queued / len(names) * 1e6:.1f} µs CPU per retain on the loop, all durable "
            f"{time.monotonic() - wall:.2f} s later (wall)"
        )
        store.close()
        started = time.process_time()
        store, state = open_state(data_dir, loop)
        assert state.retained_count("/") == len(names)
        print(f"restart: {len(names)} retained loaded in {time.process_time() - started:.2f} s CPU")
        subscriptions = {f"site/{i}/#": SubscriptionOptions(2) for i in range(20)}
        record = SessionRecord("/", "probe", 3600, subscriptions)
        state.save_session(record)
        started = time.process_time()
        for packet_id in range(1, 10_001):  # a PUBREC then a PUBREL's release, per message
            record.awaiting_rel.add(packet_id)
            state.save_session(record)
            record.awaiting_rel.discard(packet_id)
            state.save_session(record)
        print(
            f"QoS 2 state of a session with 20 subscriptions: "
            f"{(time.process_time() - started) / 20_000 * 1e6:.1f} µs CPU per save_session"
        )
        store.close()
        loop.close()


if __name__ == "__main__":
    main()
