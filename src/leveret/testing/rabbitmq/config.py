"""pytest-rabbitmq's settings, read by the leveret fixtures.

The ini and command-line names are pytest-rabbitmq's (``rabbitmq_host`` /
``--rabbitmq-host``, ``rabbitmq_port`` / ``--rabbitmq-port``), so a project's existing
configuration keeps working; the command line wins over the ini file, as there.
The RabbitMQ-only ones (``rabbitmq_server``, ``rabbitmq_ctl``, ``rabbitmq_node``,
``rabbitmq_plugindir``, ``rabbitmq_distribution_port``,
``rabbitmq_port_search_count``) are accepted and ignored.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import pytest

#: (name, help) of pytest-rabbitmq's settings; declared by :func:`add_options` only
#: when pytest-rabbitmq's plugin is not loaded (it declares the same ones).
OPTIONS = (
    ("host", "Address the test broker listens on [127.0.0.1]"),
    ("port", "AMQP port of the test broker [a free one]"),
    ("port_search_count", "pytest-rabbitmq's port search attempts (ignored by leveret)"),
    ("distribution_port", "Erlang distribution port (ignored by leveret)"),
    ("ctl", "Path of rabbitmqctl (ignored by leveret)"),
    ("server", "Path of rabbitmq-server (ignored by leveret)"),
    ("plugindir", "RabbitMQ's enabled-plugins directory (ignored by leveret)"),
    ("node", "RabbitMQ node name (ignored by leveret)"),
)


def pytest_rabbitmq_loaded(pluginmanager: pytest.PytestPluginManager) -> bool:
    """Whether pytest-rabbitmq's plugin is, or will be, registered in this run (and so
    declares the ``rabbitmq_*`` options): already registered (``-p``), or installed,
    not blocked (``-p no:pytest_rabbitmq``) and plugin autoloading on."""
    if pluginmanager.has_plugin("pytest_rabbitmq") or pluginmanager.has_plugin("pytest_rabbitmq.plugin"):
        return True
    if importlib.util.find_spec("pytest_rabbitmq") is None or pluginmanager.is_blocked("pytest_rabbitmq"):
        return False
    return not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")


def add_options(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare pytest-rabbitmq's ini and command-line names, unless its plugin is
    loaded (two declarations of one option are an error)."""
    if pytest_rabbitmq_loaded(pluginmanager):
        return
    group = parser.getgroup("rabbitmq", "pytest-rabbitmq's settings (leveret reads host and port)")
    for name, help_text in OPTIONS:
        try:
            group.addoption(f"--rabbitmq-{name.replace('_', '-')}", dest=f"rabbitmq_{name}", help=help_text)
        except ValueError:  # declared already: pytest-rabbitmq's plugin came first after all
            return
        parser.addini(f"rabbitmq_{name}", help_text, default=None)


@dataclass(frozen=True)
class RabbitMQConfig:
    """The settings leveret uses: the address to listen on and the AMQP port (0: a
    free one)."""

    host: str
    port: int


def get_config(request: pytest.FixtureRequest) -> RabbitMQConfig:
    """Read ``rabbitmq_host`` and ``rabbitmq_port`` (command line first, then ini),
    defaulting to 127.0.0.1 and a free port when they are not set or not declared."""

    def option(name: str) -> str | None:
        value = request.config.getoption(f"rabbitmq_{name}", default=None)
        if value:
            return str(value)
        try:
            ini = request.config.getini(f"rabbitmq_{name}")
        except ValueError:  # not declared (pytest-rabbitmq installed but disabled)
            return None
        return str(ini) if ini else None

    port = option("port")
    return RabbitMQConfig(host=option("host") or "127.0.0.1", port=int(port) if port else 0)
