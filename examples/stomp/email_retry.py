"""The e-mail retry scenario of ActiveMQ's redelivery docs, over STOMP with stomp.py.

The ActiveMQ scenario: a producer queues e-mails on ``/queue/emails``; a worker
"sends" them and fails on some addresses (here every address at bounce.example). A
failed e-mail is NACKed so that it is tried again later, with an exponential back-off,
and after a few tries it is a poison message: it goes to the dead-letter queue
``ActiveMQ.DLQ`` with ``original-destination`` (where it came from) and
``dlqDeliveryFailureCause`` (why), for an operator to look at. Each e-mail carries a
``batch`` header, and the DLQ is read with the selector ``batch = '<this run>'``, so
the example takes only its own dead letters from a DLQ that other queues share.

What leveret does: NACK goes through the queue's redelivery policy, ActiveMQ's
RedeliveryPolicy as queue arguments (``x-max-redeliveries``, ``x-redelivery-delay``,
``x-redelivery-exponential``, ``x-redelivery-backoff-multiplier``,
``x-redelivery-max-delay``), then the queue's dead-letter strategy. Every redelivery
carries ``redelivered:true`` and ``x-delivery-count``. The policy of the queues STOMP
clients create is the broker's ``stomp_queue_arguments``: here the embedded broker gets
3 redeliveries, 100 ms then 200 ms then 400 ms apart; a ``leveret server`` takes them
from the ``[stomp_queue_arguments]`` table of its config file (default: ActiveMQ's
policy, 6 redeliveries 1 s apart). The dead letters say why they died:
``dlqDeliveryFailureCause:delivery_limit``. This example takes its dead letters out of
the DLQ as it reads them; left there, ``leveret dlq show ActiveMQ.DLQ`` lists them and
``leveret dlq replay ActiveMQ.DLQ`` sends them back to ``emails``.

On ActiveMQ, a STOMP NACK is a "poison ack": the e-mail goes to ``ActiveMQ.DLQ`` at
once, with no retry (broker-side retries need its RedeliveryPlugin and the scheduler)
and no ``dlqDeliveryFailureCause``, and a non-persistent message would be dropped, not
dead-lettered. The program runs unchanged there; it makes one attempt per e-mail.

    python examples/stomp/email_retry.py                     # embedded leveret
    python examples/stomp/email_retry.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from itertools import pairwise

from stomp_common import arguments, connect, target

QUEUE = "/queue/emails"
DLQ = "/queue/ActiveMQ.DLQ"
POLICY = {  # ActiveMQ's RedeliveryPolicy and DLQ strategy, as leveret's queue arguments
    "x-max-redeliveries": 3,  # maximumRedeliveries
    "x-redelivery-delay": 100,  # initialRedeliveryDelay, ms
    "x-redelivery-exponential": True,  # useExponentialBackOff
    "x-redelivery-backoff-multiplier": 2,  # backOffMultiplier
    "x-dead-letter-strategy": "shared",  # sharedDeadLetterStrategy: one DLQ ...
    "x-dead-letter-queue": "ActiveMQ.DLQ",  # ... with ActiveMQ's name
    "x-dead-letter-non-persistent": True,  # processNonPersistent (ActiveMQ: false)
}
EMAILS = ["ada@example.org", "bob@bounce.example", "cy@example.org", "dee@bounce.example"]


def produce(host: str, port: int, login: str, passcode: str, batch: str) -> None:
    conn, inbox = connect(host, port, login, passcode)
    for number, address in enumerate(EMAILS):
        email = json.dumps({"to": address, "subject": f"hello {number}"})
        conn.send(QUEUE, email, content_type="application/json", persistent="true",
                  headers={"batch": batch, "receipt": f"email-{number}"})
    for number in range(len(EMAILS)):
        inbox.receipt(f"email-{number}")
    conn.disconnect(receipt="bye")


def run(host: str, port: int, login: str = "guest", passcode: str = "guest", seconds: float = 30.0) -> dict:
    """Send the e-mails, then work until each one is sent or dead (``seconds`` at most)."""
    batch = uuid.uuid4().hex[:12]
    # the operator's view: this run's dead letters, as they arrive
    dlq, dlq_inbox = connect(host, port, login, passcode)
    dlq.subscribe(DLQ, id="dead-letters", ack="client-individual", receipt="subscribed",
                  headers={"selector": f"batch = '{batch}'"})
    dlq_inbox.receipt("subscribed")
    produce(host, port, login, passcode, batch)

    worker, inbox = connect(host, port, login, passcode)
    worker.subscribe(QUEUE, id="mailer", ack="client-individual", receipt="subscribed")
    inbox.receipt("subscribed")
    sent, dead = [], []
    attempts: dict[str, list[float]] = {address: [] for address in EMAILS}
    start = time.monotonic()
    while len(sent) + len(dead) < len(EMAILS) and time.monotonic() < start + seconds:
        try:
            frame = inbox.messages.get(timeout=0.05)
        except queue.Empty:
            pass
        else:
            email = json.loads(frame.body)
            attempts[email["to"]].append(time.monotonic())
            tries = len(attempts[email["to"]])
            if email["to"].endswith("@bounce.example"):
                print(f"  attempt {tries} (x-delivery-count {frame.headers.get('x-delivery-count')}): "
                      f"sending to {email['to']} failed, NACK")
                worker.nack(frame.headers["ack"])
            else:
                print(f"  attempt {tries}: sent {email['subject']!r} to {email['to']}, ACK")
                worker.ack(frame.headers["ack"])
                sent.append(email["to"])
        while not dlq_inbox.messages.empty():
            frame = dlq_inbox.messages.get()
            headers = frame.headers
            print(f"  in {DLQ}: {json.loads(frame.body)['to']} from {headers.get('original-destination')}, "
                  f"cause: {headers.get('dlqDeliveryFailureCause')}")
            dead.append({"to": json.loads(frame.body)["to"], "headers": dict(headers)})
            dlq.ack(headers["ack"])  # taken out of the DLQ: an operator would replay or drop it
    worker.disconnect(receipt="bye")
    dlq.disconnect(receipt="bye")
    gaps = {address: [round((later - earlier) * 1000) for earlier, later in pairwise(times)]
            for address, times in attempts.items()}
    return {"sent": sent, "dead": dead, "attempts": {a: len(t) for a, t in attempts.items()},
            "gaps_ms": gaps}


def main() -> None:
    args = arguments(__doc__, seconds={"type": float, "default": 30.0,
                                       "help": "how long the worker waits for retries, at most"})
    if args.url:
        print("the retry policy is the broker's: on a leveret server, the [stomp_queue_arguments] table of "
              "its config file (default: ActiveMQ's, 6 retries 1 s apart); ActiveMQ dead-letters at once")
    with target(args.url, stomp_queue_arguments=POLICY) as broker:
        result = run(broker.host, broker.port, broker.login, broker.passcode, args.seconds)
    for address, gaps in result["gaps_ms"].items():
        if gaps:
            apart = " ms, ".join(map(str, gaps))
            print(f"{address}: {result['attempts'][address]} attempts, {apart} ms apart")
    print(f"sent: {result['sent']}; dead letters: {[d['to'] for d in result['dead']]}")


if __name__ == "__main__":
    main()
