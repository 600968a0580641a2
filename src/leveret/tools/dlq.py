"""Browse, replay and purge dead-letter queues of a running broker (``leveret dlq``).

Works over AMQP with :mod:`leveret.amqp.client`, against leveret or RabbitMQ; listing queues needs the
management HTTP API (``leveret server --http-port``, or RabbitMQ's on 15672).

Replay is crash-safe: each dead letter is republished with publisher confirms and only
then acknowledged, so a crash mid-replay can duplicate a message but never lose one.
The replayed message keeps its ``x-death`` history and carries ``x-replay-count``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pamqp.commands import Basic

from ..amqp.client import AMQPError, Channel, ChannelError, Connection, safe_url
from ..amqp.field_table import Long

DEFAULT_PATTERN = r"^(leveret\.DLQ|DLQ\..+)$"


class DLQError(RuntimeError):
    """A clear, user-facing failure (unreachable broker, missing queue, refused login)."""


@dataclass
class DeadLetter:
    """One message of a DLQ, with its death record decoded."""

    delivery_tag: int
    body: bytes
    properties: Basic.Properties
    headers: dict = field(default_factory=dict)

    @property
    def deaths(self) -> list[dict]:
        return [d for d in self.headers.get("x-death") or [] if isinstance(d, dict)]

    @property
    def reason(self) -> str:
        return _text(
            self.headers.get("x-first-death-reason")
            or (self.deaths[-1].get("reason") if self.deaths else "")
            or ""
        )

    @property
    def original_queue(self) -> str:
        return _text(self.headers.get("x-first-death-queue") or "")

    def origin(self) -> tuple[str, str]:
        """(exchange, routing key) the message was first published to, from the oldest
        x-death entry (RabbitMQ writes the newest first)."""
        if not self.deaths:
            raise DLQError("message has no x-death header: cannot tell where it came from")
        first = self.deaths[-1]
        keys = first.get("routing-keys") or [""]
        exchange = self.headers.get("x-first-death-exchange", first.get("exchange", ""))
        return _text(exchange), _text(keys[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[Channel]:
    """A channel to ``url``; DLQError with the URL (password hidden) if it fails."""
    try:
        connection = await Connection.connect(url, name="leveret dlq")
        channel = await connection.channel()
    except AMQPError as exc:
        raise DLQError(f"cannot connect to {safe_url(url)}: {exc}") from None
    try:
        yield channel
    finally:
        await connection.close()


def list_queues(
    http_url: str, user: str = "guest", password: str = "guest", pattern: str = DEFAULT_PATTERN
) -> list[dict]:
    """Queues whose name matches ``pattern``, from the management API ``/api/queues``."""
    request = urllib.request.Request(http_url.rstrip("/") + "/api/queues")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            queues = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DLQError(f"cannot read queues from {http_url}: {exc}") from None
    regex = re.compile(pattern)
    return [q for q in queues if regex.search(q["name"])]


def browse(url: str, queue: str, limit: int | None = None) -> list[DeadLetter]:
    """Up to ``limit`` messages of ``queue``, left in place (they are requeued when the
    channel closes, so their ``redelivered`` flag is set). Raises DLQError."""
    return asyncio.run(_browse(url, queue, limit))


async def _browse(url: str, queue: str, limit: int | None) -> list[DeadLetter]:
    found: list[DeadLetter] = []
    async with connect(url) as channel:
        await _check_queue(channel, queue)
        async for letter in _fetch(channel, queue):
            found.append(letter)
            if limit is not None and len(found) >= limit:
                break
    return found


async def _check_queue(channel: Channel, queue: str) -> int:
    try:
        declared = await channel.queue_declare(queue, passive=True)
    except ChannelError as exc:
        raise DLQError(f"no queue '{queue}': {exc.reply_text}") from None
    return declared.message_count or 0


async def _fetch(channel: Channel, queue: str) -> AsyncIterator[DeadLetter]:
    while True:
        delivery = await channel.get(queue, no_ack=False)
        if delivery is None:
            return
        yield DeadLetter(
            delivery.delivery_tag, delivery.body, Basic.Properties(**delivery.props), dict(delivery.headers)
        )


Matcher = Callable[[DeadLetter], bool]


def matcher(reason: str | None = None, headers: dict[str, str] | None = None) -> Matcher:
    """A filter on the first death's reason and on header values (compared as text)."""

    def matches(letter: DeadLetter) -> bool:
        if reason is not None and letter.reason != reason:
            return False
        return all(_text(letter.headers.get(k, "")) == v for k, v in (headers or {}).items())

    return matches


def replay(
    url: str,
    queue: str,
    matches: Matcher = lambda letter: True,
    limit: int | None = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    progress: Callable[[int], None] = lambda n: None,
) -> int:
    """Republish matching dead letters, each confirmed before it is acknowledged.

    Goes to ``exchange``/``routing_key`` when given, else where the message was first
    published (its death record). Non-matching messages stay in the DLQ. Returns how
    many were replayed; raises DLQError if the broker refuses a republish (nack or
    return), leaving that message in the DLQ.
    """
    return asyncio.run(_replay(url, queue, matches, limit, exchange, routing_key, progress))


async def _replay(
    url: str,
    queue: str,
    matches: Matcher,
    limit: int | None,
    exchange: str | None,
    routing_key: str | None,
    progress: Callable[[int], None],
) -> int:
    replayed = 0
    async with connect(url) as channel:
        total = await _check_queue(channel, queue)
        publisher = await channel.connection.channel()
        await publisher.confirm_select(on_nack="record")
        seen = 0
        async for letter in _fetch(channel, queue):
            seen += 1
            if seen > total or (limit is not None and replayed >= limit):
                break  # only what was there when we started; the rest stays
            if not matches(letter):
                continue
            target_exchange, target_key = letter.origin() if exchange is None else ("", "")
            if exchange is not None:
                target_exchange, target_key = exchange, routing_key or ""
            elif routing_key is not None:
                target_key = routing_key
            headers = dict(letter.headers)
            headers["x-replay-count"] = int(headers.get("x-replay-count", 0)) + 1
            if isinstance(headers.get("x-death"), list):  # counts stay longs, as RabbitMQ
                headers["x-death"] = [_long_count(d) for d in headers["x-death"]]
            properties = letter.properties
            properties.headers = headers
            try:
                publisher.publish(target_exchange, target_key, letter.body, properties, mandatory=True)
                await publisher.wait_confirms(0)
            except AMQPError as exc:
                raise DLQError(
                    f"replay of a message to exchange '{target_exchange}' with "
                    f"routing key '{target_key}' failed: {exc}"
                ) from None
            if publisher.nacked or publisher.returned:
                why = "nacked" if publisher.nacked else "unroutable (returned)"
                raise DLQError(
                    f"replay of a message to exchange '{target_exchange}' with "
                    f"routing key '{target_key}' was refused: {why}"
                )
            channel.ack(letter.delivery_tag)
            replayed += 1
            progress(replayed)
    return replayed


def _long_count(death: Any) -> Any:
    if isinstance(death, dict) and type(death.get("count")) is int:
        return {**death, "count": Long(death["count"])}
    return death


def purge(url: str, queue: str) -> int:
    """Delete every message of ``queue``; returns how many. Raises DLQError."""
    return asyncio.run(_purge(url, queue))


async def _purge(url: str, queue: str) -> int:
    async with connect(url) as channel:
        await _check_queue(channel, queue)
        return await channel.queue_purge(queue)
