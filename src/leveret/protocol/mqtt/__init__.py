"""MQTT 3.1.1 and 5.0 (OASIS standards): the packet codec, sans-I/O.

:mod:`leveret.protocol.mqtt.packets` turns bytes into packet objects and back, for
protocol level 4 (MQTT 3.1.1) and 5 (MQTT 5.0), and refuses malformed input with
:class:`~leveret.protocol.mqtt.packets.MalformedPacket`. Nothing here is wired into the
server yet: the adapter that drives core (sessions, QoS 1 and 2, retained messages) is to
come (issue 28).
"""

from __future__ import annotations
