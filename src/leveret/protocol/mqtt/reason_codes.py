"""MQTT 5.0 reason codes (§2.4, table 2-6) the adapter sends, and the MQTT 3.1.1
CONNACK return codes (3.1.1 §3.2.2.3) they become for a 3.1.1 client."""

from __future__ import annotations

from .packets import MALFORMED, PACKET_TOO_LARGE, PROTOCOL_ERROR, UNSUPPORTED_PROTOCOL_VERSION

SUCCESS = 0x00
GRANTED_QOS_0 = 0x00
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED = 0x80
IMPLEMENTATION_SPECIFIC = 0x83
CLIENT_ID_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
#: 3.1.1's SUBACK code for a refused subscription.
SUBSCRIPTION_FAILURE_3 = 0x80

__all__ = ["MALFORMED", "PACKET_TOO_LARGE", "PROTOCOL_ERROR", "UNSUPPORTED_PROTOCOL_VERSION"]

_CONNACK_3 = {
    UNSUPPORTED_PROTOCOL_VERSION: 1,
    CLIENT_ID_NOT_VALID: 2,
    SERVER_UNAVAILABLE: 3,
    SERVER_BUSY: 3,
    QUOTA_EXCEEDED: 3,
    # a wrong password: 5 (not authorized) as mosquitto 2.0 answers 3.1.1 clients
    # (RabbitMQ 3.10: 4); an MQTT 5 client gets 0x86, the spec's code for it, where
    # mosquitto says 0x87
    BAD_USER_NAME_OR_PASSWORD: 5,
    BAD_AUTHENTICATION_METHOD: 4,
    NOT_AUTHORIZED: 5,
}


def connack_code(reason_code: int, version: int) -> int:
    """The CONNACK code for ``reason_code`` at protocol level ``version`` (4: 3.1.1's
    return codes 1-5; 5: the reason code itself)."""
    if version == 5 or reason_code == SUCCESS:
        return reason_code
    return _CONNACK_3.get(reason_code, 3)
