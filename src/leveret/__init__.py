"""leveret: an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged."""

__version__ = "0.1.0"

from .server.broker import BlockingBroker, Broker  # noqa: E402

__all__ = ["Broker", "BlockingBroker", "__version__"]
