"""The ``rabbitmq_proc`` and ``rabbitmq`` fixtures of pytest-rabbitmq, on leveret.

Registered by leveret's pytest plugin when the switch is on (``--leveret-rabbitmq``,
ini ``leveret_rabbitmq = true`` or ``LEVERET_RABBITMQ=1``), or load it yourself with
``-p leveret.testing.rabbitmq.plugin``. ``rabbitmq_proc`` is session-scoped and runs
leveret in the test process; ``rabbitmq`` yields a pika ``BlockingConnection`` and
empties vhost ``/`` after each test.
"""

from .factories import rabbitmq as _rabbitmq_factory, rabbitmq_proc as _rabbitmq_proc_factory

rabbitmq_proc = _rabbitmq_proc_factory()
rabbitmq = _rabbitmq_factory("rabbitmq_proc")
