"""The ``leveret`` command line (click)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from . import log_limit
from .config import ConfigError, Settings, load
from .server.broker import Broker
from .server.event_loop import new_event_loop
from .server.tls import TLSError
from .store import DataDirLocked, StoreError
from .tools.ctl import ctl
from .tools.scheduler import scheduler
from .version import __version__

T = TypeVar("T")


@click.group()
@click.version_option(__version__, prog_name="leveret")
def main() -> None:
    """leveret: an AMQP 0-9-1 broker for RabbitMQ clients."""


@main.command()
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
    data_dir: str | None,
    store_url: str | None,
    cluster: str | None,
    config_file: str | None,
    workers: int | None,
    log_level: str | None,
) -> None:
    """Run the broker until SIGTERM or SIGINT.

    Prints "leveret ready: amqp://HOST:PORT stomp://HOST:PORT" once it accepts clients
    (then the management API's and the other listeners' addresses); on a signal, closes
    every connection with 320 CONNECTION_FORCED and exits 0. With a PostgreSQL store it
    may first print "leveret standby: cluster NAME" and wait to become the master; a
    master that loses its database session stops serving and becomes a standby again.
    """
    settings = Settings(stomp_port=61613, web_stomp_port=15674, prometheus_port=15692)
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
        ("data_dir", data_dir),
        ("store_url", store_url),
        ("store_cluster", cluster),
        ("workers", workers),
        ("log_level", log_level),
    ):
        if value is not None:
            setattr(settings, key, value)
    if settings.http_port is not None and settings.http_port < 0:
        settings.http_port = None
    if settings.prometheus_port is not None and settings.prometheus_port < 0:
        settings.prometheus_port = None
    if settings.stomp_port is not None and settings.stomp_port < 0:
        settings.stomp_port = None
    if settings.web_stomp_port is not None and settings.web_stomp_port < 0:
        settings.web_stomp_port = None
    if settings.data_dir is None:
        settings.data_dir = "./leveret-data"
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # A flood of bad connections or logins costs a few log lines, not one each (the
    # audit log is never thinned; an embedding program keeps its own logging as is).
    log_limit.limit("leveret.amqp", "leveret.stomp", "leveret.management", "leveret.server")
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
    click.echo(ready)
    if broker.http_url:
        click.echo(f"leveret management: {broker.http_url}/api/")
    if broker.web_stomp_url:
        click.echo(f"leveret web-stomp: {broker.web_stomp_url}")
    if broker.amqps_port is not None:
        click.echo(f"leveret amqps: amqps://{broker.host}:{broker.amqps_port}")
    if broker.prometheus_url:
        click.echo(f"leveret prometheus: {broker.prometheus_url}/metrics")
    sys.stdout.flush()


# -- leveret dlq ------------------------------------------------------------------------
_URL = click.option(
    "--url",
    default="amqp://guest:guest@127.0.0.1:5672/%2F",
    show_default=True,
    help="AMQP URL of the broker.",
)


main.add_command(ctl)
main.add_command(scheduler)


@main.group()
def dlq() -> None:
    """Browse, replay and purge dead-letter queues of a running broker."""


def _run(action: Callable[[], T]) -> T:
    """``action()``, with a DLQError (unreachable broker, no queue …) as a click error."""
    from .tools.dlq import DLQError

    try:
        return action()
    except DLQError as exc:
        raise click.ClickException(str(exc)) from None


@dlq.command("list")
@click.option(
    "--http-url",
    default="http://127.0.0.1:15672",
    show_default=True,
    help="Management API of the broker (leveret server --http-port).",
)
@click.option("--user", default="guest", show_default=True)
@click.option("--password", default="guest", show_default=True)
@click.option(
    "--pattern",
    default=None,
    help="Regular expression for DLQ names "
    r"[^(leveret\.DLQ|DLQ\..+)$].",
)
def dlq_list(http_url: str, user: str, password: str, pattern: str | None) -> None:
    """List dead-letter queues with their message counts."""
    from rich.console import Console
    from rich.table import Table

    from .tools.dlq import DEFAULT_PATTERN, list_queues

    queues = _run(lambda: list_queues(http_url, user, password, pattern or DEFAULT_PATTERN))
    table = Table("vhost", "queue", "messages", "consumers")
    for q in queues:
        table.add_row(q["vhost"], q["name"], str(q["messages"]), str(q["consumers"]))
    Console().print(table)


@dlq.command("show")
@click.argument("queue")
@_URL
@click.option("--limit", type=int, default=50, show_default=True, help="Messages to show.")
def dlq_show(queue: str, url: str, limit: int) -> None:
    """Show dead letters without removing them."""
    from rich.console import Console
    from rich.table import Table

    from .tools.dlq import browse

    letters = _run(lambda: browse(url, queue, limit))
    table = Table(
        "#",
        "message id",
        "reason",
        "from queue",
        "exchange",
        "routing key",
        "deaths",
        "body",
        title=f"{queue}: {len(letters)} shown",
    )
    for i, letter in enumerate(letters, 1):
        exchange, key = letter.origin() if letter.deaths else ("", "")
        deaths = sum(int(d.get("count", 1)) for d in letter.deaths)
        body = letter.body[:40].decode("utf-8", "replace")
        table.add_row(
            str(i),
            str(letter.properties.message_id or ""),
            letter.reason,
            letter.original_queue,
            exchange,
            key,
            str(deaths),
            body,
        )
    Console().print(table)


@dlq.command("replay")
@click.argument("queue")
@_URL
@click.option("--exchange", default=None, help="Republish here instead of the original exchange.")
@click.option("--routing-key", default=None, help="Routing key to use instead of the original.")
@click.option(
    "--reason",
    default=None,
    type=click.Choice(["rejected", "expired", "maxlen", "delivery_limit"]),
    help="Only dead letters that first died for this reason.",
)
@click.option(
    "--header",
    "header_filters",
    multiple=True,
    metavar="NAME=VALUE",
    help="Only dead letters with this header value (repeatable).",
)
@click.option("--limit", type=int, default=None, help="Replay at most this many.")
def dlq_replay(
    queue: str,
    url: str,
    exchange: str | None,
    routing_key: str | None,
    reason: str | None,
    header_filters: tuple[str, ...],
    limit: int | None,
) -> None:
    """Republish dead letters (confirmed, then acknowledged: a crash loses nothing)."""
    from rich.progress import Progress

    from .tools.dlq import matcher, replay

    headers = {}
    for item in header_filters:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="--header")
        headers[name] = value
    with Progress(transient=True) as progress:
        task = progress.add_task(f"replaying {queue}", total=limit)
        count = _run(
            lambda: replay(
                url,
                queue,
                matcher(reason, headers),
                limit,
                exchange,
                routing_key,
                lambda n: progress.update(task, completed=n),
            )
        )
    click.echo(f"replayed {count} message(s) from {queue}")


@dlq.command("purge")
@click.argument("queue")
@_URL
@click.confirmation_option(prompt="Delete every message of this queue?")
def dlq_purge(queue: str, url: str) -> None:
    """Delete every message of a dead-letter queue."""
    from .tools.dlq import purge

    count = _run(lambda: purge(url, queue))
    click.echo(f"purged {count} message(s) from {queue}")


# The dead-letter console's actions, run by the broker (leveret's HTTP API).
def _console_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every server-side ``leveret dlq`` action shares."""
    options = [
        click.option("--vhost", default="/", show_default=True),
        click.option(
            "--http-url",
            default="http://127.0.0.1:15672",
            show_default=True,
            help="Management API of the broker (leveret server --http-port).",
        ),
        click.option("--user", default="guest", show_default=True),
        click.option("--password", default="guest", show_default=True),
        click.option("--seq", "seqs", type=int, multiple=True, help="Only this message (repeatable)."),
        click.option("--reason", default=None, help="Only dead letters whose latest death had this reason."),
        click.option("--source-queue", default=None, help="Only dead letters that died in this queue."),
        click.option(
            "--header", "headers", multiple=True, metavar="NAME:VALUE", help="Header filter (repeatable)."
        ),
        click.option("--min-age", type=float, default=None, help="Seconds since the latest death, at least."),
        click.option("--max-age", type=float, default=None, help="Seconds since the latest death, at most."),
        click.option("--body", default=None, help="Only messages whose body contains this text."),
        click.option("--dry-run", is_flag=True, help="Only say how many messages match."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _console_action(action: str, queue: str, target: dict | None, **options: Any) -> None:
    from rich.progress import Progress

    from .tools.dlq_api import DeadLetterClient, selection

    client = DeadLetterClient(options["http_url"], options["user"], options["password"])
    chosen = selection(
        options["seqs"],
        options["reason"],
        options["source_queue"],
        options["headers"],
        options["min_age"],
        options["max_age"],
        options["body"],
    )
    vhost = options["vhost"]
    if options["dry_run"]:
        click.echo(f"{_run(lambda: client.preview(vhost, queue, chosen))} message(s) match in {queue}")
        return
    job = _run(lambda: client.start(vhost, queue, action, chosen, target))
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{action} {queue} (job {job['id']})", total=job["matched"] or None)
        job = _run(
            lambda: client.wait(job, lambda j: progress.update(task, completed=j["done"] + j["failed"]))
        )
    click.echo(f"job {job['id']} {job['state']}: {job['done']} done, {job['failed']} left in {queue}")
    if job["error"]:
        click.echo(f"last error: {job['error']}", err=True)
    if job["state"] != "done":
        sys.exit(1)


def _target(to_queue: str | None, to_exchange: str | None, routing_key: str | None) -> dict:
    if (to_queue is None) == (to_exchange is None):
        raise click.UsageError("give --to-queue or --to-exchange")
    if to_queue is not None:
        return {"queue": to_queue}
    return {"exchange": to_exchange, **({"routing_key": routing_key} if routing_key is not None else {})}


@dlq.command("retry")
@click.argument("queue")
@_console_options
def dlq_retry(queue: str, **options: Any) -> None:
    """Send dead letters back where they were first published (the broker does it:
    confirmed before removed). leveret only."""
    _console_action("retry", queue, None, **options)


def _target_action(action: str, help_text: str) -> None:
    """``leveret dlq move|copy``: an action with a target queue or exchange."""

    @dlq.command(action, help=help_text)
    @click.argument("queue")
    @click.option("--to-queue", default=None)
    @click.option("--to-exchange", default=None)
    @click.option("--routing-key", default=None, help="With --to-exchange [each message's own].")
    @_console_options
    def command(
        queue: str, to_queue: str | None, to_exchange: str | None, routing_key: str | None, **options: Any
    ) -> None:
        _console_action(action, queue, _target(to_queue, to_exchange, routing_key), **options)


_target_action("move", "Move dead letters to a queue or exchange (confirmed before removed). leveret only.")
_target_action("copy", "Copy dead letters to a queue or exchange; they stay. leveret only.")


@dlq.command("delete")
@click.argument("queue")
@_console_options
@click.confirmation_option(prompt="Delete the matching messages?")
def dlq_delete(queue: str, **options: Any) -> None:
    """Delete the dead letters chosen (by --seq or the filters). leveret only."""
    _console_action("delete", queue, None, **options)


def _http_client_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        [
            click.option("--http-url", default="http://127.0.0.1:15672", show_default=True),
            click.option("--user", default="guest", show_default=True),
            click.option("--password", default="guest", show_default=True),
        ]
    ):
        command = option(command)
    return command


@dlq.command("jobs")
@_http_client_options
def dlq_jobs(http_url: str, user: str, password: str) -> None:
    """The dead-letter actions running and recently finished. leveret only."""
    from rich.console import Console
    from rich.table import Table

    from .tools.dlq_api import DeadLetterClient

    table = Table("job", "vhost", "queue", "action", "user", "state", "matched", "done", "failed")
    for job in _run(lambda: DeadLetterClient(http_url, user, password).jobs()):
        table.add_row(
            *(
                str(job[k])
                for k in ("id", "vhost", "queue", "action", "user", "state", "matched", "done", "failed")
            )
        )
    Console().print(table)


@dlq.command("cancel")
@click.argument("job_id")
@_http_client_options
def dlq_cancel(job_id: str, http_url: str, user: str, password: str) -> None:
    """Stop a running dead-letter action after its current chunk. leveret only."""
    from .tools.dlq_api import DeadLetterClient

    job = _run(lambda: DeadLetterClient(http_url, user, password).cancel(job_id))
    click.echo(f"job {job['id']}: cancel asked ({job['done']} done so far)")


@dlq.command("audit")
@_http_client_options
@click.option("--limit", type=int, default=50, show_default=True)
def dlq_audit(http_url: str, user: str, password: str, limit: int) -> None:
    """The latest operators' actions (the audit trail). leveret only."""
    import datetime

    from rich.console import Console
    from rich.table import Table

    from .tools.dlq_api import DeadLetterClient

    table = Table("time", "user", "from", "action", "details")
    for entry in _run(lambda: DeadLetterClient(http_url, user, password).audit(limit)):
        when = datetime.datetime.fromtimestamp(entry["time"]).isoformat(" ", "seconds")
        details = " ".join(f"{k}={v}" for k, v in entry["details"].items())
        table.add_row(when, entry["user"], entry["source"], entry["action"], details)
    Console().print(table)


@main.group()
def pipeline() -> None:
    """Spark jobs over a broker (needs leveret[spark]): DLQ report and replay, archive.

    They run on local[*] unless --master names a cluster; under spark-submit the
    submitted master is used."""


def _spark_session(master: str | None) -> Any:
    """A SparkSession (:func:`leveret.spark.jobs.session`); a click error without pyspark."""
    try:
        from .spark.jobs import session
    except ImportError as exc:  # pyspark missing
        raise click.ClickException(f"{exc}: install leveret[spark]") from None
    return session(master)


_MASTER = click.option(
    "--master", default=None, help="Spark master URL [local[*], or the one spark-submit gives]."
)


def _check_queue(url: str, name: str) -> None:
    """Fail fast, before starting Spark: unreachable broker, refused login, no queue."""
    from .amqp.client import AMQPError, BlockingClient

    try:
        with BlockingClient(url) as client:
            if client.queue_exists(name) is None:
                raise click.ClickException(f"no queue or stream {name!r} on the broker")
    except AMQPError as exc:
        raise click.ClickException(str(exc)) from None


def _pipeline_run(action: Callable[[], T]) -> T:
    """``action()``, with AMQP, option and value errors as a click error."""
    from .amqp.client import AMQPError
    from .spark.source import OptionError

    try:
        return action()
    except (AMQPError, OptionError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@pipeline.command("dlq-report")
@click.argument("queue")
@_URL
@_MASTER
@click.option("--output", default=None, help="Directory for the report as Parquet.")
@click.option("--chart", default=None, help="PNG file for a chart of dead letters per hour.")
@click.option(
    "--header", "headers", multiple=True, metavar="NAME", help="Also group by this header (repeatable)."
)
@click.option("--limit", type=int, default=None, help="Read at most this many dead letters.")
def pipeline_dlq_report(
    queue: str,
    url: str,
    master: str | None,
    output: str | None,
    chart: str | None,
    headers: tuple[str, ...],
    limit: int | None,
) -> None:
    """Count dead letters by original queue, reason, hour and headers (browsing QUEUE)."""
    from rich.console import Console
    from rich.table import Table

    from .spark.jobs import dlq_report

    _check_queue(url, queue)
    spark = _spark_session(master)
    try:
        table = _pipeline_run(lambda: dlq_report(spark, url, queue, output, headers, chart, limit))
    finally:
        spark.stop()
    view = Table(*table.columns, title=f"{queue}: {int(table['dead_letters'].sum())} dead letter(s)")
    for row in table.itertuples(index=False):
        view.add_row(*("" if v is None else str(v) for v in row))
    Console().print(view)
    for path, what in ((output, "report"), (chart, "chart")):
        if path:
            click.echo(f"{what}: {path}")


@pipeline.command("dlq-replay")
@click.argument("queue")
@_URL
@_MASTER
@click.option(
    "--where", default=None, help="Spark SQL filter, e.g. \"reason = 'rejected' AND original_queue = 'q'\"."
)
@click.option("--exchange", default=None, help="Republish here instead of the original exchange.")
@click.option("--routing-key", default=None, help="Routing key to use instead of the original.")
@click.option(
    "--max",
    "max_messages",
    type=int,
    default=100_000,
    show_default=True,
    help="Lease at most this many dead letters.",
)
@click.option("--group", default="leveret-dlq-replay", show_default=True, help="Lease group.")
def pipeline_dlq_replay(
    queue: str,
    url: str,
    master: str | None,
    where: str | None,
    exchange: str | None,
    routing_key: str | None,
    max_messages: int,
    group: str,
) -> None:
    """Republish selected dead letters; each is acknowledged once its copy is confirmed."""
    from .spark.jobs import dlq_replay

    _check_queue(url, queue)
    spark = _spark_session(master)
    try:
        result = _pipeline_run(
            lambda: dlq_replay(spark, url, queue, where, exchange, routing_key, max_messages, group)
        )
    finally:
        spark.stop()
    click.echo(
        f"replayed {result.replayed} of {result.leased} dead letter(s) from {queue}; "
        f"{result.released} left in place"
    )


@pipeline.command("archive")
@click.argument("stream")
@_URL
@_MASTER
@click.option("--output", required=True, help="Directory for Parquet files, by date.")
@click.option(
    "--checkpoint", required=True, help="Checkpoint directory: each run copies what arrived since the last."
)
@click.option(
    "--starting-offset",
    default="first",
    show_default=True,
    help="Where the first run starts: first, next or an offset.",
)
def pipeline_archive(
    stream: str, url: str, master: str | None, output: str, checkpoint: str, starting_offset: str
) -> None:
    """Copy a stream's new messages to Parquet partitioned by date."""
    from .spark.jobs import archive

    _check_queue(url, stream)
    spark = _spark_session(master)
    try:
        count = _pipeline_run(lambda: archive(spark, url, stream, output, checkpoint, starting_offset))
    finally:
        spark.stop()
    click.echo(f"archived {count} message(s) from {stream} to {output}")
