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


def test_memory_freed_in_the_c_heap_is_given_back_once_enough_is_free():
    """MallocTrim trims when the C heap holds ``threshold`` more free bytes than after
    its last trim (glibc), and not again until as much more is freed."""
    import ctypes
    import time

    from leveret.server.malloc_trim import MallocTrim

    trim = MallocTrim(threshold=8 * 1024 * 1024)
    if not trim.available:
        return  # not glibc: nothing to check
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 40 MiB in blocks below the mmap threshold; every other one is freed (20 MiB in the
    # middle of the heap, where free() itself cannot give it back)
    allocated = [libc.malloc(64 * 1024) for _ in range(40 * 16)]
    blocks, keep = allocated[::2], allocated[1::2]
    trim.maybe_trim()
    if trim._thread is not None:
        trim._thread.join(5)
    trims = trim.trims
    for block in blocks:
        libc.free(block)
    free = trim.free_bytes()
    assert free is not None and free - trim.baseline >= trim.threshold
    assert trim.maybe_trim()
    assert trim._thread is not None
    trim._thread.join(5)
    assert trim.trims == trims + 1
    time.sleep(0)
    assert not trim.maybe_trim()  # nothing freed since
    for block in keep:
        libc.free(block)
