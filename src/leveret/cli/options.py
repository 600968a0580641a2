"""Options shared by several command groups."""

from __future__ import annotations

import click

URL = click.option(
    "--url",
    default="amqp://guest:guest@127.0.0.1:5672/%2F",
    show_default=True,
    help="AMQP URL of the broker.",
)
