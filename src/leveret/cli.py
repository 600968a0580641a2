"""The ``leveret`` command line (click)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from . import __version__
from .config import ConfigError, Settings, load
from .server.broker import Broker, new_event_loop
from .store import DataDirLocked, StoreError


@click.group()
@click.version_option(__version__, prog_name="leveret")
def main() -> None:
    """leveret: an AMQP 0-9-1 broker for RabbitMQ clients."""


@main.command()
@click.option("--bind", default=None, help="Address to listen on [127.0.0.1].")
@click.option("--amqp-port", type=int, default=None, help="AMQP port; 0 picks a free one [5672].")
@click.option("--data-dir", default=None, help="Directory for the broker's data [./leveret-data].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (users, vhosts, limits).")
@click.option("--log-level", default=None,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
def server(bind: str | None, amqp_port: int | None, data_dir: str | None,
           config_file: str | None, log_level: str | None) -> None:
    """Run the broker until SIGTERM or SIGINT.

    Prints "leveret ready: amqp://HOST:PORT" once it accepts clients; on a signal, closes
    every connection with 320 CONNECTION_FORCED and exits 0.
    """
    settings = Settings()
    if config_file:
        try:
            load(config_file, settings)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    for key, value in (("bind", bind), ("amqp_port", amqp_port), ("data_dir", data_dir),
                       ("log_level", log_level)):
        if value is not None:
            setattr(settings, key, value)
    if settings.data_dir is None:
        settings.data_dir = "./leveret-data"
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(settings))
    except (DataDirLocked, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None
    finally:
        loop.close()


async def _serve(settings: Settings) -> None:
    broker = Broker(settings)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    click.echo(f"leveret ready: amqp://{broker.host}:{broker.amqp_port}")
    sys.stdout.flush()
    await stop.wait()
    logging.getLogger("leveret").info("shutting down")
    await broker.stop()
