"""A producer and a consumer on an ActiveMQ queue, with stomp.py.

The ActiveMQ scenario: a shop sends orders to ``/queue/orders``. Each SEND is
``persistent:true`` and asks for a ``receipt``: the producer counts an order as sent
only once the broker has answered RECEIPT. A worker subscribes with
``ack:client-individual`` and ACKs every order once it is handled; an order it has
not ACKed would be given to another worker if it died (see
client_ack_redelivery.py).

What leveret does: the same frames give the same answers. ``/queue/orders`` is created
durable on first use, with ActiveMQ's redelivery policy. A RECEIPT for a persistent
message means the message is on disk (written and fsynced with the others of the same
moment), so an order that got its RECEIPT survives a crash of the broker. MESSAGE frames
carry ActiveMQ's headers: ``message-id``, ``destination``, ``persistent``, ``priority``,
``timestamp``, ``expires``, ``subscription``, ``ack``, and the producer's own headers.

    python examples/stomp/queue_producer_consumer.py                     # embedded leveret
    python examples/stomp/queue_producer_consumer.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

import json

from stomp_common import arguments, connect, target

QUEUE = "/queue/orders"


def produce(host: str, port: int, count: int, login: str, passcode: str) -> list[str]:
    """Send ``count`` persistent orders, each confirmed by its RECEIPT; their bodies."""
    conn, inbox = connect(host, port, login, passcode)
    bodies = []
    for number in range(1, count + 1):
        body = json.dumps({"order": number, "item": f"widget-{number}", "quantity": number})
        conn.send(QUEUE, body, content_type="application/json", persistent="true",
                  headers={"order-number": str(number), "receipt": f"order-{number}"})
        bodies.append(body)
    for number in range(1, count + 1):  # every order is safe with the broker
        inbox.receipt(f"order-{number}")
    conn.disconnect(receipt="bye")
    return bodies


def consume(host: str, port: int, count: int, login: str, passcode: str) -> list[dict]:
    """Take ``count`` orders, ACK each one; what each MESSAGE said."""
    conn, inbox = connect(host, port, login, passcode)
    conn.subscribe(QUEUE, id="orders-worker", ack="client-individual", receipt="subscribed")
    inbox.receipt("subscribed")
    received = []
    for frame in inbox.take(count):
        order = json.loads(frame.body)
        print(f"  handled order {order['order']}: {order['quantity']} x {order['item']}")
        received.append({"body": frame.body, "headers": dict(frame.headers)})
        conn.ack(frame.headers["ack"])  # this order is done: the broker forgets it
    # With a receipt, stomp.py's disconnect() returns once the broker has answered, so the
    # ACKs before it are taken; without one it returns at once. Every example asks for one.
    conn.disconnect(receipt="bye")
    return received


def leftover(host: str, port: int, login: str, passcode: str) -> int:
    """How many orders a new worker still finds (none: every order was acknowledged)."""
    conn, inbox = connect(host, port, login, passcode)
    conn.subscribe(QUEUE, id="check", ack="client-individual", receipt="subscribed")
    inbox.receipt("subscribed")
    left = len(inbox.rest(quiet=0.3))
    conn.disconnect(receipt="bye")
    return left


def run(host: str, port: int, login: str = "guest", passcode: str = "guest", count: int = 5) -> dict:
    sent = produce(host, port, count, login, passcode)
    print(f"sent {len(sent)} orders, every one confirmed by a RECEIPT")
    received = consume(host, port, count, login, passcode)
    return {"sent": sent, "received": received, "leftover": leftover(host, port, login, passcode)}


def main() -> None:
    args = arguments(__doc__, count={"type": int, "default": 5, "help": "orders to send"})
    with target(args.url) as broker:
        result = run(broker.host, broker.port, broker.login, broker.passcode, args.count)
    print(f"received {len(result['received'])} orders; left in {QUEUE}: {result['leftover']}")


if __name__ == "__main__":
    main()
