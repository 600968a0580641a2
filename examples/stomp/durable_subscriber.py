"""A durable topic subscriber that goes away and comes back, with stomp.py.

The ActiveMQ scenario: an archiver must keep every trade published to
``/topic/trades``, even those published while it is down. It CONNECTs with a
``client-id`` (``trade-archiver``) and SUBSCRIBEs with
``activemq.subscriptionName:archive``: that pair names a durable subscription, which
the broker keeps while the archiver is away. The archiver gets a trade, disconnects;
three more are published; it connects again with the same client-id, subscribes with
the same name, and gets the three it missed. When the archive is retired it removes
the subscription: UNSUBSCRIBE the ``id`` (the archiver stops listening), then
UNSUBSCRIBE with ``activemq.subscriptionName`` (the broker forgets the subscription:
what is published next is kept for nobody).

The trades are sent ``persistent:true``: only persistent messages wait for an absent
durable subscriber across a restart of the broker.

What leveret does: the same frames, the same answers. The subscription is the durable
queue ``durable.trade-archiver.archive``, bound to the topic: it keeps what was
published across leveret restarts, the management API lists it with its message count,
and its messages go through the redelivery policy like any queue's. Like ActiveMQ, one
consumer at a time, and a second connection with a client-id in use is refused.

    python examples/stomp/durable_subscriber.py                     # embedded leveret
    python examples/stomp/durable_subscriber.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

from stomp_common import arguments, connect, target

TOPIC = "/topic/trades"
CLIENT_ID = "trade-archiver"
NAME = "archive"


def archiver(host: str, port: int, login: str, passcode: str):
    """The archiver connected and subscribed durably: (connection, inbox)."""
    conn, inbox = connect(host, port, login, passcode, **{"client-id": CLIENT_ID})
    conn.subscribe(TOPIC, id="archive-sub", ack="client-individual", receipt="subscribed",
                   headers={"activemq.subscriptionName": NAME})
    inbox.receipt("subscribed")
    return conn, inbox


def publish(host: str, port: int, login: str, passcode: str, trades: list[str]) -> None:
    conn, inbox = connect(host, port, login, passcode)
    for number, trade in enumerate(trades):
        conn.send(TOPIC, trade, persistent="true", receipt=f"trade-{number}")
    for number in range(len(trades)):
        inbox.receipt(f"trade-{number}")
    conn.disconnect(receipt="bye")


def take_all(conn, inbox) -> list[str]:
    """Every trade that comes until none has for a moment, each ACKed."""
    trades = []
    for frame in inbox.rest(quiet=0.5):
        trades.append(frame.body)
        conn.ack(frame.headers["ack"])
    return trades


def run(host: str, port: int, login: str = "guest", passcode: str = "guest") -> dict:
    # 1. online: the subscription is created and gets what is published
    conn, inbox = archiver(host, port, login, passcode)
    publish(host, port, login, passcode, ["trade 1: BUY 100 ACME"])
    online = take_all(conn, inbox)
    print(f"online, the archiver got {online}")
    conn.disconnect(receipt="bye")  # away: the broker keeps the subscription

    # 2. offline: published while nobody listens
    publish(host, port, login, passcode,
            ["trade 2: SELL 50 ACME", "trade 3: BUY 10 INITECH", "trade 4: SELL 10 INITECH"])

    # 3. back with the same client-id and subscription name: the missed trades
    conn, inbox = archiver(host, port, login, passcode)
    caught_up = take_all(conn, inbox)
    print(f"back, the archiver got what it missed: {caught_up}")

    # 4. retire the subscription: stop listening, then remove it by name
    conn.unsubscribe("archive-sub", receipt="stopped")
    inbox.receipt("stopped")
    conn.unsubscribe("archive-sub", receipt="removed", headers={"activemq.subscriptionName": NAME})
    inbox.receipt("removed")
    conn.disconnect(receipt="bye")

    # 5. published after the removal: kept for nobody, a new subscription starts empty
    publish(host, port, login, passcode, ["trade 5: BUY 1 ACME"])
    conn, inbox = archiver(host, port, login, passcode)
    after_removal = take_all(conn, inbox)
    print(f"after the subscription was removed and made anew: {after_removal}")
    conn.unsubscribe("archive-sub", receipt="stopped")  # clean up: leave no subscription behind
    inbox.receipt("stopped")
    conn.unsubscribe("archive-sub", receipt="removed", headers={"activemq.subscriptionName": NAME})
    inbox.receipt("removed")
    conn.disconnect(receipt="bye")
    return {"online": online, "caught_up": caught_up, "after_removal": after_removal}


def main() -> None:
    args = arguments(__doc__)
    with target(args.url) as broker:
        run(broker.host, broker.port, broker.login, broker.passcode)


if __name__ == "__main__":
    main()
