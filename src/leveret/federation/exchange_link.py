"""Exchange federation: one link moves what is published to an upstream exchange into
the downstream (this broker's) exchange of the same name, for the routing keys the
downstream's bindings ask for, as RabbitMQ 3.10's ``rabbitmq_federation`` does.

On the upstream, over AMQP 0-9-1 (aiormq, as the shovels), the link declares what
RabbitMQ's downstream declares, with the same names and arguments, so a RabbitMQ
upstream or downstream interoperates:

- the queue ``federation: X -> NODE`` (durable; ``x-expires`` and ``x-message-ttl``
  from the upstream's ``expires``/``message-ttl`` in milliseconds, ``x-internal-purpose``
  ``federation``; ``X`` the upstream exchange, ``NODE`` this broker's cluster name, then
  ``:DOWNSTREAM`` when the downstream exchange has another name, ``:VHOST:DOWNSTREAM``
  when the vhost differs), consumed with ``prefetch-count``;
- the upstream exchange itself, when a passive declare finds none, declared as the
  downstream one is (type, durable, auto-delete, internal, arguments);
- the internal exchange ``federation: X -> NODE A`` (or ``B``: a restarted link
  declares the other one, binds it, then deletes the old one, so nothing is missed
  meanwhile) of type ``x-federation-upstream`` (``x-max-hops``,
  ``x-downstream-name``, ``x-downstream-vhost``: the upstream drops what exceeds the
  hops or has been here; :class:`leveret.core.exchange_types.FederationUpstreamExchange`),
  or ``fanout`` on an upstream that does not know the type (503), bound to the queue;
- one exchange-to-exchange binding from the upstream exchange to the internal one per
  distinct (routing key, arguments) among the downstream exchange's bindings, with an
  ``x-bound-from`` argument (``cluster-name``, ``vhost``, ``exchange``, ``hops``) so a
  binding travels as far as messages can (``max-hops``) and no further round a cycle;
  kept in step as downstream bindings come and go (core's binding listeners).

Each message is republished to the downstream exchange with its routing key through
this broker's core (:class:`~.local_publish.LocalPublisher`, as RabbitMQ's direct
connection: no AMQP connection to itself), an entry (``uri`` without credentials, ``exchange``,
``redelivered``, the upstream's ``cluster-name`` and ``vhost``) put first in its
``x-received-from`` header; ``user_id`` is dropped unless ``trust-user-id``. Ack modes:
``on-confirm`` acks upstream once this broker confirmed (nack, requeued, when it
nacks), ``on-publish`` right after publishing, ``no-ack`` consumes without acks; the
acks of one event-loop turn go as one ``basic.ack multiple=True``
(:class:`~.acks.UpstreamAcks`). A
message that has made ``max-hops`` hops or has been here already is acked and dropped
(the upstream may be a fanout that did not filter). Any failure ends the session; the
base :class:`~.links.Link` retries after ``reconnect-delay``.

What differs from RabbitMQ: the A/B suffix is remembered in memory only (RabbitMQ
stores it with the exchange); a restarted broker finds the one in use on the upstream
by passive declares and replaces it as a restarted link does. The internal exchange
is checked every :data:`CHECK_INTERVAL` seconds as RabbitMQ's
``internal_exchange_check_interval`` default.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands, encode as pamqp_encode

from ..amqp import methods as _relaxed_names  # noqa: F401  (pamqp then takes federation's names)
from ..amqp.field_table import Long
from ..core.exchange_base import Exchange, freeze
from ..core.exchange_types import RECEIVED_FROM, already_seen
from ..shovel.worker import raise_closed
from .acks import UpstreamAcks
from .links import Link
from .local_publish import LocalPublisher
from .upstream import policy_upstreams

if TYPE_CHECKING:
    from ..core.exchange_base import Binding

log = logging.getLogger("leveret.federation")

#: RabbitMQ's names and values.
UPSTREAM_EXCHANGE_TYPE = "x-federation-upstream"
BOUND_FROM = "x-bound-from"
INTERNAL_PURPOSE = {"x-internal-purpose": "federation"}
CHECK_INTERVAL = 90.0  # seconds between checks that the internal exchange still exists


def upstream_queue_name(
    upstream_exchange: str, upstream_vhost: str, vhost: str, exchange: str, node: str
) -> str:
    """``federation: X -> NODE`` and the downstream's name when it differs (RabbitMQ's
    ``upstream_queue_name``)."""
    if vhost != upstream_vhost:
        tail = f":{vhost}:{exchange}"
    elif exchange != upstream_exchange:
        tail = f":{exchange}"
    else:
        tail = ""
    return f"federation: {upstream_exchange} -> {node}{tail}"


def uri_vhost(uri: str) -> str:
    """The vhost an AMQP URI names (its path, unquoted; none: ``/``)."""
    path = urlsplit(uri).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def without_credentials(uri: str) -> str:
    """The URI without user, password and query (TLS file names, a key's ``password``),
    as RabbitMQ 3.10 writes it in ``x-received-from`` (``amqp_uri:remove_credentials``)."""
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))


def cluster_name(server_properties: Any) -> str | None:
    """The upstream's ``cluster_name`` server property as text (RabbitMQ's is a binary:
    one that is not UTF-8, which pamqp hands over as bytes, is decoded with
    replacements rather than failing every attempt), None if absent or not text."""
    name = server_properties.get("cluster_name") if isinstance(server_properties, dict) else None
    if isinstance(name, (bytes, bytearray)):
        return bytes(name).decode("utf-8", "replace")
    return name if isinstance(name, str) else None


#: Where RabbitMQ keeps a header it had to replace (``rabbit_basic``'s name).
INVALID_HEADERS = "x-invalid-headers"


def with_hop(headers: dict[str, Any], hop: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with ``hop`` put first in ``x-received-from``, as RabbitMQ's
    ``prepend_table_header``: an ``x-received-from`` that is not an array (sent so by
    a client or another broker) is replaced and kept, first, in the array
    ``x-invalid-headers["x-received-from"]`` rather than lost."""
    received = headers.get(RECEIVED_FROM)
    if isinstance(received, list):
        headers[RECEIVED_FROM] = [hop, *received]
        return headers
    headers[RECEIVED_FROM] = [hop]
    if received is not None:
        invalid = headers.get(INVALID_HEADERS)
        if isinstance(invalid, dict):
            kept = invalid.get(RECEIVED_FROM)
            invalid = {**invalid, RECEIVED_FROM: [received, *kept] if isinstance(kept, list) else [received]}
        elif invalid is None:
            invalid = {RECEIVED_FROM: [received]}
        else:  # not a table either: kept inside the new one, as RabbitMQ does
            invalid = {RECEIVED_FROM: [received], INVALID_HEADERS: invalid}
        headers[INVALID_HEADERS] = invalid
    return headers


