"""Loaded by a broker started with this directory on ``PYTHONPATH`` and
``LEVERET_STALL_LOG=FILE`` (``bench/management_scale.py --trace``): logs every
event-loop callback that ran longer than ``LEVERET_STALL_MS`` (20 ms) and every
garbage collection longer than 10 ms, as ``<monotonic s> <kind> <ms> <what>`` lines,
so a client's gap can be put down to its cause. uvloop is disabled (its callbacks
cannot be timed from Python): the broker runs on asyncio's own loop.
"""

from __future__ import annotations

import os
import sys
import time

_LOG = os.environ.get("LEVERET_STALL_LOG")
if _LOG:
    import asyncio.events
    import gc

    sys.modules["uvloop"] = None  # type: ignore[assignment]
    _out = open(_LOG, "a", buffering=1)  # noqa: SIM115
    _limit = float(os.environ.get("LEVERET_STALL_MS", "20")) / 1000
    _run = asyncio.events.Handle._run

    def _timed(self: asyncio.events.Handle) -> None:
        start = time.perf_counter()
        _run(self)
        took = time.perf_counter() - start
        if took > _limit:
            callback = self._callback
            what = repr(callback)
            task = getattr(callback, "__self__", None)
            if task is not None and hasattr(task, "get_coro"):
                coro = task.get_coro()
                frame = getattr(coro, "cr_frame", None)
                name = getattr(coro, "__qualname__", coro)
                what = f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}" if frame else repr(coro)
            _out.write(f"{time.monotonic():.3f} loop {took * 1000:.1f} {what[:200]}\n")

    asyncio.events.Handle._run = _timed  # type: ignore[method-assign]
    _started: list[float] = [0.0]

    def _collected(phase: str, info: dict) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        took = time.perf_counter() - _started[0]
        if took > 0.01:
            _out.write(f"{time.monotonic():.3f} gc {took * 1000:.1f} generation {info['generation']}\n")

    gc.callbacks.append(_collected)
