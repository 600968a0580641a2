"""``leveret dlq``: browse, replay and purge dead-letter queues over AMQP (leveret or
RabbitMQ), and the dead-letter actions leveret runs itself (over its management API)."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .options import URL

T = TypeVar("T")


@click.group()
def dlq() -> None:
    """Browse, replay and purge dead-letter queues of a running broker."""


def _run(action: Callable[[], T]) -> T:
    """``action()``, with a DLQError (unreachable broker, no queue …) as a click error."""
    from ..tools.dlq import DLQError

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

    from ..tools.dlq import DEFAULT_PATTERN, list_queues

    queues = _run(lambda: list_queues(http_url, user, password, pattern or DEFAULT_PATTERN))
    table = Table("vhost", "queue", "messages", "consumers")
    for q in queues:
        table.add_row(q["vhost"], q["name"], str(q["messages"]), str(q["consumers"]))
    Console().print(table)


@dlq.command("show")
@click.argument("queue")
@URL
@click.option("--limit", type=int, default=50, show_default=True, help="Messages to show.")
def dlq_show(queue: str, url: str, limit: int) -> None:
    """Show dead letters without removing them."""
    from rich.console import Console
    from rich.table import Table

    from ..tools.dlq import browse

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
@URL
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

    from ..tools.dlq import matcher, replay

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
@URL
@click.confirmation_option(prompt="Delete every message of this queue?")
def dlq_purge(queue: str, url: str) -> None:
    """Delete every message of a dead-letter queue."""
    from ..tools.dlq import purge

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

    from ..tools.dlq_api import DeadLetterClient, selection

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

    from ..tools.dlq_api import DeadLetterClient

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
    from ..tools.dlq_api import DeadLetterClient

    job = _run(lambda: DeadLetterClient(http_url, user, password).cancel(job_id))
    click.echo(f"job {job['id']}: cancel asked ({job['done']} done so far)")


@dlq.command("audit")
@_http_client_options
@click.option("--limit", type=int, default=50, show_default=True)
def dlq_audit(http_url: str, user: str, password: str, limit: int) -> None:
    """The latest operators' actions (the audit trail). leveret only."""

    from rich.console import Console
    from rich.table import Table

    from ..tools.dlq_api import DeadLetterClient

    table = Table("time", "user", "from", "action", "details")
    for entry in _run(lambda: DeadLetterClient(http_url, user, password).audit(limit)):
        when = datetime.datetime.fromtimestamp(entry["time"]).isoformat(" ", "seconds")
        details = " ".join(f"{k}={v}" for k, v in entry["details"].items())
        table.add_row(when, entry["user"], entry["source"], entry["action"], details)
    Console().print(table)
