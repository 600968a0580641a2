"""pytest-rabbitmq's fixture factories, on leveret: ``rabbitmq_proc(...)`` and
``rabbitmq(process_fixture_name, teardown=...)``, same names and arguments as
``pytest_rabbitmq.factories``."""

from .client import clear_rabbitmq, rabbitmq
from .process import rabbitmq_proc

__all__ = ("clear_rabbitmq", "rabbitmq", "rabbitmq_proc")
