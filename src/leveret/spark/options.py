"""Options of the ``leveret`` Spark data source: case-insensitive, validated, and
every error names the option (:class:`OptionError`)."""

from __future__ import annotations

from typing import Any

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
            known = ", ".join(sorted(names.get(k, k) for k in allowed - {"path",
                                                                          "checkpointlocation"}))
            raise OptionError(f"leveret {direction}: unknown option(s) {shown}; "
                              f"known options: {known}")

    def str(self, name: str, default: str | None = None) -> str | None:
        value = self.raw.get(name.lower())
        return default if value is None else str(value)

    def int(self, name: str, default: int | None = None, minimum: int = 0) -> int | None:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = int(str(value).strip())
        except ValueError:
            raise OptionError(f"leveret option {name}: expected an integer, got {value!r}") \
                from None
        if number < minimum:
            raise OptionError(f"leveret option {name}: must be >= {minimum}, got {number}")
        return number

    def float(self, name: str, default: float) -> float:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = float(str(value).strip())
        except ValueError:
            raise OptionError(f"leveret option {name}: expected a number, got {value!r}") \
                from None
        if number <= 0:
            raise OptionError(f"leveret option {name}: must be > 0, got {value!r}")
        return number

    def bool(self, name: str, default: bool) -> bool:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise OptionError(f"leveret option {name}: expected true or false, got {value!r}")


CANONICAL = ["url", "timeout", "exchange", "routingKey", "persistent", "jobId",
              "confirmWindow", "queue", "stream", "group", "startingOffset", "endingOffset",
              "partitionSize", "maxOffsetsPerTrigger", "maxMessagesPerTrigger", "leaseTtlMs",
              "leaseFrom", "leaseTo", "prefetch", "idleTimeout", "limit", "path",
              "checkpointLocation"]


def connect(url: str, timeout: float) -> BlockingClient:
    try:
        return BlockingClient(url, timeout=timeout)
    except AMQPError as exc:
        raise OptionError(f"leveret option url: {exc}") from None

