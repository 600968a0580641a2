"""ActiveMQ's message groups: messages with the same ``JMSXGroupID`` header go to one
consumer, in order, while it lives; a message with ``JMSXGroupSeq`` -1 closes the
group (the next one may go elsewhere). A queue keeps its groups in
:mod:`.queues.features.groups` and dispatches them in :mod:`.queues.classic`; this
module reads a message's group cheaply.
"""

from __future__ import annotations

from .message import NEUTRAL, Message

GROUP_ID = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"
GROUP_ID_BYTES = GROUP_ID.encode()  # in an encoded form that may hold a group


def message_group(message: Message) -> tuple[str, int | None] | None:
    """``(group id, JMSXGroupSeq or None)`` of a message in a group, else None. A
    message whose encoded form does not mention the header costs one substring search
    (the properties are decoded only for those that do)."""
    if message.format is not NEUTRAL and GROUP_ID_BYTES not in message.encoded:
        return None
    headers = message.headers
    group = headers.get(GROUP_ID)
    if isinstance(group, (bytes, bytearray)):
        group = bytes(group).decode(errors="replace")
    if not isinstance(group, str) or not group:
        return None
    sequence = headers.get(GROUP_SEQ)
    try:
        number = int(sequence) if sequence is not None else None
    except (TypeError, ValueError):
        number = None
    return group, number
