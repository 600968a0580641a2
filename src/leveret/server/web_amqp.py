"""AMQP 1.0 over WebSocket, for browser applications (Tanzu RabbitMQ 4.1's Web AMQP
plugin, port 15678; the OASIS AMQP WebSocket Binding, WSB 1.0): ``ws://HOST:PORT/ws``
with the subprotocol ``amqp``, served by :mod:`.websocket`.

The WebSocket messages carry the AMQP bytes in binary messages, from the protocol
header on (SASL included): a frame may span messages and one message may hold several.
A text message closes the WebSocket with 1003 Unsupported Data (WSB sends AMQP in
binary messages only). An upgrade that asks for no ``amqp`` subprotocol gets ``400 Bad
Request`` (WSB: the server fails the handshake when it speaks none of the subprotocols
offered). Until the connection is open the bytes read are bounded (64 KiB, plus 4 KiB
of WebSocket framing), counted as they arrive, past which the connection is closed
without a word (on TCP the frames before open are at most 512 bytes, §2.7.1, but aiohttp
assembles a whole WebSocket message before leveret reads it).
"""

from __future__ import annotations

from ..protocol.amqp10.connection import Amqp10Connection
from .websocket import PATH, WebSocketProtocol

__all__ = ["MAX_MESSAGE", "PATH", "SUBPROTOCOLS", "WEB_AMQP"]

SUBPROTOCOLS = ("amqp",)
#: Bytes in one WebSocket message, at most: a client may pack many frames into one
#: (rhea writes one message per output turn), so this is not the AMQP max-frame-size;
#: a larger message closes the WebSocket with 1009 Message Too Big.
MAX_MESSAGE = 16 * 1024 * 1024

#: Web AMQP for :class:`.websocket.WebSocketServer`.
WEB_AMQP = WebSocketProtocol(
    "Web AMQP",
    Amqp10Connection,
    SUBPROTOCOLS,
    MAX_MESSAGE,
    subprotocol_required=True,
    text_output=False,
    text_input=False,
    # until open: the SASL exchange, then the AMQP header and open (a frame is at most
    # 512 bytes until then, but aiohttp would assemble a whole message first)
    prelogin_states=("header", "sasl", "refusing", "amqp-header", "opening"),
)