def should_forward(received_from: Any, max_hops: int, node: str, vhost: str) -> bool:
    """Whether a message with this ``x-received-from`` value may enter ``vhost`` of
    ``node`` over a link with ``max_hops`` (RabbitMQ's ``should_forward``)."""
    if not isinstance(received_from, list):
        return True
    return len(received_from) < max_hops and not already_seen(received_from, node, vhost)


#: The A/B suffix in use per (core, vhost, exchange, upstream): rabbit_federation_db's.
_SUFFIXES_KEY = "federation_exchange_suffixes"


class ExchangeLink(Link):
    """Federates downstream exchange ``name`` of ``vhost`` from one upstream (see the
    module doc). ``core`` (set by the manager before :meth:`start`) is this broker: its
    exchange's bindings are read and followed."""

    kind = "exchange"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: distinct (routing key, arguments) bound upstream -> the destinations asking
        self._bound: dict[tuple, set[tuple[str, str]]] = {}
        self._suffix = "A"
        self._upstream_name: str | None = None  # the upstream's cluster_name, if it says
        #: (upstream URI, queue, internal exchange) once declared upstream
        self._declared: tuple[str, str, str] | None = None

    # -- life cycle -------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop the link; when the exchange is no longer federated from this upstream
        (policy or upstream removed, exchange or vhost deleted), also delete the
        upstream queue and internal exchange, as RabbitMQ 3.10 does on a link's clean
        shutdown. Unlike 3.10, a broker shutdown (the exchange still federated) keeps
        them, so what is published meanwhile waits in the upstream queue."""
        await super().stop()
        declared, self._declared = self._declared, None
        if declared is None or not self._unfederated():
            return
        uri, queue, internal = declared
        try:
            await asyncio.wait_for(self._disposable(uri, lambda ch: _forget(ch, queue, internal)), 10)
        except Exception as exc:  # the upstream is away: the queue expires (x-expires) if set
            log.warning(
                "federation link %s -> %s: upstream queue left: %s", self.upstream.name, self.name, exc
            )

    def _unfederated(self) -> bool:
        core = self.core
        vhost = core.vhosts.get(self.vhost) if core is not None else None
        if vhost is None or self.name not in vhost.exchanges:
            return True
        definition = vhost.policy_for(self.name, "exchanges")
        upstreams = policy_upstreams(core.parameters, self.vhost, definition) if core is not None else []
        return all(upstream.name != self.upstream.name for upstream in upstreams)

    # -- names ----------------------------------------------------------------------
    @property
    def upstream_exchange(self) -> str:
        return self.upstream.exchange or self.name

    def _suffixes(self) -> dict[tuple[str, str, str], str]:
        assert self.core is not None
        found: dict[tuple[str, str, str], str] = self.core.adapter_settings.setdefault(_SUFFIXES_KEY, {})
        return found

    # -- one session ------------------------------------------------------------------
    async def _session(self) -> None:
        core, upstream = self.core, self.upstream
        if core is None:
            raise RuntimeError("exchange link started without its broker")
        vhost = core.vhosts.get(self.vhost)
        exchange = vhost.exchanges.get(self.name) if vhost is not None else None
        if exchange is None:
            raise LookupError(f"no exchange '{self.name}' in vhost '{self.vhost}'")
        uri = self.upstream_uri()
        remote = await self._connect(uri)
        self._upstream_name = cluster_name(remote.server_properties)
        upstream_vhost = uri_vhost(uri)
        channel = await remote.channel(publisher_confirms=False)
        command = await remote.channel(publisher_confirms=False)
        # into this broker through core, not over AMQP to itself (local_publish.py)
        downstream = LocalPublisher(
            core,
            self.vhost,
            confirms=upstream.ack_mode == "on-confirm",
            node=self.node,
            connection_name=self.connection_name(vhost, "exchanges"),
        )
        self._connections.append(downstream)  # closed with the connections
        self.local_connection = downstream.name  # its direct connection (direct.py)
        queue = upstream_queue_name(self.upstream_exchange, upstream_vhost, self.vhost, self.name, self.node)
        await self._consume(channel, downstream, queue, without_credentials(self.uri), upstream_vhost)
        await self._ensure_upstream_exchange(remote, channel, exchange)
        key = (self.vhost, self.name, upstream.name)
        suffixes = self._suffixes()
        old = suffixes.get(key) or await _live_suffix(remote, queue)
        self._suffix = "B" if old == "A" else "A"
        internal = f"{queue} {self._suffix}"
        await _delete_exchange(remote, internal)
        await self._declare_internal(uri, channel, internal)
        await channel.queue_bind(queue, internal, routing_key="")
        self._declared = (uri, queue, internal)
        suffixes[key] = self._suffix
        # bindings: what there is now, then every change, played in order
        self._bound = {}
        changes: asyncio.Queue[tuple[str, Binding]] = asyncio.Queue()
        for binding in list(exchange.bindings.values()):
            changes.put_nowait(("bind", binding))

        def follow(vhost_name: str, event: str, binding: Binding) -> None:
            if vhost_name == self.vhost and binding.source is exchange:
                changes.put_nowait((event, binding))

        core.binding_listeners.append(follow)
        player = asyncio.ensure_future(self._play(changes, command, internal, upstream_vhost))
        checker: asyncio.Future | None = None
        closed = [asyncio.ensure_future(c.closing) for c in (remote, channel, command, downstream)]
        try:
            synced = asyncio.ensure_future(changes.join())
            done, _ = await asyncio.wait([synced, player, *closed], return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            if synced in done:
                await _delete_exchange(remote, f"{queue} {old}")
                self._set("running")
                log.info("federation link %s -> %s (%s): running", upstream.name, self.name, self.vhost)
                checker = asyncio.ensure_future(self._check(uri, internal))
                done, _ = await asyncio.wait([player, checker, *closed], return_when=asyncio.FIRST_COMPLETED)
            raise_closed(done)
        finally:
            if follow in core.binding_listeners:
                core.binding_listeners.remove(follow)
            for future in (player, checker, *closed):
                if future is not None:
                    future.cancel()

    async def _consume(
        self, channel: Any, downstream: Any, queue: str, shown_uri: str, upstream_vhost: str
    ) -> None:
        """Declare the upstream queue and move each delivery to the downstream exchange."""
        upstream = self.upstream
        arguments: dict[str, Any] = {}
        if upstream.expires is not None:
            arguments["x-expires"] = upstream.expires
        if upstream.message_ttl is not None:
            arguments["x-message-ttl"] = upstream.message_ttl
        arguments.update(INTERNAL_PURPOSE)
        if upstream.queue_type != "classic":
            arguments["x-queue-type"] = upstream.queue_type
        await channel.queue_declare(queue, durable=True, arguments=arguments)
        no_ack = upstream.ack_mode == "no-ack"
        if not no_ack:
            await channel.basic_qos(prefetch_count=upstream.prefetch_count)
        trust, ack_mode, max_hops = upstream.trust_user_id, upstream.ack_mode, upstream.max_hops
        node, vhost, target, source = self.node, self.vhost, self.name, self.upstream_exchange

        acks = UpstreamAcks(channel)  # one basic.ack multiple=True per loop turn (acks.py)

        async def forward(message: DeliveredMessage) -> None:
            if self._stopped:  # stopping: left unacked, it goes back to its queue
                return
            delivery = message.delivery
            tag = getattr(delivery, "delivery_tag", 0)
            properties = _Properties.copy(message.header.properties)
            headers = dict(properties.headers or {})
            received = headers.get(RECEIVED_FROM)
            if not should_forward(received, max_hops, node, vhost):
                if not no_ack:
                    acks.ack(tag)
                return
            hop: dict[str, Any] = {
                "uri": shown_uri,
                "exchange": source,
                "redelivered": bool(getattr(delivery, "redelivered", False)),
            }
            if self._upstream_name is not None:
                hop["cluster-name"] = self._upstream_name
            hop["vhost"] = upstream_vhost
            properties.headers = with_hop(headers, hop)
            if not trust:
                properties.user_id = None
            confirm = await downstream.basic_publish(
                message.body,
                exchange=target,
                routing_key=getattr(delivery, "routing_key", ""),
                properties=properties,
            )
            if ack_mode == "on-confirm":
                if isinstance(confirm, commands.Basic.Ack):
                    acks.ack(tag)
                    self.forwarded += 1
                else:
                    await channel.basic_nack(tag, requeue=True)
                    acks.settled(tag)
                return
            if not no_ack:
                acks.ack(tag)
            self.forwarded += 1

        await channel.basic_consume(queue, forward, no_ack=no_ack)

    async def _ensure_upstream_exchange(self, remote: Any, channel: Any, exchange: Exchange) -> None:
        """A passive declare of the upstream exchange on a channel of its own; missing
        (404), declared as the downstream exchange is."""
        probe = await remote.channel(publisher_confirms=False)
        try:
            await probe.exchange_declare(self.upstream_exchange, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            await channel.exchange_declare(
                self.upstream_exchange,
                exchange_type=exchange.type,
                durable=exchange.durable,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
                arguments=dict(exchange.arguments),
            )
            return
        await probe.close()

    def _internal_arguments(self) -> dict[str, Any]:
        _encode_long()
        return {
            "x-max-hops": Long(self.upstream.max_hops),
            "x-downstream-name": self.node,
            "x-downstream-vhost": self.vhost,
            **INTERNAL_PURPOSE,
        }

    def _declare_upstream(self, name: str, passive: bool = False) -> Any:
        """For :meth:`_disposable`: declare (``passive``: only check) the internal
        ``x-federation-upstream`` exchange ``name``."""
        return lambda ch: ch.exchange_declare(
            name,
            exchange_type=UPSTREAM_EXCHANGE_TYPE,
            passive=passive,
            durable=True,
            internal=True,
            auto_delete=True,
            arguments=self._internal_arguments(),
        )

    async def _declare_internal(self, uri: str, channel: Any, name: str) -> None:
        """Declare the internal ``x-federation-upstream`` exchange on a connection of its
        own (an unknown type closes the connection: 503); refused so, a ``fanout``."""
        try:
            await self._disposable(uri, self._declare_upstream(name))
        except aiormq.exceptions.ConnectionCommandInvalid:
            await channel.exchange_declare(
                name,
                exchange_type="fanout",
                durable=True,
                internal=True,
                auto_delete=True,
                arguments=dict(INTERNAL_PURPOSE),
            )

    async def _disposable(self, uri: str, call: Any) -> Any:
        connection = await self._connect(uri)
        try:
            channel = await connection.channel(publisher_confirms=False)
            return await call(channel)
        finally:
            if connection in self._connections:
                self._connections.remove(connection)
            try:
                await asyncio.wait_for(connection.close(), 5)
            except Exception:  # already closed by the broker
                pass

    async def _check(self, uri: str, internal: str) -> None:
        """Every :data:`CHECK_INTERVAL` seconds, a passive declare of the internal
        exchange; returns (ending the session) once it is gone."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                await self._disposable(uri, self._declare_upstream(internal, passive=True))
            except aiormq.exceptions.ChannelNotFoundEntity:
                log.warning(
                    "federation link %s -> %s: upstream exchange %s is gone",
                    self.upstream.name,
                    self.name,
                    internal,
                )
                return
            except Exception as exc:  # a check that could not be made: try again later
                log.warning("federation link %s -> %s: check failed: %s", self.upstream.name, self.name, exc)

    # -- bindings ------------------------------------------------------------------------
    async def _play(
        self, changes: asyncio.Queue[tuple[str, Binding]], channel: Any, internal: str, upstream_vhost: str
    ) -> None:
        """Bind and unbind upstream as the downstream bindings change, in order."""
        nowait = self.upstream.bind_nowait
        while True:
            event, binding = await changes.get()
            try:
                order = self._order(event, binding, upstream_vhost)
                if order is not None:
                    routing_key, arguments = order
                    change = channel.exchange_bind if event == "bind" else channel.exchange_unbind
                    await change(
                        internal, self.upstream_exchange, routing_key, arguments=arguments, nowait=nowait
                    )
            finally:
                changes.task_done()

    def _order(self, event: str, binding: Binding, upstream_vhost: str) -> tuple[str, dict] | None:
        """What to (un)bind upstream for this downstream change, or None: the first
        binding of a (key, arguments) binds it, the last one's removal unbinds it; a
        binding made by another link (``x-bound-from``) passes on, one hop less."""
        arguments = binding.arguments
        if not isinstance(arguments.get(BOUND_FROM), list):
            key = (binding.routing_key, freeze(arguments))
            kind = "exchange" if isinstance(binding.destination, Exchange) else "queue"
            destination = (kind, binding.destination.name)
            asking = self._bound.get(key)
            if event == "bind":
                if asking is not None:
                    asking.add(destination)
                    return None
                self._bound[key] = {destination}
            else:
                if asking is None:
                    return None
                asking.discard(destination)
                if asking:
                    return None
                del self._bound[key]
        bound = self._bound_from(arguments, upstream_vhost)
        return None if bound is None else (binding.routing_key, bound)

    def _bound_from(self, arguments: dict, upstream_vhost: str) -> dict | None:
        """The binding's arguments with this hop first in ``x-bound-from``; None when
        the binding must go no further (RabbitMQ's ``update_binding``): hops are the
        upstream's ``max-hops``, or one less than the previous hop's (at most
        ``max-hops``), 0 when the upstream is one the binding came from."""
        max_hops = self.upstream.max_hops
        previous = arguments.get(BOUND_FROM)
        if isinstance(previous, list) and previous:
            first = previous[0] if isinstance(previous[0], dict) else {}
            hops_before = first.get("hops")
            hops_before = hops_before if isinstance(hops_before, int) else 0
            if already_seen(previous, self._upstream_name, upstream_vhost):
                hops = 0
            else:
                hops = min(hops_before - 1, max_hops)
        else:
            previous, hops = [], max_hops
        if hops <= 0:
            return None
        hop = {
            "cluster-name": self.node,
            "vhost": self.vhost,
            "exchange": f"{self.vhost}:{self.name} {self._suffix}",
            "hops": hops,
        }
        return {**arguments, BOUND_FROM: [hop, *previous]}


