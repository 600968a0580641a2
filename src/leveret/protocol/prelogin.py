"""What a client may make the broker do before it has logged in: the limits every
protocol adapter applies until authentication succeeds (AMQP 0-9-1 and STOMP now; MQTT
and AMQP 1.0 adapters are meant to take theirs from here too).

Before login a peer is nobody: whatever it sends is held, parsed and answered at the
broker's expense. So until then the bytes held for one connection, the size of the one
frame that logs in, the time allowed to log in and the work spent decoding are small and
fixed, whatever the limits after login are (RabbitMQ does the same for AMQP: frame_max
is 4,096 bytes until connection.tune-ok, and a connection must finish its handshake
within ``handshake_timeout``, 10 s). Past a limit the adapter answers with its protocol's
error (AMQP: connection.close 501 FRAME_ERROR, or 502 SYNTAX_ERROR for a field table
refused while decoding; STOMP: an ERROR frame) and closes the socket.

- :data:`AMQP_FRAME_MAX`: 4,096 bytes per frame until tune-ok (RabbitMQ's
  ``?FRAME_MIN_SIZE``, also the smallest frame_max a client may ask for). RabbitMQ
  closes the socket without a word; leveret says ``501 FRAME_ERROR`` first.
- :data:`MAX_BYTES`: 65,536 bytes held for a STOMP connection (TCP or WebSocket) until
  its CONNECT frame is complete. A CONNECT is a command, a few headers (a long OAuth
  token fits) and usually no body. ActiveMQ and RabbitMQ's STOMP apply their normal
  frame limits before login (ActiveMQ: 100 MiB).
- MQTT (the codec so far, :class:`leveret.protocol.mqtt.packets.PacketReader`): a packet
  before CONNECT is read, the CONNECT itself included, is at most :data:`MAX_BYTES`,
  refused from its fixed header (reason code 0x95) before its body is held.
- :data:`HANDSHAKE_TIMEOUT`: 10 s to log in over AMQP (RabbitMQ's ``handshake_timeout``);
  :data:`STOMP_CONNECT_TIMEOUT`: 30 s to send CONNECT (ActiveMQ's default).
- Field tables nest at most :data:`leveret.amqp.field_table.MAX_NESTING` (64) levels,
  refused while walking the bytes, before any value is built
  (:func:`leveret.amqp.field_table.check_table`): a refused start-ok costs well under
  1 ms.

:data:`HEARTBEAT_FLOOR` is not a pre-login limit but is chosen at login: the shortest
STOMP heart-beat interval the broker agrees to, 1 s, as RabbitMQ's STOMP (which rounds
any interval below 1,000 ms up to one second); a client asking for 1 ms gets 1,000 ms in
its CONNECTED frame (and one asking for more than 24.8 days gets 2**31 - 1 ms).
"""

from __future__ import annotations

#: Bytes per AMQP frame (with its 8 bytes of overhead) until connection.tune-ok
#: (RabbitMQ: ``?FRAME_MIN_SIZE``).
AMQP_FRAME_MAX = 4096
#: Bytes held for a STOMP connection before its CONNECT frame is complete.
MAX_BYTES = 64 * 1024
#: Seconds an AMQP connection has to log in and open (RabbitMQ's handshake_timeout).
HANDSHAKE_TIMEOUT = 10.0
#: Seconds a STOMP connection has to send CONNECT (ActiveMQ's default).
STOMP_CONNECT_TIMEOUT = 30.0
#: Milliseconds: the shortest STOMP heart-beat interval agreed to, either way (RabbitMQ).
HEARTBEAT_FLOOR = 1000
#: Milliseconds: the longest (2**31 - 1, 24.8 days; a header of 400 digits overflowed
#: the timer's float and cost an internal error).
HEARTBEAT_CEILING = 2**31 - 1


def over_limit(buffered: int, limit: int = MAX_BYTES) -> bool:
    """Whether ``buffered`` bytes, held for a connection that has not logged in, are
    more than it may hold (``limit`` bytes): the adapter then answers with its error
    and closes."""
    return buffered > limit


def heartbeat_interval(milliseconds: int, floor: int = HEARTBEAT_FLOOR) -> int:
    """A heart-beat interval agreed to, in ms: 0 stays 0 (none), anything shorter than
    ``floor`` becomes ``floor`` (RabbitMQ's STOMP rounds up to one second likewise), and
    anything longer than :data:`HEARTBEAT_CEILING` becomes that."""
    return 0 if milliseconds <= 0 else min(max(milliseconds, floor), HEARTBEAT_CEILING)
