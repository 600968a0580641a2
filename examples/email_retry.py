"""The e-mail scenario from ActiveMQ's redelivery docs, on leveret with pika.

A producer queues e-mails; a consumer "sends" them and fails on some addresses. A
failed e-mail is rejected with requeue, comes back after an exponential back-off
(200 ms, 400 ms, 800 ms) and, after 3 redeliveries, is a poison message: the
``individual`` dead-letter strategy moves it to ``DLQ.emails``, where
``leveret dlq show DLQ.emails`` and ``leveret dlq replay DLQ.emails`` find it.

    python examples/email_retry.py                      # an embedded broker
    python examples/email_retry.py --url amqp://guest:guest@127.0.0.1:5672/%2F
"""

from __future__ import annotations

import argparse
import json
import time

import pika

QUEUE = "emails"
POLICY = {  # ActiveMQ's redelivery policy, as queue arguments
    "x-max-redeliveries": 3,               # maximumRedeliveries
    "x-redelivery-delay": 200,             # initialRedeliveryDelay, ms
    "x-redelivery-exponential": True,      # useExponentialBackOff
    "x-redelivery-backoff-multiplier": 2,  # backOffMultiplier
    "x-dead-letter-strategy": "individual",  # to DLQ.<queue>
    "x-dead-letter-non-persistent": True,
}
EMAILS = ["ada@example.org", "bob@bounce.example", "cy@example.org", "dee@bounce.example"]


def produce(channel) -> None:
    channel.queue_declare(QUEUE, durable=True, arguments=POLICY)
    channel.confirm_delivery()
    for i, address in enumerate(EMAILS):
        channel.basic_publish("", QUEUE, json.dumps({"to": address, "subject": f"hello {i}"}),
                              pika.BasicProperties(delivery_mode=2, message_id=f"mail-{i}",
                                                   content_type="application/json"))


def consume(connection, channel, seconds: float) -> list[str]:
    """'Send' e-mails for ``seconds``; addresses at bounce.example fail every time."""
    sent = []

    def on_email(ch, method, properties, body) -> None:
        email = json.loads(body)
        attempt = (properties.headers or {}).get("x-delivery-count", 0)
        if email["to"].endswith("@bounce.example"):
            print(f"  attempt {attempt + 1}: sending to {email['to']} failed, retrying later")
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            print(f"  sent {email['subject']!r} to {email['to']}")
            sent.append(email["to"])
            ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=10)
    tag = channel.basic_consume(QUEUE, on_email)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    channel.basic_cancel(tag)
    return sent


def run(url: str, seconds: float = 3.0) -> dict:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    produce(channel)
    sent = consume(connection, connection.channel(), seconds)
    dead = channel.queue_declare(f"DLQ.{QUEUE}", passive=True).method.message_count
    connection.close()
    return {"sent": sent, "dead_lettered": dead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="AMQP URL of a running leveret (default: embedded)")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if args.url:
        result = run(args.url, args.seconds)
    else:
        from leveret import BlockingBroker

        with BlockingBroker(amqp_port=0) as broker:
            result = run(broker.amqp_url, args.seconds)
    print(f"sent: {result['sent']}; in DLQ.{QUEUE}: {result['dead_lettered']}")


if __name__ == "__main__":
    main()