class _Properties(commands.Basic.Properties):
    """A message's properties as received: aiormq gives a message without a
    ``message_id`` a random one when it publishes, RabbitMQ's federation does not, so
    here ``message_id`` keeps what it was when copied."""

    @classmethod
    def copy(cls, properties: commands.Basic.Properties) -> _Properties:
        copied = cls(**{name: getattr(properties, name) for name in properties.__slots__})
        copied.__dict__["_locked"] = True
        return copied

    @property
    def message_id(self) -> str | None:
        return self.__dict__.get("_message_id")

    @message_id.setter
    def message_id(self, value: str | None) -> None:
        if not self.__dict__.get("_locked"):
            self.__dict__["_message_id"] = value


async def _live_suffix(connection: Any, queue: str) -> str:
    """The suffix of the internal exchange a previous run of this broker left on the
    upstream (``queue A`` or ``queue B``), found by passive declares, since the suffix
    in use is kept in memory only: a restarted downstream must replace that exchange
    only after the other one carries the bindings, or what is published meanwhile is
    unroutable upstream. ``A`` when neither exists, or both (either then routes)."""
    for suffix in ("A", "B"):
        try:
            channel = await connection.channel(publisher_confirms=False)
            await channel.exchange_declare(f"{queue} {suffix}", passive=True)
            await channel.close()
        except aiormq.exceptions.ChannelNotFoundEntity:
            continue
        return suffix
    return "A"


async def _delete_exchange(connection: Any, name: str) -> None:
    """exchange.delete on a channel of its own (whatever the answer)."""
    try:
        channel = await connection.channel(publisher_confirms=False)
        await channel.exchange_delete(name)
        await channel.close()
    except aiormq.exceptions.ChannelClosed:
        pass


async def _forget(channel: Any, queue: str, internal: str) -> None:
    await channel.queue_delete(queue)
    await channel.exchange_delete(internal)


def _encode_long() -> None:
    """Make pamqp (aiormq's encoder) write :class:`~leveret.amqp.field_table.Long` as
    ``l``, the 64-bit type RabbitMQ requires for ``x-max-hops``; pamqp writes a small
    int as ``b``. Other values are encoded as before."""
    original = pamqp_encode.table_integer
    if getattr(original, "leveret_long", False):
        return

    def table_integer(value: int) -> bytes:
        if type(value) is Long:
            return b"l" + pamqp_encode.long_long_int(value)
        return original(value)

    table_integer.leveret_long = True  # type: ignore[attr-defined]
    pamqp_encode.table_integer = table_integer
