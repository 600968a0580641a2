"""The memory alarm and memory pressure, decided from resident memory given by hand."""

from __future__ import annotations

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.server.memory_monitor import MemoryMonitor, resident_memory, total_memory


def test_pressure_pages_out_then_the_alarm_blocks_publishers_and_both_clear():
    core = BrokerCore(ManualClock())
    core.add_vhost("other")
    alarms: list[bool] = []
    core.alarm_listeners.append(alarms.append)
    used = [400]
    monitor = MemoryMonitor(core, lambda: 1000, paging_ratio=0.5, resident=lambda: used[0])
    monitor.check()
    assert not core.memory_pressure and not core.alarm_active
    used[0] = 600  # over half the watermark: queues page new messages out
    monitor.check()
    assert core.memory_pressure and all(v.memory_pressure for v in core.vhosts.values())
    assert not core.alarm_active
    used[0] = 1100  # over the watermark: publishers are blocked
    monitor.check()
    assert core.alarm_active and alarms == [True]
    assert core.add_vhost("late").memory_pressure  # a vhost made meanwhile pages too
    used[0] = 300
    monitor.check()
    assert not core.memory_pressure and not core.alarm_active and alarms == [True, False]


def test_the_memory_alarm_and_the_disk_alarm_are_raised_and_cleared_apart():
    core = BrokerCore(ManualClock())
    used = [2000]
    monitor = MemoryMonitor(core, lambda: 1000, resident=lambda: used[0])
    monitor.check()
    core.set_alarm(True, "disk")
    used[0] = 10
    monitor.check()
    assert core.alarm_active and core.alarm_sources == {"disk"}  # the disk still says no
    core.set_alarm(False, "disk")
    assert not core.alarm_active


def test_this_machine_reports_its_memory():
    assert total_memory() > 0
    resident = resident_memory()
    assert resident is not None and 0 < resident < total_memory()
