"""A check run every ``interval`` seconds on the running event loop: the base of the
resource monitors (disk, memory)."""

from __future__ import annotations

import asyncio


class PeriodicCheck:
    """Subclasses set :attr:`interval` (seconds) and implement :meth:`check`."""

    interval: float = 1.0
    _task: asyncio.Task | None = None

    def check(self) -> None:
        """One check; must not raise for a condition it can report."""
        raise NotImplementedError

    async def _run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        """Check now and then every ``interval`` seconds, on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop checking (what the last check set stays as it is)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
