"""``factories.rabbitmq_proc``: pytest-rabbitmq's process fixture factory, on leveret."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..config import get_config
from ..executor import InProcessLeveret, LeveretExecutor, SubprocessLeveret

#: pytest-rabbitmq's port argument: an int or str (that port), None (a free one), -1
#: (the ``rabbitmq_port`` setting, else a free one), a (low, high) range, a set of
#: ports, or a list of ranges and sets.
PortSpec = Any


def rabbitmq_proc(
    server: str | None = None,
    host: str | None = None,
    port: PortSpec = -1,
    distribution_port: PortSpec = -1,
    node: str | None = None,
    ctl: str | None = None,
    plugindir: Path | None = None,
    *,
    subprocess: bool = False,
    data_dir: bool = False,
    **overrides: Any,
) -> Callable[..., Iterator[LeveretExecutor]]:
    """A session-scoped fixture yielding a started leveret (a
    :class:`~leveret.testing.rabbitmq.executor.LeveretExecutor`), stopped after the
    session.

    The arguments are pytest-rabbitmq 5's: ``host`` (default: the ``rabbitmq_host``
    setting, else 127.0.0.1) and ``port`` (see :data:`PortSpec`) are used;
    ``server``, ``distribution_port``, ``node``, ``ctl`` and ``plugindir`` are
    accepted and ignored (there is no Erlang node). leveret's own, keyword-only:
    ``subprocess=True`` runs ``python -m leveret server`` instead of a broker thread
    in the test process; ``data_dir=True`` gives the in-process broker a data
    directory under pytest's temporary directory (durable queues then survive
    ``stop()``/``start()``; a subprocess always has one); other keywords are
    :class:`~leveret.config.Settings` fields for the in-process broker.
    """
    del server, distribution_port, node, ctl, plugindir  # RabbitMQ-only

    @pytest.fixture(scope="session")
    def rabbitmq_proc_fixture(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[LeveretExecutor]:
        config = get_config(request)
        broker_host = host or config.host
        broker_port = choose_port(port, config.port, broker_host)
        executor: LeveretExecutor
        name = f"leveret-{request.fixturename}"
        if subprocess:
            executor = SubprocessLeveret(tmp_path_factory.mktemp(name), host=broker_host, port=broker_port)
        else:
            path = tmp_path_factory.mktemp(name) if data_dir else None
            executor = InProcessLeveret(broker_host, broker_port, data_dir=path, **overrides)
        executor.start()
        try:
            yield executor
        finally:
            executor.stop()

    return rabbitmq_proc_fixture


def choose_port(spec: PortSpec, configured: int, host: str = "127.0.0.1") -> int:
    """The port to listen on for pytest-rabbitmq's port argument ``spec``; 0 means a
    free one, picked by the kernel when the broker binds. ValueError if a range or set
    has no free port."""
    if spec == -1:
        return configured
    if spec is None:
        return 0
    if isinstance(spec, (int, str)):
        return int(spec)
    candidates: list[int] = []
    for part in spec if isinstance(spec, list) else [spec]:
        if isinstance(part, tuple):
            low, high = part
            candidates.extend(range(int(low), int(high) + 1))
        else:
            candidates.extend(int(p) for p in part)
    random.shuffle(candidates)
    for candidate in candidates:
        if _free(host, candidate):
            return candidate
    raise ValueError(f"no free port in {spec!r}")


def _free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
