"""MQTT over WebSocket, for browser applications (RabbitMQ's Web MQTT plugin, port 15675;
mosquitto's ``protocol websockets`` listener): ``ws://HOST:PORT/ws`` with the
subprotocol ``mqtt`` (MQTT 3.1.1 and 5.0, §6 of both) or ``mqttv3.1`` (what older
clients ask for), served by :mod:`.websocket`.

The WebSocket messages carry the MQTT bytes in binary messages: a packet may span
messages and one message may hold several (MQTT §6.0). A text message closes the
WebSocket with 1003 Unsupported Data, as §6.0 wants ("MUST close the Network
Connection") and RabbitMQ does. An upgrade that asks for no MQTT subprotocol gets
``400 Bad Request``, as RabbitMQ's Web MQTT answers (it takes only ``mqtt``). Before
CONNECT, the bytes read are bounded as on TCP (64 KiB, plus 4 KiB of WebSocket
framing), past which the connection is closed without a word (MQTT has no error before
CONNACK).
"""

from __future__ import annotations

from ..core.broker import BrokerCore
from ..protocol.mqtt.connection import MqttConnection
from ..protocol.mqtt.settings import settings_of
from .websocket import PATH, WebSocketProtocol

__all__ = ["PATH", "SUBPROTOCOLS", "web_mqtt"]

SUBPROTOCOLS = ("mqtt", "mqttv3.1")


def web_mqtt(core: BrokerCore) -> WebSocketProtocol:
    """Web MQTT for :class:`.websocket.WebSocketServer`: a WebSocket message holds at
    most the largest packet the broker accepts (``[mqtt] max_packet_size`` bytes, with
    its fixed header); a larger one closes the WebSocket (1009). The packet itself is
    checked by the MQTT connection (reason code 0x95)."""
    return WebSocketProtocol(
        "Web MQTT",
        MqttConnection,
        SUBPROTOCOLS,
        settings_of(core).max_packet_size + 5,
        subprotocol_required=True,
        text_output=False,
        text_input=False,
    )
