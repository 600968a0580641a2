"""The broker as a Python object: started in-process (embedded) or by ``leveret server``.

Like ActiveMQ's embedded broker, it needs nothing else running::

    async with Broker(amqp_port=0) as broker:
        ...  # connect to broker.amqp_url

    with BlockingBroker(amqp_port=0) as broker:   # its own thread and event loop
        pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from ssl import SSLContext
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..control_socket import SOCKET_NAME
from ..core.broker import BrokerCore
from ..federation.manager import Federation
from ..management import ManagementAPI
from ..management.runtime import NODE
from ..protocol.mqtt.connection import MqttConnection
from ..protocol.mqtt.sessions import SessionTimers
from ..protocol.stomp import StompConnection
from ..shovel.manager import Shovels
from ..store import DataDirLock, StoreError
from ..store.batched import BatchedStore
from ..store.postgresql import PostgreSQLStore
from ..store.sqlite import SQLiteStore
from .clock import LoopClock
from .control import ControlServer
from .disk_monitor import DiskMonitor
from .event_loop import new_event_loop
from .http_limits import descriptor_limit
from .listener import AnyConnection, Listener
from .memory_monitor import MemoryMonitor
from .standby import StandbyServer
from .tls import TLSError
from .web_amqp import WEB_AMQP
from .web_mqtt import web_mqtt
from .web_stomp import WEB_STOMP
from .websocket import WebSocketServer
from .workers.listener import WorkerListener

if TYPE_CHECKING:
    from ..cluster.node import ClusterNode
    from ..management.metrics import PrometheusServer

log = logging.getLogger("leveret.server")


class Broker:
    """An AMQP broker on ``host:amqp_port`` (0 picks a free port).

    Keyword arguments override :class:`~leveret.config.Settings` fields (``host`` is
    ``bind``; TypeError for an unknown one); ``core`` exposes virtual hosts, queues and
    users to embedding code.
    """

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        self.settings = settings or Settings()
        if "host" in overrides:
            overrides["bind"] = overrides.pop("host")
        for key, value in overrides.items():
            if not hasattr(self.settings, key):
                raise TypeError(f"unknown broker setting {key!r}")
            setattr(self.settings, key, value)
        self.core: BrokerCore = self.settings.build_core(LoopClock())
        #: The AMQP listener: its connections and read coalescing counts.
        settings = self.settings
        if settings.workers > 0:  # connection workers do the AMQP sockets' byte work
            self.listener: Listener = WorkerListener(
                self.core, settings.bind, settings.amqp_port, settings.workers, settings.reuse_port
            )
        else:
            self.listener = Listener(
                self.core,
                settings.bind,
                settings.amqp_port,
                settings.read_coalesce_ms / 1000,
                reuse_port=settings.reuse_port,
            )
        #: A cluster node's own AMQP port for the other nodes' links, when
        #: ``cluster_port`` is set (``--nodes N``: the shared port reaches any node).
        self.peer_listener: Listener | None = None
        #: AMQP over TLS, when ``amqps_port`` is set (its context is made at start):
        #: AMQP 0-9-1 and 1.0, told apart by their protocol headers as on the AMQP port.
        self.tls_listener: Listener | None = None
        #: STOMP, when ``stomp_port`` is set.
        self.stomp_listener: Listener | None = None
        #: MQTT 3.1.1 and 5.0, when ``mqtt_port`` is set.
        self.mqtt_listener: Listener | None = None
        #: MQTT over TLS, when ``mqtts_port`` is set.
        self.mqtts_listener: Listener | None = None
        #: STOMP over WebSocket, when ``web_stomp_port`` is set.
        self.web_stomp: WebSocketServer | None = None
        #: MQTT over WebSocket, when ``web_mqtt_port`` is set.
        self.web_mqtt: WebSocketServer | None = None
        #: AMQP 1.0 over WebSocket, when ``web_amqp_port`` is set.
        self.web_amqp: WebSocketServer | None = None
        self._lock: DataDirLock | None = None
        self.store: BatchedStore | None = None
        #: With a PostgreSQL store: "standby" while waiting for the master lock, then
        #: "master", "fenced" once its database session is lost; None otherwise.
        self.role: str | None = None
        #: Seconds this broker waited as a standby, and took to recover as the master.
        self.standby_seconds = self.recovery_seconds = 0.0
        #: Called (on the loop) when the broker becomes a standby: ``leveret server``
        #: prints a line.
        self.on_standby: Callable[[], None] | None = None
        #: Seconds to stay a standby before the first try for the lock: ``leveret
        #: server`` gives a broker that was fenced a pause, so the standbys go first.
        self.standby_first = 0.0
        self._cancel_standby = threading.Event()
        self._fenced: asyncio.Event | None = None
        self._stopping: asyncio.Future | None = None
        self._started = False  # start() finished
        self._disk_monitor: DiskMonitor | None = None
        self._memory_monitor: MemoryMonitor | None = None
        self._control: ControlServer | None = None
        self.management: ManagementAPI | None = None
        #: The shovels this broker runs (after start).
        self.shovels = Shovels(self.core, self._local_uri)
        #: The federation links this broker runs as a downstream (after start).
        self.federation = Federation(self.core, self._local_uri, self.federation_node)
        #: AMQP's ``cluster_name`` server property names the broker as federation does
        self.core.node_name = self.federation_node
        #: Prometheus metrics, when ``prometheus_port`` is set.
        self.prometheus: PrometheusServer | None = None
        #: The cluster node this broker is (``node_name`` set; docs/cluster.md), after start.
        self.cluster: ClusterNode | None = None

    @property
    def host(self) -> str:
        """The address it listens on (the ``bind`` setting)."""
        return self.settings.bind

    @property
    def amqp_port(self) -> int:
        """The port actually bound (after start)."""
        return self.listener.port

    @property
    def cluster_amqp_port(self) -> int:
        """The AMQP port the other nodes of a cluster reach this node on (after start):
        ``cluster_port``'s when set (``--nodes N``, whose nodes share ``amqp_port``),
        else :attr:`amqp_port`."""
        return self.peer_listener.port if self.peer_listener is not None else self.listener.port

    @property
    def amqp_url(self) -> str:
        """``amqp://guest:guest@host:port/%2F``: the default user on vhost ``/`` (after
        start)."""
        return f"amqp://guest:guest@{self.host}:{self.amqp_port}/%2F"

    async def start(self) -> Broker:
        """Open the store (with ``data_dir``, or ``store_url``: first wait to be the
        master, see :meth:`_become_master`), recover, then listen.

        Raises DataDirLocked if another broker uses ``data_dir``, StoreError (naming
        the file or URL) if the store cannot be opened or :meth:`cancel_standby` was
        called, OSError if a port cannot be bound.
        """
        self._fenced = asyncio.Event()
        self._stopping = None
        self._started = False
        if self.settings.data_dir is not None:
            self._lock = DataDirLock(self.settings.data_dir)
            self._lock.acquire()
        try:
            if self.settings.store_url is not None and self.settings.node_name is not None:
                self.store = await self._become_node(self.settings.store_url)
            elif self.settings.store_url is not None:
                self.store = await self._become_master(self.settings.store_url)
            elif self.settings.data_dir is not None:
                self.store = SQLiteStore(self.settings.data_dir, self.settings.disk_reserve)
            if self.store is not None:
                started = time.monotonic()
                core = self.core
                self.store.on_stall = lambda stalled: core.set_alarm(stalled, "store")
                self.store.on_flow = core.flow.set
                self.store.flow_high = self.settings.store_flow_high
                self.store.flow_low = self.settings.store_flow_low
                self.store.on_fenced = self._lose_mastership
                self.core.attach_store(self.store)
                self.store.start(asyncio.get_running_loop())
                if self.settings.node_name is not None:
                    await self._join_cluster()
                self.recovery_seconds = time.monotonic() - started
        except BaseException:
            await self._leave_cluster(graceful=False)
            self._close_store()
            raise
        if self.role == "master":
            log.info(
                "master of cluster %r: waited %.2f s as a standby, recovered in %.2f s",
                self.settings.store_cluster,
                self.standby_seconds,
                self.recovery_seconds,
            )
        if self.settings.data_dir is not None:
            self._disk_monitor = DiskMonitor(
                self.core, self.settings.data_dir, lambda: self.settings.disk_free_limit
            )
            self._disk_monitor.start()
        settings = self.settings
        self._memory_monitor = MemoryMonitor(
            self.core,
            settings.memory_limit,
            settings.vm_memory_high_watermark_paging_ratio,
            budget=settings.queue_memory_budget_bytes,
        )
        self._memory_monitor.start()
        try:
            tls = self._tls_context()
            # sessions of MQTT clients gone meanwhile (the AMQP port takes MQTT too)
            SessionTimers.of(self.core).start()
            await self.listener.start()
            if settings.cluster_port is not None:
                self.peer_listener = Listener(self.core, settings.bind, settings.cluster_port)
                await self.peer_listener.start()
            if settings.amqps_port is not None:
                self.tls_listener = Listener(
                    self.core,
                    settings.bind,
                    settings.amqps_port,
                    0,
                    tls,
                    settings.ssl_cert_login_from,
                    reuse_port=settings.reuse_port,
                )
                await self.tls_listener.start()
            if settings.stomp_port is not None:
                self.stomp_listener = Listener(
                    self.core,
                    settings.bind,
                    settings.stomp_port,
                    0,
                    connection_class=StompConnection,
                    reuse_port=settings.reuse_port,
                )
                await self.stomp_listener.start()
            if settings.mqtt_port is not None:
                self.mqtt_listener = Listener(
                    self.core,
                    settings.bind,
                    settings.mqtt_port,
                    0,
                    connection_class=MqttConnection,
                    reuse_port=settings.reuse_port,
                )
                await self.mqtt_listener.start()
            if settings.mqtts_port is not None:
                self.mqtts_listener = Listener(
                    self.core,
                    settings.bind,
                    settings.mqtts_port,
                    0,
                    tls,
                    settings.ssl_cert_login_from,
                    connection_class=MqttConnection,
                    reuse_port=settings.reuse_port,
                )
                await self.mqtts_listener.start()
            http_cap = self._http_port_cap()
            if settings.web_stomp_port is not None:
                self.web_stomp = WebSocketServer(
                    self.core,
                    WEB_STOMP,
                    settings.bind,
                    settings.web_stomp_port,
                    settings.http,
                    http_cap,
                    settings.reuse_port,
                )
                await self.web_stomp.start()
            if settings.web_mqtt_port is not None:
                self.web_mqtt = WebSocketServer(
                    self.core,
                    web_mqtt(self.core),
                    settings.bind,
                    settings.web_mqtt_port,
                    settings.http,
                    http_cap,
                    settings.reuse_port,
                )
                await self.web_mqtt.start()
            if settings.web_amqp_port is not None:
                self.web_amqp = WebSocketServer(
                    self.core,
                    WEB_AMQP,
                    settings.bind,
                    settings.web_amqp_port,
                    settings.http,
                    http_cap,
                    settings.reuse_port,
                )
                await self.web_amqp.start()
            if settings.data_dir is not None:  # leveret ctl's socket lives there
                control = ControlServer(self, Path(settings.data_dir) / SOCKET_NAME)
                try:
                    await control.start()
                    self._control = control
                except OSError as exc:  # e.g. a path too long for a Unix socket
                    log.warning("leveret ctl is unavailable: cannot listen on %s: %s", control.path, exc)
            if settings.http_port is not None or settings.https_port is not None:
                self.management = ManagementAPI(
                    self.core,
                    settings.bind,
                    settings.http_port,
                    settings.http_allowed_hosts,
                    settings.https_port,
                    tls,
                    self.node_info,
                    settings.collect_statistics_interval / 1000,
                    self.shovels.status,
                    settings.http,
                    http_cap,
                    federation=self.federation,
                    reuse_port=settings.reuse_port,
                )
                await self.management.start()
            if settings.prometheus_port is not None and settings.prometheus_port >= 0:  # -1: off
                # prometheus-client is loaded only by a broker that serves metrics
                from ..management.metrics import NodeInfo, PrometheusServer

                node = NodeInfo(
                    memory_limit=settings.memory_limit,
                    disk_free_limit=lambda: self.settings.disk_free_limit,
                    data_dir=settings.data_dir,
                )
                prometheus = PrometheusServer(
                    self.core,
                    settings.bind,
                    settings.prometheus_port,
                    node,
                    settings.collect_statistics_interval / 1000,
                    settings.http,
                    http_cap,
                    federation=self.federation,
                    reuse_port=settings.reuse_port,
                )
                await prometheus.start()
                self.prometheus = prometheus
            self.shovels.start(settings.shovels)
            self.federation.start()
            if self.cluster is not None:
                http = self.management.port if self.management is not None else settings.http_port
                await self.cluster.advertise(self.cluster_amqp_port, http)
        except BaseException:
            await self._stop_listeners()
            await self._leave_cluster(graceful=False)
            self._close_store()
            raise
        self._started = True
        if self.role == "fenced":  # the session went while the listeners started
            await self.stop()
            what = f"node {settings.node_name}" if settings.node_name is not None else "the master"
            raise StoreError(f"fenced while starting as {what} of cluster {settings.store_cluster!r}")
        return self

    def _http_port_cap(self) -> int:
        """The most connections each HTTP port (management HTTP and HTTPS, Prometheus,
        Web STOMP, Web MQTT, Web AMQP) holds: ``[http] max_connections``, within an even share of
        ``fd_fraction`` of RLIMIT_NOFILE (server/http_limits.py); logged once."""
        settings = self.settings
        ports = sum(
            port is not None
            for port in (
                settings.http_port,
                settings.https_port,
                settings.web_stomp_port,
                settings.web_mqtt_port,
                settings.web_amqp_port,
            )
        ) + (settings.prometheus_port is not None and settings.prometheus_port >= 0)
        cap = settings.http.port_cap(ports)
        if ports:
            log.info(
                "HTTP ports: at most %d connections each (%d ports, RLIMIT_NOFILE %s, http.fd_fraction %s)",
                cap,
                ports,
                descriptor_limit() or "unlimited",
                settings.http.fd_fraction,
            )
        return cap

    async def _become_master(self, url: str) -> PostgreSQLStore:
        """Wait as a standby (not listening for clients; the management port answers
        503 ``standby``) until this broker holds the cluster's master lock; the store,
        its writer session holding the lock. StoreError if :meth:`cancel_standby` was
        called first."""
        settings = self.settings
        store = PostgreSQLStore(url, settings.store_cluster)
        if not self.standby_first and store.try_master():
            self.role = "master"
            return store
        self.role = "standby"
        log.info("standby: another broker is the master of cluster %r", settings.store_cluster)
        http = None
        if settings.http_port is not None:
            http = StandbyServer(settings.bind, settings.http_port, settings.store_cluster, settings.http)
            await http.start()
        if self.on_standby is not None:
            self.on_standby()
        waited = time.monotonic()
        try:
            became = await asyncio.get_running_loop().run_in_executor(
                None, store.wait_for_master, self._cancel_standby, self.standby_first
            )
        finally:
            if http is not None:
                await http.stop()
        self.standby_seconds = time.monotonic() - waited
        if not became:
            store.close()
            raise StoreError(f"stopped as a standby of cluster {settings.store_cluster!r}")
        self.role = "master"
        return store

    async def _become_node(self, url: str) -> PostgreSQLStore:
        """The store of an active node (docs/cluster.md): its writer session holds the
        node's advisory lock. No standby wait unless another process holds this node's
        lock (the same node started twice): then wait for it as a standby waits for the
        master. StoreError if the database cannot be reached or :meth:`cancel_standby`
        was called first."""
        settings = self.settings
        store = PostgreSQLStore(url, settings.store_cluster, node=settings.node_name)
        if store.try_master():
            self.role = "node"
            return store
        if store.unreachable is not None:
            raise StoreError(f"cannot open store {store.name}: {store.unreachable}")
        self.role = "standby"
        log.info(
            "standby: node %s of cluster %r is live in another process",
            settings.node_name,
            settings.store_cluster,
        )
        if self.on_standby is not None:
            self.on_standby()
        waited = time.monotonic()
        became = await asyncio.get_running_loop().run_in_executor(
            None, store.wait_for_master, self._cancel_standby, self.standby_first
        )
        self.standby_seconds = time.monotonic() - waited
        if not became:
            store.close()
            raise StoreError(
                f"stopped as a standby of node {settings.node_name} of cluster {settings.store_cluster!r}"
            )
        self.role = "node"
        return store

    async def _join_cluster(self) -> None:
        """Start the :class:`~leveret.cluster.node.ClusterNode` on the recovered core
        (before the listeners open): it registers, turns the queues other nodes own into
        RemoteQueues and starts replication, peers, takeovers and the lease watchdog."""
        from ..cluster.catalog import Catalog
        from ..cluster.node import ClusterNode

        settings = self.settings
        assert settings.store_url is not None and settings.node_name is not None
        catalog = await asyncio.to_thread(
            Catalog, settings.store_url, settings.store_cluster, settings.node_name
        )
        node = ClusterNode(self.core, settings, self.store, catalog)
        node.on_fenced = self._lose_mastership
        self.cluster = node
        await node.start()

    async def _leave_cluster(self, graceful: bool) -> None:
        """Stop the cluster node (``graceful``: hand its queues over and leave first)."""
        node, self.cluster = self.cluster, None
        if node is not None:
            await node.stop(graceful=graceful and self.role != "fenced")

    def cancel_standby(self) -> None:
        """Make a :meth:`start` that waits as a standby give up (StoreError)."""
        self._cancel_standby.set()

    def _lose_mastership(self, reason: str) -> None:
        """The store lost its database session, and the master lock with it: another
        broker may be the master now, so stop serving at once (fencing). A cluster
        node: the same when its lease ran out (:mod:`leveret.cluster.lease`)."""
        if self.role == "fenced":
            return
        self.role = "fenced"
        if self.settings.node_name is not None and self.cluster is not None:
            self.cluster.fence(reason)  # (logs "fenced: …"; calls back once, no-op)
            self._abort_connections()
        elif self.settings.node_name is not None:
            log.error(
                "fenced: node %s lost its database session (%s); stopping", self.settings.node_name, reason
            )
        else:
            log.error("fenced: the database session holding the master lock is gone (%s); stopping", reason)
        assert self._fenced is not None
        self._fenced.set()
        if self._stopping is None and self._started:  # (start() checks for itself)
            self._stopping = asyncio.ensure_future(self._stop())

    def _abort_connections(self) -> None:
        """A fenced node drops every connection on its listeners (clients and the other
        nodes' links) at once, before the loop runs anything else: from now on another
        node may take its queues over, so not one more delivery may leave (the orderly
        close with 320 follows in :meth:`_stop` for what is left)."""
        peers = self.peer_listener.connections if self.peer_listener is not None else ()
        for connection in [c for _, c in self.connections()] + list(peers):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()

    async def wait_fenced(self) -> None:
        """Return once the broker was fenced (see :meth:`_lose_mastership`)."""
        assert self._fenced is not None
        await self._fenced.wait()

    def _tls_context(self) -> SSLContext | None:
        """The server's TLS context when a TLS port is set (TLSError if ssl_options are
        missing or cannot be loaded)."""
        settings = self.settings
        if settings.amqps_port is None and settings.https_port is None and settings.mqtts_port is None:
            return None
        if settings.ssl_options is None:
            raise TLSError("amqps_port, https_port and mqtts_port need ssl_options (certfile, keyfile)")
        return settings.ssl_options.server_context()

    @property
    def stomp_port(self) -> int | None:
        """The STOMP port actually bound (after start), if any."""
        return self.stomp_listener.port if self.stomp_listener is not None else None

    @property
    def stomp_url(self) -> str | None:
        """``stomp://host:port`` (after start), if STOMP has its own port."""
        port = self.stomp_port
        return f"stomp://{self.host}:{port}" if port is not None else None

    @property
    def mqtt_port(self) -> int | None:
        """The MQTT port actually bound (after start), if any."""
        return self.mqtt_listener.port if self.mqtt_listener is not None else None

    @property
    def mqtt_url(self) -> str | None:
        """``mqtt://host:port`` (after start), if MQTT has a port."""
        port = self.mqtt_port
        return f"mqtt://{self.host}:{port}" if port is not None else None

    @property
    def web_stomp_url(self) -> str | None:
        """``ws://host:port/ws`` (after start), if STOMP over WebSocket runs."""
        return self.web_stomp.url if self.web_stomp is not None else None

    @property
    def web_mqtt_url(self) -> str | None:
        """``ws://host:port/ws`` (after start), if MQTT over WebSocket runs."""
        return self.web_mqtt.url if self.web_mqtt is not None else None

    @property
    def web_amqp_url(self) -> str | None:
        """``ws://host:port/ws`` (after start), if AMQP 1.0 over WebSocket runs."""
        return self.web_amqp.url if self.web_amqp is not None else None

    @property
    def mqtts_port(self) -> int | None:
        """The MQTT-over-TLS port actually bound (after start), if any."""
        return self.mqtts_listener.port if self.mqtts_listener is not None else None

    @property
    def amqps_port(self) -> int | None:
        """The AMQP-over-TLS port actually bound (after start), if any."""
        return self.tls_listener.port if self.tls_listener is not None else None

    def node_info(self) -> dict[str, Any]:
        """What management's overview, nodes and health checks show of this server:
        its listeners as ``(protocol, ip, port)`` (RabbitMQ's protocol names), memory
        and disk limits."""
        listeners: list[tuple[str, str, int]] = [("amqp", self.host, self.amqp_port)]
        if self.amqps_port is not None:
            listeners.append(("amqp/ssl", self.host, self.amqps_port))
        if self.stomp_port is not None:
            listeners.append(("stomp", self.host, self.stomp_port))
        if self.web_stomp is not None:
            listeners.append(("http/web-stomp", self.host, self.web_stomp.port))
        if self.mqtt_port is not None:
            listeners.append(("mqtt", self.host, self.mqtt_port))
        if self.mqtts_port is not None:
            listeners.append(("mqtt/ssl", self.host, self.mqtts_port))
        if self.web_mqtt is not None:
            listeners.append(("http/web-mqtt", self.host, self.web_mqtt.port))
        if self.web_amqp is not None:
            listeners.append(("http/web-amqp", self.host, self.web_amqp.port))
        management = self.management
        if management is not None and management.port is not None:
            listeners.append(("http", self.host, management.port))
        if management is not None and management.https_port is not None:
            listeners.append(("https", self.host, management.https_port))
        info: dict[str, Any] = {
            "role": self.role,
            "listeners": listeners,
            "mem_limit": self.settings.memory_limit(),
            "disk_free_limit": self.settings.disk_free_limit,
        }
        if self.settings.data_dir is not None:
            try:
                info["disk_free"] = shutil.disk_usage(self.settings.data_dir).free
            except OSError:
                pass
        return info

    def connections(self) -> list[tuple[str, AnyConnection]]:
        """Every client connection with its name, RabbitMQ's form
        ``"peer -> listener"`` (`` (TLS)`` appended for amqps, `` (STOMP)`` for STOMP,
        `` (Web STOMP)`` for STOMP over WebSocket, likewise for MQTT and `` (Web AMQP)``
        for AMQP 1.0 over WebSocket; AMQP 1.0 on the AMQP ports is named as AMQP 0-9-1)."""
        found = []
        listeners: tuple[tuple[Listener | WebSocketServer | None, str], ...] = (
            (self.listener, ""),
            (self.tls_listener, " (TLS)"),
            (self.stomp_listener, " (STOMP)"),
            (self.mqtt_listener, " (MQTT)"),
            (self.mqtts_listener, " (MQTT, TLS)"),
            (self.web_stomp, " (Web STOMP)"),
            (self.web_mqtt, " (Web MQTT)"),
            (self.web_amqp, " (Web AMQP)"),
        )
        for listener, suffix in listeners:
            if listener is not None:
                for connection in listener.connections:
                    found.append(
                        (f"{connection.peer} -> {listener.host}:{listener.port}{suffix}", connection)
                    )
        return sorted(found, key=lambda item: item[0])

    async def _stop_listeners(self) -> None:
        if self._control is not None:
            await self._control.stop()
            self._control = None
        await self.listener.stop()
        if self.peer_listener is not None:
            await self.peer_listener.stop()
            self.peer_listener = None
        if self.tls_listener is not None:
            await self.tls_listener.stop()
            self.tls_listener = None
        if self.stomp_listener is not None:
            await self.stomp_listener.stop()
            self.stomp_listener = None
        if self.mqtt_listener is not None:
            await self.mqtt_listener.stop()
            self.mqtt_listener = None
        if self.mqtts_listener is not None:
            await self.mqtts_listener.stop()
            self.mqtts_listener = None
        if self.web_stomp is not None:
            await self.web_stomp.stop()
            self.web_stomp = None
        if self.web_mqtt is not None:
            await self.web_mqtt.stop()
            self.web_mqtt = None
        if self.web_amqp is not None:
            await self.web_amqp.stop()
            self.web_amqp = None

    @property
    def http_url(self) -> str | None:
        """The management API's base URL, when it runs (over TLS if only https)."""
        if self.management is None:
            return None
        if self.management.port is None:
            return f"https://{self.host}:{self.management.https_port}"
        return f"http://{self.host}:{self.management.port}"

    @property
    def prometheus_url(self) -> str | None:
        """``http://host:port`` of the Prometheus metrics (after start), when they run."""
        if self.prometheus is None:
            return None
        return f"http://{self.host}:{self.prometheus.port}"

    async def stop(self) -> None:
        """Close every connection with 320 CONNECTION_FORCED, stop listening, then
        write what the store has queued and close it. Calls after the first (or after
        fencing) wait for that one."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    def _local_uri(self) -> str:
        """This broker over AMQP as guest on vhost ``/`` (what a shovel's ``amqp://``
        means, as in RabbitMQ)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = "[::1]" if host == "::" else host
        return f"amqp://guest:guest@{host}:{self.amqp_port}/%2F"

    def federation_node(self) -> str:
        """The name this broker federates under (``x-received-from``'s
        ``cluster-name``, cycle detection, upstream queue names): the ``cluster_name``
        global parameter, else the cluster's name on a cluster node (all its nodes are one
        broker, as RabbitMQ's cluster_name is the cluster's), else ``leveret@HOST`` on
        AMQP port 5672 and ``leveret-PORT@HOST`` on another, so brokers on one machine
        differ."""
        name = self.core.global_parameters.get("cluster_name")
        if isinstance(name, str) and name:
            return name
        if self.core.cluster is not None:
            return str(self.core.cluster.cluster)
        host = NODE.partition("@")[2]
        return NODE if self.amqp_port == 5672 else f"leveret-{self.amqp_port}@{host}"

    async def _stop(self) -> None:
        await self._stop_listeners()  # first: a fenced master must stop serving at once
        await self._leave_cluster(graceful=True)  # (a fenced node only stops its parts)
        await self.shovels.stop()
        await self.federation.stop()
        if self.management is not None:
            await self.management.stop()
            self.management = None
        if self.prometheus is not None:
            await self.prometheus.stop()
            self.prometheus = None
        self._close_store()

    def _close_store(self) -> None:
        if self._memory_monitor is not None:
            self._memory_monitor.stop()
            self._memory_monitor = None
        if self._disk_monitor is not None:
            self._disk_monitor.stop()
            self._disk_monitor = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    async def __aenter__(self) -> Broker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class BlockingBroker:
    """A :class:`Broker` running in a background thread with its own event loop, for
    synchronous code and tests. Same arguments as Broker."""

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        self.broker = Broker(settings, **overrides)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def core(self) -> BrokerCore:
        """The broker's core; touch it only on the broker's thread (:meth:`call`)."""
        return self.broker.core

    @property
    def amqp_port(self) -> int:
        """The port actually bound (after start)."""
        return self.broker.amqp_port

    @property
    def amqp_url(self) -> str:
        """See :attr:`Broker.amqp_url`."""
        return self.broker.amqp_url

    @property
    def http_url(self) -> str | None:
        """The management API's base URL, when it runs."""
        return self.broker.http_url

    @property
    def mqtt_port(self) -> int | None:
        """See :attr:`Broker.mqtt_port`."""
        return self.broker.mqtt_port

    @property
    def prometheus_url(self) -> str | None:
        """See :attr:`Broker.prometheus_url`."""
        return self.broker.prometheus_url

    @property
    def stomp_url(self) -> str | None:
        """See :attr:`Broker.stomp_url`."""
        return self.broker.stomp_url

    @property
    def web_stomp_url(self) -> str | None:
        """See :attr:`Broker.web_stomp_url`."""
        return self.broker.web_stomp_url

    @property
    def web_mqtt_url(self) -> str | None:
        """See :attr:`Broker.web_mqtt_url`."""
        return self.broker.web_mqtt_url

    @property
    def web_amqp_url(self) -> str | None:
        """See :attr:`Broker.web_amqp_url`."""
        return self.broker.web_amqp_url

    @property
    def amqps_port(self) -> int | None:
        """See :attr:`Broker.amqps_port`."""
        return self.broker.amqps_port

    @property
    def mqtts_port(self) -> int | None:
        """See :attr:`Broker.mqtts_port`."""
        return self.broker.mqtts_port

    def start(self) -> BlockingBroker:
        """Start the thread and wait until the broker listens; raises what
        :meth:`Broker.start` raised (DataDirLocked, StoreError, OSError)."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.broker.start())
            except BaseException as exc:  # report bind errors to the caller
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.broker.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="leveret-broker", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop thread and return its result (or
        raise its exception); TimeoutError after 10 seconds."""
        assert self._loop is not None

        async def call() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def stop(self) -> None:
        """Stop the broker (as :meth:`Broker.stop`) and its thread, waiting up to 10
        seconds for it."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = self._thread = None

    def __enter__(self) -> BlockingBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
