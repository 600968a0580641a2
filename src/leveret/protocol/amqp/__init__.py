"""AMQP 0-9-1 with RabbitMQ's extensions."""

from .connection import Connection

__all__ = ["Connection"]
