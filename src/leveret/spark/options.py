"""Options of the ``leveret`` Spark data source: case-insensitive, validated, and
every error names the option (:class:`OptionError`)."""

from __future__ import annotations

from typing import Any, overload

from ..amqp.client import AMQPError, BlockingClient

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

#: options every direction takes (``path`` is what ``load(path)``/``save(path)`` set)
COMMON_OPTIONS = {"url", "timeout", "path"}


class OptionError(ValueError):
    """A bad option of the ``leveret`` data source; the message names it."""


# -- options -------------------------------------------------------------------------


class Options:
    """Case-insensitive, validated view of the data source's options."""

    def __init__(self, options: Any, allowed: set[str], direction: str) -> None:
        self.raw = {str(k).lower(): v for k, v in dict(options).items()}
        unknown = sorted(k for k in self.raw if k not in allowed)
        if unknown:
            names = {n.lower(): n for n in CANONICAL}
            shown = ", ".join(names.get(k, k) for k in unknown)
            known = ", ".join(sorted(names.get(k, k) for k in allowed - {"path", "checkpointlocation"}))
            raise OptionError(f"leveret {direction}: unknown option(s) {shown}; known options: {known}")

    @overload
    def text(self, name: str, default: str) -> str: ...

    @overload
    def text(self, name: str, default: None = None) -> str | None: ...

    def text(self, name: str, default: str | None = None) -> str | None:
        """Option ``name`` as text, or ``default``."""
        value = self.raw.get(name.lower())
        return default if value is None else str(value)

    @overload
    def integer(self, name: str, default: int, minimum: int = 0) -> int: ...

    @overload
    def integer(self, name: str, default: None = None, minimum: int = 0) -> int | None: ...

    def integer(self, name: str, default: int | None = None, minimum: int = 0) -> int | None:
        """Option ``name`` as an integer of at least ``minimum``, or ``default``;
        OptionError otherwise."""
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = int(str(value).strip())
        except ValueError:
            raise OptionError(f"leveret option {name}: expected an integer, got {value!r}") from None
        if number < minimum:
            raise OptionError(f"leveret option {name}: must be >= {minimum}, got {number}")
        return number

    def number(self, name: str, default: float) -> float:
        """Option ``name`` as a positive number, or ``default``; OptionError otherwise."""
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = float(str(value).strip())
        except ValueError:
            raise OptionError(f"leveret option {name}: expected a number, got {value!r}") from None
        if number <= 0:
            raise OptionError(f"leveret option {name}: must be > 0, got {value!r}")
        return number

    def flag(self, name: str, default: bool) -> bool:
        """Option ``name`` as true/false (also 1/0, yes/no), or ``default``."""
        value = self.raw.get(name.lower())
        if value is None:
            return default
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise OptionError(f"leveret option {name}: expected true or false, got {value!r}")


CANONICAL = [
    "url",
    "timeout",
    "exchange",
    "routingKey",
    "persistent",
    "jobId",
    "confirmWindow",
    "queue",
    "stream",
    "group",
    "startingOffset",
    "endingOffset",
    "partitionSize",
    "maxOffsetsPerTrigger",
    "maxMessagesPerTrigger",
    "leaseTtlMs",
    "leaseFrom",
    "leaseTo",
    "prefetch",
    "idleTimeout",
    "limit",
    "path",
    "checkpointLocation",
]


def connect(url: str, timeout: float) -> BlockingClient:
    """A client of the broker at ``url``; OptionError naming the option if it cannot
    connect (``timeout`` in seconds)."""
    try:
        return BlockingClient(url, timeout=timeout)
    except AMQPError as exc:
        raise OptionError(f"leveret option url: {exc}") from None
