"""The data directory lock: one broker per ``--data-dir``."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirLocked(RuntimeError):
    """Another process holds the data directory; the message names it."""


class DataDirLock:
    """An exclusive ``flock`` on ``DIR/leveret.lock``, held while the broker runs.

    Raises DataDirLocked if another broker holds it, OSError (naming the path) if the
    directory cannot be created or written.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / "leveret.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (never waits) and write this process's pid into the file.
        DataDirLocked if another process holds it; OSError if the directory or file
        cannot be made."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(
                f"data directory {self.path.parent} is in use by another leveret (lock file {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (the file stays); nothing happens if it is not held."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
