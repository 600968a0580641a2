"""The STOMP 1.0-1.2 adapter (ActiveMQ's semantics), sans-I/O: :mod:`.frames` reads and
writes frames, :mod:`.connection` is one client's state machine over core,
:mod:`.message` is STOMP's message format, :mod:`.destinations` maps ActiveMQ's names
onto queues and exchanges, :mod:`.subscription` is core's Consumer for a SUBSCRIBE."""

from .connection import StompConnection

__all__ = ["StompConnection"]
