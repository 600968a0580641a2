"""The MQTT adapter's settings (``[mqtt]`` in the configuration file), with RabbitMQ's
MQTT plugin's names and defaults where it has them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...core.broker import BrokerCore


@dataclass
class MqttSettings:
    """What MQTT clients get. Sizes in bytes, times in seconds."""

    #: The topic exchange MQTT topics are routing keys of (RabbitMQ's ``mqtt.exchange``).
    exchange: str = "amq.topic"
    #: The vhost of a client that names none (``vhost:user``) and whose port is not
    #: mapped (RabbitMQ's ``mqtt.vhost``).
    vhost: str = "/"
    #: Listening port -> vhost (RabbitMQ's ``mqtt_port_to_vhost_mapping`` parameter).
    port_vhosts: dict[int, str] = field(default_factory=dict)
    #: A client without credentials logs in as this user (RabbitMQ's
    #: ``mqtt.allow_anonymous``, ``mqtt.default_user`` and ``mqtt.default_pass``); like
    #: any ``guest`` login, only from loopback unless ``loopback_users`` says otherwise.
    allow_anonymous: bool = True
    default_user: str = "guest"
    default_pass: str = "guest"
    #: A verified TLS client certificate names the user (RabbitMQ's ``mqtt.ssl_cert_login``).
    ssl_cert_login: bool = True
    #: QoS 1 and 2 messages in flight to a client that sets no Receive Maximum (3.1.1
    #: clients): RabbitMQ's ``mqtt.prefetch`` is 10, mosquitto's max_inflight_messages 20.
    prefetch: int = 1000
    #: QoS 1 and 2 PUBLISHes a client may have unacknowledged towards the broker (the
    #: CONNACK's Receive Maximum, MQTT 5): more is a protocol error (0x93).
    receive_maximum: int = 1024
    #: Topic aliases a client may set up (the CONNACK's Topic Alias Maximum; mosquitto's
    #: default is 10).
    topic_alias_maximum: int = 10
    #: The largest packet accepted (the CONNACK's Maximum Packet Size): larger is
    #: refused with 0x95 and the connection closed.
    max_packet_size: int = 16 * 1024 * 1024
    #: The longest session expiry interval granted (RabbitMQ's
    #: ``mqtt.max_session_expiry_interval_seconds``, one day). A 3.1.1 persistent session
    #: never expires (MQTT 3.1.1 has no expiry; RabbitMQ applies its maximum to them too).
    max_session_expiry: int = 86400
    #: The longest keep alive granted, in seconds (0: what the client asks): a client
    #: asking for more, or for none, is told this one in the CONNACK's Server Keep
    #: Alive (MQTT 5; 3.1.1 clients keep theirs). RabbitMQ 3.13's ``mqtt.max_keepalive``.
    max_keep_alive: int = 0
    #: Seconds a client has to send CONNECT after the TCP connection opens (RabbitMQ's
    #: handshake timeout is 10 s).
    connect_timeout: float = 10.0


def settings_of(core: BrokerCore) -> MqttSettings:
    """The broker's MQTT settings (the defaults until configured)."""
    settings = core.adapter_settings.get("mqtt")
    if not isinstance(settings, MqttSettings):
        settings = core.adapter_settings["mqtt"] = MqttSettings()
    return settings


def mqtt_settings(table: dict) -> MqttSettings:
    """Settings from a ``[mqtt]`` table (keys as the fields; ``port_vhosts`` a table of
    port = vhost). Raises ValueError for an unknown key or a value of the wrong type."""
    settings = MqttSettings()
    for key, value in table.items():
        if key not in MqttSettings.__dataclass_fields__:
            raise ValueError(f"unknown key {key!r}")
        default = getattr(settings, key)
        if key == "port_vhosts":
            if not isinstance(value, dict):
                raise ValueError("port_vhosts must be a table of port = vhost")
            value = {int(port): str(vhost) for port, vhost in value.items()}
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
        elif isinstance(default, (int, float)) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            raise ValueError(f"{key} must be a number")
        elif isinstance(default, str) and not isinstance(value, str):
            raise ValueError(f"{key} must be a string")
        limits = _RANGES.get(key)
        if limits is not None and not limits[0] <= value <= limits[1]:
            raise ValueError(f"{key} must be between {limits[0]} and {limits[1]}")
        setattr(settings, key, value)
    return settings


#: What the wire can carry (MQTT 5.0's two- and four-byte fields, the varint) and what
#: makes sense: a window of 0 would deliver no QoS 1/2 message at all.
_RANGES: dict[str, tuple[float, float]] = {
    "prefetch": (1, 65535),
    "receive_maximum": (1, 65535),
    "topic_alias_maximum": (0, 65535),
    "max_packet_size": (64, 268_435_460),
    "max_session_expiry": (0, 0xFFFFFFFF),
    "max_keep_alive": (0, 65535),
    "connect_timeout": (0.001, 3600),
}
