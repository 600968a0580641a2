"""paho-mqtt 2.x clients driven from synchronous tests: connect and get the CONNACK
code, publish and get the PUBACK reason code, subscribe and get the SUBACK codes, and
see how the broker ended the connection (DISCONNECT reason code, socket closed).

Codes are plain ints as sent on the wire: a 3.1.1 CONNACK return code (0-5, read with
``CallbackAPIVersion.VERSION1``, which hands it over unconverted), MQTT 5.0 reason
codes otherwise.
"""

from __future__ import annotations

import queue
import time
import warnings
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

V311, V5 = 4, 5


def _code(reason: Any) -> int:
    return int(getattr(reason, "value", reason))


class Client:
    """One paho client on ``port`` (MQTT 3.1.1 with ``version=4``, 5.0 with 5), from
    ``source`` (a local address, default any); its network loop runs on paho's thread,
    events go through queues."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        version: int = V5,
        username: str | None = None,
        password: str | None = None,
        host: str = "127.0.0.1",
        clean: bool = True,
        source: str = "",
    ) -> None:
        self.port, self.host, self.version, self.source = port, host, version, source
        protocol = mqtt.MQTTv5 if version == V5 else mqtt.MQTTv311
        api = mqtt.CallbackAPIVersion.VERSION2 if version == V5 else mqtt.CallbackAPIVersion.VERSION1
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": protocol, "reconnect_on_failure": False}
        if version != V5:
            kwargs["clean_session"] = clean
        self.clean = clean
        with warnings.catch_warnings():  # VERSION1 is deprecated, and what 3.1.1 users have
            warnings.simplefilter("ignore", DeprecationWarning)
            self.paho = mqtt.Client(api, **kwargs)
        if username is not None:
            self.paho.username_pw_set(username, password)
        self.connacks: queue.Queue[int] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.acks: dict[int, queue.Queue[int]] = {}
        self.subacks: dict[int, queue.Queue[list[int]]] = {}
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = lambda client, userdata, message: self.messages.put(message)
        self.paho.on_publish = self._on_publish
        self.paho.on_subscribe = self._on_subscribe

    # paho callbacks (its thread)
    def _on_connect(self, client: Any, userdata: Any, flags: Any, code: Any, properties: Any = None) -> None:
        self.connacks.put(_code(code))

    def _on_disconnect(self, client: Any, userdata: Any, *args: Any) -> None:
        # VERSION1: (rc); VERSION2: (flags, reason_code, properties)
        code = args[1] if len(args) >= 2 else args[0]
        self.disconnects.put(_code(code))

    def _on_publish(self, client: Any, userdata: Any, mid: int, *args: Any) -> None:
        code = _code(args[0]) if args else 0
        self.acks.setdefault(mid, queue.Queue()).put(code)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, granted: Any, *args: Any) -> None:
        self.subacks.setdefault(mid, queue.Queue()).put([_code(g) for g in granted])

    # the test's side
    def connect(self, keepalive: int = 60, timeout: float = 5.0, session_expiry: int | None = None) -> int:
        """The CONNACK code (0: accepted); -1 if the socket closed without one."""
        kwargs: dict[str, Any] = {"keepalive": keepalive, "bind_address": self.source}
        if self.version == V5:
            kwargs["clean_start"] = self.clean
            if session_expiry is not None:
                properties = Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = session_expiry
                kwargs["properties"] = properties
        self.paho.connect(self.host, self.port, **kwargs)
        self.paho.loop_start()
        try:
            return self.connacks.get(timeout=timeout)
        except queue.Empty:
            if not self.disconnects.empty():
                return -1
            raise

    def publish(self, topic: str, payload: bytes, qos: int = 1, timeout: float = 5.0) -> int | None:
        """PUBACK's reason code for QoS 1 (0 for 3.1.1), None if the connection closed
        (or nothing came within ``timeout`` s) instead."""
        info = self.paho.publish(topic, payload, qos)
        if qos == 0:
            return 0
        waiting = self.acks.setdefault(info.mid, queue.Queue())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return waiting.get(timeout=0.02)
            except queue.Empty:
                if not self.disconnects.empty():
                    return None
        return None

    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 5.0) -> list[int]:
        """The SUBACK's codes (granted QoS, or 0x80 / a 5.0 reason code)."""
        _, mid = self.paho.subscribe(topic_filter, qos)
        return self.subacks.setdefault(mid, queue.Queue()).get(timeout=timeout)

    def message(self, timeout: float = 5.0) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def disconnected(self, timeout: float = 5.0) -> int:
        """How the connection ended: the DISCONNECT's reason code (5.0) or paho's rc."""
        return self.disconnects.get(timeout=timeout)

    def close(self) -> None:
        if self.paho.is_connected():
            self.paho.disconnect()
        self.paho.loop_stop()


def connack(port: int, version: int = V5, **kwargs: Any) -> int:
    """The CONNACK code one CONNECT gets (the client is closed after)."""
    client = Client(port, version=version, **kwargs)
    try:
        return client.connect()
    finally:
        client.close()
