"""leveret's protocol-independent core: virtual hosts, exchanges, queues, routing."""

from .broker import BrokerCore, Limits
from .message import Message
from .queues import Queue
from .vhost import VirtualHost

__all__ = ["BrokerCore", "Limits", "Message", "Queue", "VirtualHost"]
