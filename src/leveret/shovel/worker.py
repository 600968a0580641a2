"""One running shovel: consume from the source broker, publish to the destination,
acknowledge at the source when the ack mode says so; reconnect after any failure.

The AMQP client is aiormq (pamqp underneath, as the broker). With ``on-confirm`` a
source message is acked only after the destination confirmed it, so a kill of either
side loses nothing: unacked source messages go back to their queue when the
connection drops, and are shovelled again (duplicates are possible, loss is not).
Messages are published in the order they were delivered (aiormq serialises publishes
on a channel). As in RabbitMQ, the message keeps its properties; aiormq gives one
without a ``message_id`` a random one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands

from .spec import ShovelSpec

log = logging.getLogger("leveret.shovel")

CONNECT_TIMEOUT = 10.0  # seconds to connect and open a channel


class Shovel:
    """Runs ``spec`` (named ``vhost``/``name``) on the event loop from :meth:`start`
    until :meth:`stop`. ``local_uri`` is this broker's own ``amqp://`` (what
    ``amqp://`` with no host means); ``on_finished`` is called once a
    ``src-delete-after`` count has been moved (the shovel then deletes itself).

    ``state`` is RabbitMQ's: ``starting``, ``running``, ``terminated`` (with
    ``reason``, until the next attempt after ``reconnect-delay`` seconds)."""

    def __init__(
        self,
        vhost: str,
        name: str,
        spec: ShovelSpec,
        local_uri: Callable[[], str],
        on_finished: Callable[[Shovel], None] | None = None,
        kind: str = "dynamic",
    ) -> None:
        self.vhost, self.name, self.spec, self.kind = vhost, name, spec, kind
        self._local_uri = local_uri
        self._on_finished = on_finished
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()  # epoch seconds of the last state change
        self.forwarded = 0  # messages moved (acked at the source, or sent with no-ack)
        self._length = 0  # the source queue's length at the start (src-delete-after queue-length)
        self.src_uri = self.dest_uri = ""
        self._task: asyncio.Task | None = None
        self._connections: list[Any] = []
        # a cancellation that aiormq turns into its own error must still stop the loop
        self._stopped = False

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop moving messages and close both connections (unacked source messages go
        back to their queue)."""
        self._stopped = True
        task, self._task = self._task, None
        # aiormq may absorb a cancellation (while connecting, say) and go on: cancel
        # again until the task is done
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        await self._close()

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        attempt = 0
        while not self._stopped:
            spec = self.spec
            self.src_uri = spec.src_uris[attempt % len(spec.src_uris)]
            self.dest_uri = spec.dest_uris[attempt % len(spec.dest_uris)]
            attempt += 1
            self._set("starting")
            try:
                if await self._session():
                    self._set("terminated", "src-delete-after reached")
                    if self._on_finished is not None:
                        self._on_finished(self)
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of either side: reconnect later
                reason = f"{type(exc).__name__}: {exc}".strip()
                if self.state != "terminated" or self.reason != reason:
                    log.warning("shovel %s in vhost %s: %s; reconnecting", self.name, self.vhost, reason)
                self._set("terminated", reason)
            finally:
                # shielded: a stop arriving now must not leave a connection half-closed
                await asyncio.shield(self._close())
            await asyncio.sleep(spec.reconnect_delay)

    async def _close(self) -> None:
        connections, self._connections = self._connections, []
        await close_all(connections)

    def _uri(self, uri: str) -> str:
        return resolve_local(uri, self._local_uri)

    async def _connect(self, uri: str) -> Any:
        attempt = asyncio.ensure_future(aiormq.connect(self._uri(uri)))
        try:
            connection = await asyncio.wait_for(asyncio.shield(attempt), CONNECT_TIMEOUT)
        except BaseException:  # timed out or stopped: the handshake is abandoned
            # cancelled, aiormq closes its socket; one that completed meanwhile is closed
            attempt.add_done_callback(close_when_made)
            attempt.cancel()
            raise
        self._connections.append(connection)
        return connection

    # -- one connected session ------------------------------------------------------------------
    async def _session(self) -> bool:
        """Move messages until a connection fails (raises) or a ``src-delete-after``
        count is reached (True)."""
        spec = self.spec
        source = await self._connect(self.src_uri)
        destination = await self._connect(self.dest_uri)
        dest = await destination.channel(publisher_confirms=spec.ack_mode == "on-confirm")
        src = await source.channel(publisher_confirms=False)
        if spec.dest_queue is not None and not spec.dest_predeclared:
            await _ensure_queue(destination, spec.dest_queue)
        if spec.src_queue is not None:
            if not spec.src_predeclared:
                await _ensure_queue(source, spec.src_queue)
            queue = spec.src_queue
        else:
            assert spec.src_exchange is not None
            declared = await src.queue_declare("", exclusive=True, auto_delete=True)
            queue = declared.queue
            await src.queue_bind(queue, spec.src_exchange, routing_key=spec.src_exchange_key)
        remaining: int | None = None  # messages still to move before the shovel ends
        if spec.delete_after == "queue-length":
            if self.forwarded == 0:
                declared = await src.queue_declare(queue, passive=True)
                self._length = declared.message_count
            remaining = self._length - self.forwarded
        elif isinstance(spec.delete_after, int):
            remaining = spec.delete_after - self.forwarded
        if remaining is not None and remaining <= 0:
            return True
        # no-ack with a count would take every queued message and drop those past the
        # count: acks then, right after each publish (as on-publish)
        no_ack = spec.ack_mode == "no-ack" and remaining is None
        prefetch = spec.prefetch_count
        if remaining is not None:
            prefetch = min(prefetch or remaining, remaining)
        if prefetch and not no_ack:
            await src.basic_qos(prefetch_count=prefetch)
        finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        taken = moved = 0  # deliveries accepted, and moved, in this session

        async def forward(message: DeliveredMessage) -> None:
            nonlocal taken, moved
            if self._stopped:  # stopping: left unacked, it goes back to its queue
                return
            tag = getattr(message.delivery, "delivery_tag", 0)
            if remaining is not None and taken >= remaining:  # past the count: leave it
                await src.basic_reject(tag, requeue=True)
                return
            taken += 1
            exchange, routing_key = self._address(message)
            confirm = await dest.basic_publish(
                message.body, exchange=exchange, routing_key=routing_key, properties=self._properties(message)
            )
            if spec.ack_mode == "on-confirm" and not isinstance(confirm, commands.Basic.Ack):
                taken -= 1  # comes back
                await src.basic_nack(tag, requeue=True)
                return
            if not no_ack:
                await src.basic_ack(tag)
            self.forwarded += 1
            moved += 1
            if remaining is not None and moved >= remaining and not finished.done():
                finished.set_result(True)

        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_cancel(frame: Any) -> None:  # the source queue was deleted, say
            if not cancelled.done():
                cancelled.set_result(None)

        src.on_consumer_cancel_callbacks.add(on_cancel)
        if self._stopped:  # a stop whose cancellation aiormq absorbed
            raise asyncio.CancelledError
        await src.basic_consume(queue, forward, no_ack=no_ack, arguments=spec.src_consumer_args or None)
        self._set("running")
        log.info("shovel %s in vhost %s: running, %s -> %s", self.name, self.vhost, queue, self._target())
        # a channel closed by either broker (a missing exchange, a deleted queue) ends
        # the session as a connection's loss does: reconnect after reconnect-delay
        closed = [asyncio.ensure_future(c.closing) for c in (source, destination, src, dest)]
        closed.append(cancelled)
        try:
            done, _ = await asyncio.wait([finished, *closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in closed:
                future.cancel()
        if finished in done:
            return True
        if cancelled in done:
            raise ConnectionError("the source broker cancelled the consumer")
        raise_closed(done)

    def _properties(self, message: DeliveredMessage) -> Any:
        """The message's properties, with what the definition adds: ``x-shovelled``
        (``add-forward-headers``), ``x-shovelled-timestamp``
        (``dest-add-timestamp-header``), ``dest-publish-properties``."""
        properties = message.header.properties
        spec = self.spec
        if not (spec.add_forward_headers or spec.add_timestamp_header or spec.publish_properties):
            return properties
        headers: dict[str, Any] = dict(properties.headers or {})
        if spec.add_forward_headers:
            entry = {
                "shovelled-by": "leveret",
                "shovel-type": self.kind,
                "shovel-name": self.name,
                "shovel-vhost": self.vhost,
                "src-uri": redact_uri(self.src_uri),
                "dest-uri": redact_uri(self.dest_uri),
            }
            if spec.src_queue is not None:
                entry["src-queue"] = spec.src_queue
            headers["x-shovelled"] = [*headers.get("x-shovelled", []), entry]
        if spec.add_timestamp_header:
            headers["x-shovelled-timestamp"] = int(time.time())
        properties.headers = headers
        for key, value in spec.publish_properties.items():
            setattr(properties, key, value)
        return properties

    def _address(self, message: DeliveredMessage) -> tuple[str, str]:
        """Where a message goes: ``dest-queue`` through the default exchange, or
        ``dest-exchange`` with ``dest-exchange-key`` (else the message's own key), or,
        with neither, the exchange and key it was published with."""
        spec = self.spec
        if spec.dest_queue is not None:
            return "", spec.dest_queue
        key = spec.dest_exchange_key if spec.dest_exchange_key is not None else message.routing_key or ""
        if spec.dest_exchange is not None:
            return spec.dest_exchange, key
        return message.exchange or "", key

    def _target(self) -> str:
        spec = self.spec
        if spec.dest_queue is not None:
            return f"queue {spec.dest_queue}"
        return f"exchange {spec.dest_exchange or '(as published)'}"

    def status(self) -> dict[str, Any]:
        """RabbitMQ's ``/api/shovels`` row for this shovel."""
        row: dict[str, Any] = {
            "name": self.name,
            "vhost": self.vhost,
            "type": self.kind,
            "state": self.state,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
            "src_uri": redact_uri(self.src_uri),
            "dest_uri": redact_uri(self.dest_uri),
            "src_protocol": "amqp091",
            "dest_protocol": "amqp091",
            "messages_forwarded": self.forwarded,
        }
        if self.spec.src_queue is not None:
            row["src_queue"] = self.spec.src_queue
        else:
            row["src_exchange"] = self.spec.src_exchange
            row["src_exchange_key"] = self.spec.src_exchange_key
        if self.spec.dest_queue is not None:
            row["dest_queue"] = self.spec.dest_queue
        elif self.spec.dest_exchange is not None:
            row["dest_exchange"] = self.spec.dest_exchange
        if self.reason is not None and self.state == "terminated":
            row["reason"] = self.reason
        return row


async def close_all(connections: list[Any]) -> None:
    """Close each aiormq connection of ``connections`` (5 seconds at most each; one the
    broker closed already is passed over)."""
    for connection in connections:
        try:
            await asyncio.wait_for(connection.close(), 5)
        except Exception:  # already gone
            pass


def close_when_made(attempt: asyncio.Future) -> None:
    if not attempt.cancelled() and attempt.exception() is None:
        _closing.add(asyncio.ensure_future(attempt.result().close()))
        for future in list(_closing):
            if future.done():
                _closing.discard(future)


_closing: set[asyncio.Future] = set()  # closes of abandoned connections, kept referenced


async def _ensure_queue(connection: Any, queue: str) -> None:
    """RabbitMQ's shovel: a queue that exists is used as it is; a missing one is
    declared as a durable classic queue with no arguments (a passive declare on a
    channel of its own finds out, since a 404 closes that channel)."""
    probe = await connection.channel(publisher_confirms=False)
    try:
        await probe.queue_declare(queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        declare = await connection.channel(publisher_confirms=False)
        await declare.queue_declare(queue, durable=True)
        await declare.close()
        return
    await probe.close()


def resolve_local(uri: str, local_uri: Callable[[], str]) -> str:
    """``uri``, or this broker (``local_uri()``) where it is ``amqp://`` with no host
    (``amqp:///vhost`` keeps its vhost), as RabbitMQ's shovels and federation read it."""
    if not uri.startswith("amqp://") or uri[len("amqp://") :].split("/", 1)[0]:
        return uri
    vhost = uri[len("amqp://") :].partition("/")[2]
    local = local_uri()
    return local.rsplit("/", 1)[0] + "/" + vhost if vhost else local


def raise_closed(done: Iterable[asyncio.Future]) -> NoReturn:
    """Raise ConnectionError with the broker's reason (404 NOT_FOUND ...) from the first
    of ``done`` (the close futures of connections and channels) that gave one, else
    "a connection or channel was closed"."""
    for future in done:
        if not future.cancelled() and future.exception() is not None:
            raise ConnectionError(str(future.exception()))
        if future.result() is not None:
            raise ConnectionError(str(future.result()))
    raise ConnectionError("a connection or channel was closed")


def redact_uri(uri: str) -> str:
    """A URI without its password (as RabbitMQ's shovel status shows it)."""
    if "@" not in uri or "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
