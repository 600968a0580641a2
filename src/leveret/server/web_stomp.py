"""STOMP over WebSocket, for browser applications (RabbitMQ's Web STOMP plugin; ActiveMQ's
``ws`` transport): ``ws://HOST:PORT/ws`` with the subprotocols ``v10.stomp``,
``v11.stomp`` and ``v12.stomp`` (a client may also ask for none), served by
:mod:`.websocket`.

STOMP frames may span WebSocket messages or share one, text or binary. What a connection
writes goes out once per event-loop turn as one text message when it is UTF-8, else as a
binary one (a body with arbitrary bytes), so stomp.js gets exactly the frames a TCP
client gets. Before login the bytes read are bounded as on TCP (64 KiB, plus 4 KiB of
WebSocket framing), past which the client gets an ERROR frame.
"""

from __future__ import annotations

from ..protocol.stomp import StompConnection
from ..protocol.stomp.frames import MAX_BODY, MAX_COMMAND_LINE, MAX_HEADER_LINE, MAX_HEADERS
from .websocket import PATH, WebSocketProtocol

__all__ = ["MAX_MESSAGE", "PATH", "SUBPROTOCOLS", "WEB_STOMP"]

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
#: bytes in one WebSocket message: a whole frame of the largest body with its headers
MAX_MESSAGE = MAX_BODY + MAX_COMMAND_LINE + MAX_HEADERS * (MAX_HEADER_LINE + 1) + 2

#: Web STOMP for :class:`.websocket.WebSocketServer`.
WEB_STOMP = WebSocketProtocol(
    "Web STOMP", StompConnection, SUBPROTOCOLS, MAX_MESSAGE, text_output=True, text_input=True
)
