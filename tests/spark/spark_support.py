"""Helpers shared by the Spark tests (a module of its own: two conftest.py files cannot
both be imported as ``conftest``)."""

from __future__ import annotations


def drain(channel, queue: str, timeout: float = 1.0) -> list:
    """Every message of ``queue`` as (method, properties, body), acknowledged."""
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((method, properties, body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    return got
