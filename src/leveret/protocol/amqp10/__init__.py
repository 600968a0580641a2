"""AMQP 1.0 (OASIS/ISO 19464): the codec so far, sans-I/O.

:mod:`~leveret.protocol.amqp10.types` is the type system (every primitive encoding,
described types, arrays), :mod:`~leveret.protocol.amqp10.performatives` the composite
types (performatives, SASL frames, error, source and target, delivery states, message
sections) as dataclasses, and :mod:`~leveret.protocol.amqp10.frames` the protocol headers,
frames and :class:`~leveret.protocol.amqp10.frames.FrameReader`. Errors are
:class:`~leveret.protocol.amqp10.types.DecodeError` with the AMQP error condition to close
with. The connection, session and link state machine and the server wiring are to come
(issue 29).
"""

from __future__ import annotations
