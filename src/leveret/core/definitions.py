"""Durable definitions as field tables for the store (their recovery at start-up:
:mod:`.recovery`)."""

from __future__ import annotations

from .exchange import Binding, Exchange, freeze
from .queues import Queue


def exchange_definition(exchange: Exchange) -> dict:
    """A durable exchange as the store keeps it (a field table)."""
    return {
        "type": exchange.type,
        "durable": True,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": exchange.arguments,
    }


def queue_definition(queue: Queue) -> dict:
    """A durable queue as the store keeps it: its store ``queue_id``, ``auto_delete`` and
    declared ``arguments`` (durable is implied; exclusive queues are never saved)."""
    return {"queue_id": queue.queue_id, "auto_delete": queue.auto_delete, "arguments": queue.arguments}


def binding_name(binding: Binding) -> str:
    """The store key of a binding: source, destination kind and name, routing key and
    arguments, NUL-separated (unique per binding, as its identity in the exchange)."""
    kind = "queue" if isinstance(binding.destination, Queue) else "exchange"
    return "\x00".join(
        (
            binding.source.name,
            kind,
            binding.destination.name,
            binding.routing_key,
            repr(freeze(binding.arguments)),
        )
    )


def binding_definition(binding: Binding) -> dict:
    """A durable binding as the store keeps it (a field table)."""
    kind = "queue" if isinstance(binding.destination, Queue) else "exchange"
    return {
        "source": binding.source.name,
        "destination_type": kind,
        "destination": binding.destination.name,
        "routing_key": binding.routing_key,
        "arguments": binding.arguments,
    }
