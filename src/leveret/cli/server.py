"""``leveret server``: run a broker (a master, or a standby on a shared PostgreSQL store)
until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from typing import TYPE_CHECKING

import click

from .. import log_limit
from ..config import ConfigError, Settings, load
from ..server.tls import TLSError
from ..store import DataDirLocked, StoreError

if TYPE_CHECKING:  # (loaded when a broker runs: `leveret ctl` imports this module too)
    from ..server.broker import Broker


@click.command()
@click.option("--bind", default=None, help="Address to listen on [127.0.0.1].")
@click.option("--amqp-port", type=int, default=None, help="AMQP port; 0 picks a free one [5672].")
@click.option(
    "--http-port",
    type=int,
    default=None,
    help="Serve the management HTTP API on this port (RabbitMQ's is 15672); 0 picks a free one [off].",
)
@click.option(
    "--prometheus-port",
    type=int,
    default=None,
    help="Prometheus metrics, /metrics, on this port (RabbitMQ's is 15692); 0: a free one, -1: off [15692].",
)
@click.option(
    "--stomp-port",
    type=int,
    default=None,
    help="STOMP port (ActiveMQ's is 61613); 0 picks a free one, -1 turns it off [61613].",
)
@click.option(
    "--web-stomp-port",
    type=int,
    default=None,
    help="STOMP over WebSocket port, path /ws (RabbitMQ's is 15674); 0 picks a free one, -1 off [15674].",
)
@click.option(
    "--mqtt-port",
    type=int,
    default=None,
    help="MQTT 3.1.1 and 5.0 port (docs/mqtt.md); 0 picks a free one, -1 turns it off [1883].",
)
@click.option(
    "--web-mqtt-port",
    type=int,
    default=None,
    help="MQTT over WebSocket port, path /ws (RabbitMQ's is 15675); 0 picks a free one, -1 off [15675].",
)
@click.option(
    "--mqtts-port",
    type=int,
    default=None,
    help="MQTT over TLS port (8883 by convention; needs [ssl_options]); 0 picks a free one [off].",
)
@click.option(
    "--web-amqp-port",
    type=int,
    default=None,
    help="AMQP 1.0 over WebSocket port, path /ws (Tanzu RabbitMQ's is 15678); 0 picks a free one [off].",
)
@click.option("--data-dir", default=None, help="Directory for the broker's data [./leveret-data].")
@click.option(
    "--store",
    "store_url",
    default=None,
    metavar="URL",
    help="postgresql://user:password@host:port/db: keep state in PostgreSQL (one master, standbys).",
)
@click.option("--cluster", default=None, help="The brokers sharing a PostgreSQL store [leveret].")
@click.option(
    "--node",
    "node_name",
    default=None,
    help="Run as active node NAME of the cluster (docs/cluster.md) instead of master/standby.",
)
@click.option(
    "--advertise",
    "cluster_advertise",
    default=None,
    metavar="HOST",
    help="The host other cluster nodes reach this node's AMQP port on [127.0.0.1].",
)
@click.option(
    "--cluster-port",
    type=int,
    default=None,
    help="The AMQP port other cluster nodes reach this node on, if not the client port [--amqp-port].",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Run N cluster nodes on this machine sharing the client ports (docs/cluster.md) [off].",
)
@click.option(
    "--reuse-port", is_flag=True, default=None, hidden=True, help="Bind client ports with SO_REUSEPORT."
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (users, vhosts, limits).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="AMQP connection worker processes, to use more cores (docs/multicore.md) [0: none].",
)
@click.option(
    "--consumer-timeout",
    type=click.IntRange(min=0),
    default=None,
    metavar="MS",
    help="ms a delivery may stay unacknowledged (RabbitMQ's consumer_timeout); 0: never [1800000].",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
def server(
    bind: str | None,
    amqp_port: int | None,
    http_port: int | None,
    prometheus_port: int | None,
    stomp_port: int | None,
    web_stomp_port: int | None,
    mqtt_port: int | None,
    web_mqtt_port: int | None,
    mqtts_port: int | None,
    web_amqp_port: int | None,
    data_dir: str | None,
    store_url: str | None,
    cluster: str | None,
    node_name: str | None,
    cluster_advertise: str | None,
    cluster_port: int | None,
    nodes: int | None,
    reuse_port: bool | None,
    config_file: str | None,
    workers: int | None,
    consumer_timeout: int | None,
    log_level: str | None,
) -> None:
    """Run the broker until SIGTERM or SIGINT.

    Prints "leveret ready: amqp://HOST:PORT stomp://HOST:PORT" once it accepts clients
    (then the management API's and the other listeners' addresses); on a signal, closes
    every connection with 320 CONNECTION_FORCED and exits 0. With a PostgreSQL store it
    may first print "leveret standby: cluster NAME" and wait to become the master; a
    master that loses its database session stops serving and becomes a standby again.
    An active cluster node (``--node NAME``) adds " node NAME" to its ready line; on a
    signal it hands its queues to the live nodes first; fenced (its session or its lease
    lost) it stops serving at once and exits 1, for its supervisor to restart it.

    With ``--nodes N``: a supervisor of N cluster nodes on this machine sharing the
    client ports (SO_REUSEPORT), on ``--store`` or a private PostgreSQL under the data
    directory; it prints one "leveret ready" line once every node is ready, restarts a
    node that exits, and stops them all (then its PostgreSQL) on SIGTERM or SIGINT.
    """
    settings = Settings(
        stomp_port=61613, web_stomp_port=15674, prometheus_port=15692, mqtt_port=1883, web_mqtt_port=15675
    )
    if config_file:
        try:
            load(config_file, settings)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    for key, value in (
        ("bind", bind),
        ("amqp_port", amqp_port),
        ("http_port", http_port),
        ("prometheus_port", prometheus_port),
        ("stomp_port", stomp_port),
        ("web_stomp_port", web_stomp_port),
        ("mqtt_port", mqtt_port),
        ("web_mqtt_port", web_mqtt_port),
        ("mqtts_port", mqtts_port),
        ("web_amqp_port", web_amqp_port),
        ("data_dir", data_dir),
        ("store_url", store_url),
        ("store_cluster", cluster),
        ("node_name", node_name),
        ("cluster_advertise", cluster_advertise),
        ("cluster_port", cluster_port),
        ("reuse_port", reuse_port),
        ("workers", workers),
        ("log_level", log_level),
    ):
        if value is not None:
            setattr(settings, key, value)
    if consumer_timeout is not None:
        settings.limits.consumer_timeout = consumer_timeout
    if settings.http_port is not None and settings.http_port < 0:
        settings.http_port = None
    if settings.prometheus_port is not None and settings.prometheus_port < 0:
        settings.prometheus_port = None
    if settings.stomp_port is not None and settings.stomp_port < 0:
        settings.stomp_port = None
    if settings.web_stomp_port is not None and settings.web_stomp_port < 0:
        settings.web_stomp_port = None
    if settings.mqtt_port is not None and settings.mqtt_port < 0:
        settings.mqtt_port = None
    if settings.web_mqtt_port is not None and settings.web_mqtt_port < 0:
        settings.web_mqtt_port = None
    if settings.mqtts_port is not None and settings.mqtts_port < 0:
        settings.mqtts_port = None
    if settings.web_amqp_port is not None and settings.web_amqp_port < 0:
        settings.web_amqp_port = None
    if settings.data_dir is None:
        settings.data_dir = "./leveret-data"
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if nodes is not None:  # a supervisor of N node processes (cluster/supervisor.py)
        if settings.node_name is not None:
            raise click.UsageError("--nodes starts its own nodes: give it without --node")
        from ..cluster.supervisor import Supervisor, SupervisorError

        try:
            code = Supervisor(settings, nodes, config_file, consumer_timeout).run()
        except (SupervisorError, DataDirLocked, StoreError) as exc:
            raise click.ClickException(str(exc)) from None
        sys.exit(code)
    # A flood of bad connections or logins costs a few log lines, not one each (the
    # audit log is never thinned; an embedding program keeps its own logging as is).
    log_limit.limit("leveret.amqp", "leveret.stomp", "leveret.management", "leveret.server")
    from ..server.event_loop import new_event_loop

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(settings))
    except (DataDirLocked, StoreError, TLSError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None
    finally:
        loop.close()


#: Seconds a broker that was fenced waits before it tries for the master lock again:
#: a standby that has been waiting gets it first.
REJOIN_PAUSE = 1.0


async def _serve(settings: Settings) -> None:
    """Run brokers until a signal: one, or (PostgreSQL store) a new one each time the
    last was fenced, which waits as a standby again."""
    from .. import compiled
    from ..server.broker import Broker
    from ..server.http_limits import raise_descriptor_limit

    compiled.log_status()  # the broker's imports have asked for the compiled twins
    raised = raise_descriptor_limit()
    if raised:
        logging.getLogger("leveret").info("open file limit raised from %d to %d (RLIMIT_NOFILE)", *raised)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    fenced_before = False
    while not stop.is_set():
        broker = Broker(settings)
        if fenced_before:
            broker.standby_first = REJOIN_PAUSE
        broker.on_standby = lambda: _say(f"leveret standby: cluster {settings.store_cluster}")
        starting = asyncio.ensure_future(broker.start())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # a signal while a standby
            broker.cancel_standby()
            try:
                await starting
            except StoreError:
                pass
            await broker.stop()
            return
        try:
            starting.result()  # start's errors end the server ...
        except StoreError as exc:
            if not fenced_before:
                raise
            # ... unless it was fenced before: the database may still be flapping
            logging.getLogger("leveret").error("could not take over again: %s; standby again", exc)
            await asyncio.sleep(REJOIN_PAUSE)
            continue
        _ready(broker)
        fenced = asyncio.ensure_future(broker.wait_fenced())
        await asyncio.wait({fenced, stopping}, return_when=asyncio.FIRST_COMPLETED)
        fenced.cancel()
        if stop.is_set():
            logging.getLogger("leveret").info("shutting down")
        fenced_before = True
        await broker.stop()
        gc.unfreeze()
        if settings.node_name is not None and not stop.is_set():
            # a cluster node does not wait as a standby: it exits non-zero, for its
            # supervisor to restart it once the database answers (docs/cluster.md)
            raise StoreError(f"fenced: node {settings.node_name} of cluster {settings.store_cluster} stopped")
    stopping.cancel()


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


def _ready(broker: Broker) -> None:
    """Freeze what start-up made and print where the broker listens."""
    # What exists now (modules, definitions, recovered state) lives as long as the
    # broker: the cyclic collector need not walk it again. Without this every full
    # collection of a busy broker paused it 30-45 ms, and due messages waited.
    gc.collect()
    gc.freeze()
    ready = f"leveret ready: amqp://{broker.host}:{broker.amqp_port}"
    if broker.stomp_url:
        ready += " " + broker.stomp_url
    if broker.mqtt_url:
        ready += " " + broker.mqtt_url
    if broker.settings.node_name is not None:
        ready += f" node {broker.settings.node_name}"
    click.echo(ready)
    if broker.http_url:
        click.echo(f"leveret management: {broker.http_url}/api/")
    if broker.web_stomp_url:
        click.echo(f"leveret web-stomp: {broker.web_stomp_url}")
    if broker.web_mqtt_url:
        click.echo(f"leveret web-mqtt: {broker.web_mqtt_url}")
    if broker.web_amqp_url:
        click.echo(f"leveret web-amqp: {broker.web_amqp_url}")
    if broker.mqtts_port is not None:
        click.echo(f"leveret mqtts: mqtts://{broker.host}:{broker.mqtts_port}")
    if broker.amqps_port is not None:
        click.echo(f"leveret amqps: amqps://{broker.host}:{broker.amqps_port}")
    if broker.prometheus_url:
        click.echo(f"leveret prometheus: {broker.prometheus_url}/metrics")
    sys.stdout.flush()
