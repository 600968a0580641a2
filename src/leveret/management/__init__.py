"""The HTTP management API: a read-mostly subset of RabbitMQ's, on aiohttp."""

from .api import ManagementAPI

__all__ = ["ManagementAPI"]
