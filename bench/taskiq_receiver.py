"""A taskiq broker run as its own worker, in this process: the receiver as an asyncio
task (used by bench/frameworks_probe.py and tests/integration/test_taskiq.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from taskiq.api import run_receiver_task


@asynccontextmanager
async def worker(broker: Any, max_async_tasks: int = 10) -> AsyncIterator[Any]:
    """Start ``broker`` as a worker process would (``is_worker_process`` set before
    ``startup``, so it opens its reading connection too), run its receiver (at most
    ``max_async_tasks`` tasks at once) until the block ends, then shut the broker down."""
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(run_receiver_task(broker, max_async_tasks=max_async_tasks))
    try:
        yield broker
    finally:
        receiver.cancel()
        try:
            await receiver
        except asyncio.CancelledError:
            pass
        await broker.shutdown()
