"""``leveret pipeline``: the Spark jobs (needs leveret[spark])."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .options import URL

T = TypeVar("T")


@click.group()
def pipeline() -> None:
    """Spark jobs over a broker (needs leveret[spark]): DLQ report and replay, archive.

    They run on local[*] unless --master names a cluster; under spark-submit the
    submitted master is used."""


def _spark_session(master: str | None) -> Any:
    """A SparkSession (:func:`leveret.spark.jobs.session`); a click error without pyspark."""
    try:
        from ..spark.jobs import session
    except ImportError as exc:  # pyspark missing
        raise click.ClickException(f"{exc}: install leveret[spark]") from None
    return session(master)


_MASTER = click.option(
    "--master", default=None, help="Spark master URL [local[*], or the one spark-submit gives]."
)


def _check_queue(url: str, name: str) -> None:
    """Fail fast, before starting Spark: unreachable broker, refused login, no queue."""
    from ..amqp.client import AMQPError, BlockingClient

    try:
        with BlockingClient(url) as client:
            if client.queue_exists(name) is None:
                raise click.ClickException(f"no queue or stream {name!r} on the broker")
    except AMQPError as exc:
        raise click.ClickException(str(exc)) from None


def _pipeline_run(action: Callable[[], T]) -> T:
    """``action()``, with AMQP, option and value errors as a click error."""
    from ..amqp.client import AMQPError
    from ..spark.source import OptionError

    try:
        return action()
    except (AMQPError, OptionError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@pipeline.command("dlq-report")
@click.argument("queue")
@URL
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

    from ..spark.jobs import dlq_report

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
@URL
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
    from ..spark.jobs import dlq_replay

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
@URL
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
    from ..spark.jobs import archive

    _check_queue(url, stream)
    spark = _spark_session(master)
    try:
        count = _pipeline_run(lambda: archive(spark, url, stream, output, checkpoint, starting_offset))
    finally:
        spark.stop()
    click.echo(f"archived {count} message(s) from {stream} to {output}")
