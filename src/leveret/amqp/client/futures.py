"""Settling the futures callers wait on, once."""

from __future__ import annotations

import asyncio
from typing import Any


def resolve(waiter: asyncio.Future | None, value: Any = None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)


def fail(waiter: asyncio.Future | None, exc: BaseException) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_exception(exc)
