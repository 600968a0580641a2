"""Publish/subscribe on ActiveMQ topics with wildcards, with stomp.py.

The ActiveMQ scenario: a price feed publishes to ``/topic/prices.<region>``
(``prices.europe``, ``prices.asia``, and one level deeper, ``prices.europe.fx``). Two
dashboards subscribe with ActiveMQ's wildcards, where ``.`` separates the words of a
name:

- ``/topic/prices.*``: ``*`` is exactly one word: every region, not ``prices.europe.fx``;
- ``/topic/prices.>``: ``>`` is every word that follows: all of them.

A topic keeps nothing for subscribers that are not there (durable_subscriber.py does),
so both subscribe before the feed publishes, each SUBSCRIBE confirmed by its RECEIPT.
Each subscriber gets its own copy; a MESSAGE's ``destination`` is the topic it was
published to, not the wildcard.

What leveret does: the same. A ``/topic/a.b`` is the routing key ``a.b`` on the
``amq.topic`` exchange (``>`` is AMQP's ``#``), so an AMQP program bound to ``amq.topic``
with ``prices.#`` gets the same prices; each subscription is a private queue that goes
with it.

    python examples/stomp/topic_pubsub.py                     # embedded leveret
    python examples/stomp/topic_pubsub.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

from stomp_common import arguments, connect, target

PRICES = [  # (topic, body)
    ("/topic/prices.europe", "EURO STOXX 50 4890.5"),
    ("/topic/prices.asia", "NIKKEI 225 38210.0"),
    ("/topic/prices.europe.fx", "EUR/USD 1.0842"),
    ("/topic/prices.america", "S&P 500 5210.3"),
]


def run(host: str, port: int, login: str = "guest", passcode: str = "guest") -> dict:
    subscribers = {}
    for pattern in ("/topic/prices.*", "/topic/prices.>"):
        conn, inbox = connect(host, port, login, passcode)
        conn.subscribe(pattern, id="dashboard", ack="auto", receipt="subscribed")
        inbox.receipt("subscribed")  # subscribed before anything is published
        subscribers[pattern] = (conn, inbox)

    feed, feed_inbox = connect(host, port, login, passcode)
    for number, (topic, body) in enumerate(PRICES):
        feed.send(topic, body, receipt=f"price-{number}")
    for number in range(len(PRICES)):
        feed_inbox.receipt(f"price-{number}")
    feed.disconnect(receipt="bye")

    got = {}
    for pattern, (conn, inbox) in subscribers.items():
        # everything the subscriber gets until nothing more comes for 0.3 s
        got[pattern] = [(frame.headers["destination"], frame.body) for frame in inbox.rest(quiet=0.3)]
        conn.disconnect(receipt="bye")
        print(f"{pattern} got:")
        for destination, body in got[pattern]:
            print(f"  {destination}: {body}")
    return got


def main() -> None:
    args = arguments(__doc__)
    with target(args.url) as broker:
        run(broker.host, broker.port, broker.login, broker.passcode)


if __name__ == "__main__":
    main()
