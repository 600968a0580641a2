"""pytest-rabbitmq 5's fixtures, backed by leveret instead of a RabbitMQ node.

Switch them on with ``--leveret-rabbitmq`` (or ini ``leveret_rabbitmq = true``, or
``LEVERET_RABBITMQ=1``): the ``rabbitmq_proc`` and ``rabbitmq`` fixtures then come
from :mod:`leveret.testing.rabbitmq.plugin`, over pytest-rabbitmq's if it is also
installed. Or build them in a conftest.py, as with pytest-rabbitmq::

    from leveret.testing.rabbitmq import factories

    rabbitmq_my_proc = factories.rabbitmq_proc(port=None)
    rabbitmq_my = factories.rabbitmq("rabbitmq_my_proc")

See docs/testing.md.
"""

from . import factories
from .executor import InProcessLeveret, LeveretExecutor, SubprocessLeveret

__all__ = ("InProcessLeveret", "LeveretExecutor", "SubprocessLeveret", "factories")
