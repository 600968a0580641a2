"""STOMP transactions on an ActiveMQ queue, with stomp.py: SENDs and ACKs that count
only at COMMIT.

The ActiveMQ scenario: a billing job issues invoices to ``/queue/invoices``.

- Producer: BEGIN ``batch-1``, three SENDs carrying ``transaction:batch-1``, COMMIT
  with a ``receipt``. Until the COMMIT nobody sees any of them; its RECEIPT says all
  three are in the queue. A second batch, BEGIN ``batch-2``, two SENDs, is ABORTed:
  those invoices never reach anybody.
- Consumer: ACKs inside a transaction too. It ACKs invoices 1 and 2 in ``acks-1``
  and COMMITs: they are done. It ACKs invoice 3 in ``acks-2`` and ABORTs: that ACK
  never happened, so when the consumer disconnects, invoice 3 goes back to the queue
  and the next consumer gets it with ``redelivered:true``.

What leveret does: the same. A COMMIT's RECEIPT comes once its persistent messages are
on disk; a disconnect rolls back open transactions. As in
ActiveMQ, an ABORT does not redeliver the messages whose ACKs it drops: they stay with
the subscription, to be ACKed again or to come back when it ends. leveret adds
``x-delivery-count:0`` and ``x-acquired-count:1`` to the redelivery: a consumer that
leaves with DISCONNECT returns its messages, it did not fail them, so invoice 3 comes
back at once and does not count toward the queue's delivery limit (RabbitMQ 4.3's
counts; a consumer that vanishes without DISCONNECT fails them).

    python examples/stomp/transacted_session.py                     # embedded leveret
    python examples/stomp/transacted_session.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

from stomp_common import arguments, connect, target

QUEUE = "/queue/invoices"


def run(host: str, port: int, login: str = "guest", passcode: str = "guest", timeout: float = 10.0) -> dict:
    """The scenario; ``timeout``: seconds to wait for each RECEIPT."""
    billing, billing_inbox = connect(host, port, login, passcode)
    billing.subscribe(QUEUE, id="billing", ack="client-individual", receipt="subscribed")
    billing_inbox.receipt("subscribed")

    # -- the producer: a committed batch and an aborted one -------------------------------
    producer, producer_inbox = connect(host, port, login, passcode)
    producer.begin("batch-1")
    for number in (1, 2, 3):
        producer.send(QUEUE, f"invoice {number}", persistent="true", transaction="batch-1")
    before_commit = [frame.body for frame in billing_inbox.rest(quiet=0.3)]
    print(f"before COMMIT the consumer has {before_commit}")
    producer.commit("batch-1", receipt="batch-1-committed")
    producer_inbox.receipt("batch-1-committed", timeout)
    committed = billing_inbox.take(3)
    print(f"after COMMIT: {[frame.body for frame in committed]}")

    producer.begin("batch-2")
    for number in (4, 5):
        producer.send(QUEUE, f"invoice {number} (cancelled)", persistent="true", transaction="batch-2")
    producer.abort("batch-2", receipt="batch-2-aborted")
    producer_inbox.receipt("batch-2-aborted", timeout)
    after_abort = [frame.body for frame in billing_inbox.rest(quiet=0.3)]
    print(f"after ABORT of batch-2 the consumer got {after_abort}")
    producer.disconnect(receipt="bye")

    # -- the consumer: ACKs in a committed transaction and in an aborted one ---------------
    billing.begin("acks-1")
    for frame in committed[:2]:
        billing.ack(frame.headers["ack"], transaction="acks-1")
    billing.commit("acks-1", receipt="acks-1-committed")
    billing_inbox.receipt("acks-1-committed", timeout)
    billing.begin("acks-2")
    billing.ack(committed[2].headers["ack"], transaction="acks-2")
    billing.abort("acks-2", receipt="acks-2-aborted")
    billing_inbox.receipt("acks-2-aborted", timeout)
    billing.disconnect(receipt="bye")  # invoice 3 is not acknowledged: it goes back

    # -- the next consumer gets what was not acknowledged --------------------------------
    conn, inbox = connect(host, port, login, passcode)
    conn.subscribe(QUEUE, id="billing", ack="client-individual", receipt="subscribed")
    inbox.receipt("subscribed")
    again = inbox.message(timeout=10)  # after the redelivery delay on leveret
    conn.ack(again.headers["ack"])
    leftover = [frame.body for frame in inbox.rest(quiet=0.3)]
    conn.disconnect(receipt="bye")
    print(f"the next consumer got {again.body!r} (redelivered: {again.headers.get('redelivered')}, "
          f"x-delivery-count: {again.headers.get('x-delivery-count')})")
    return {
        "before_commit": before_commit,
        "committed": [frame.body for frame in committed],
        "after_abort": after_abort,
        "redelivered": {"body": again.body, "headers": dict(again.headers)},
        "leftover": leftover,
    }


def main() -> None:
    args = arguments(__doc__)
    with target(args.url) as broker:
        run(broker.host, broker.port, broker.login, broker.passcode)


if __name__ == "__main__":
    main()
