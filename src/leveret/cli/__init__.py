"""The ``leveret`` command line (click): one module per command group.

- :mod:`.server`: ``leveret server``, the broker;
- :mod:`.ctl`: ``leveret ctl``, rabbitmqctl's commands over the control socket;
- :mod:`.scheduler`: ``leveret scheduler``, scheduled and delayed messages;
- :mod:`.dlq`: ``leveret dlq``, dead-letter queues;
- :mod:`.pipeline`: ``leveret pipeline``, the Spark jobs.

Client libraries they use live in :mod:`leveret.tools` and :mod:`leveret.amqp.client`.
"""

from __future__ import annotations

import click

from ..version import __version__
from .ctl import ctl
from .dlq import dlq
from .pipeline import pipeline
from .scheduler import scheduler
from .server import server


@click.group()
@click.version_option(__version__, prog_name="leveret")
def main() -> None:
    """leveret: an AMQP 0-9-1 and STOMP broker for RabbitMQ and ActiveMQ clients."""


for command in (server, ctl, scheduler, dlq, pipeline):
    main.add_command(command)
