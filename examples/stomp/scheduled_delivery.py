"""Scheduled delivery: a reminder sent now for later, and a job that repeats, with stomp.py.

The ActiveMQ scenario: a booking service SENDs a reminder to ``/queue/reminders`` with
``AMQ_SCHEDULED_DELAY`` (ms): the broker keeps it and delivers it when the delay has
passed; the sender is long gone by then. A monitor sends one "ping" with
``AMQ_SCHEDULED_DELAY``, ``AMQ_SCHEDULED_PERIOD`` and ``AMQ_SCHEDULED_REPEAT:3``: it is
delivered four times (REPEAT N means N+1 deliveries), a period apart. Each delivery
carries ``scheduledJobId``, the handle of its job (the message id of the SEND), and no
longer the ``AMQ_SCHEDULED_*`` headers. ``AMQ_SCHEDULED_CRON`` (a cron expression)
repeats a job at each match; ``leveret scheduler list|show|cancel`` and
``/api/scheduled-jobs`` show and remove jobs.

What leveret does: the same, always on (ActiveMQ needs ``schedulerSupport="true"`` in
activemq.xml, off by default, and otherwise delivers at once: a known trap), and the
same headers from AMQP publishers too. A persistent job is on disk before the SEND's
RECEIPT and survives a ``kill -9``; one that fell due while the broker was down is
delivered at once after the restart.

    python examples/stomp/scheduled_delivery.py                     # embedded leveret
    python examples/stomp/scheduled_delivery.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

import time

from stomp_common import arguments, connect, target

REMINDERS = "/queue/reminders"
PINGS = "/queue/pings"


def run(host: str, port: int, login: str = "guest", passcode: str = "guest", delay: int = 600,
        period: int = 200) -> dict:
    consumer, inbox = connect(host, port, login, passcode)
    consumer.subscribe(REMINDERS, id="reminders", ack="auto", receipt="s1")
    inbox.receipt("s1")
    consumer.subscribe(PINGS, id="pings", ack="auto", receipt="s2")
    inbox.receipt("s2")

    producer, producer_inbox = connect(host, port, login, passcode)
    start = time.monotonic()
    producer.send(REMINDERS, "your table at 8 pm", persistent="true", receipt="reminder",
                  headers={"AMQ_SCHEDULED_DELAY": str(delay)})
    producer_inbox.receipt("reminder")
    producer.send(PINGS, "ping", receipt="ping", headers={
        "AMQ_SCHEDULED_DELAY": str(period), "AMQ_SCHEDULED_PERIOD": str(period), "AMQ_SCHEDULED_REPEAT": "3"})
    producer_inbox.receipt("ping")
    producer.disconnect(receipt="bye")
    print(f"sent a reminder for {delay} ms from now and a ping every {period} ms, 4 times")

    arrivals = []
    for _ in range(5):
        frame = inbox.message(timeout=10)
        elapsed = round((time.monotonic() - start) * 1000)
        print(f"{elapsed:5d} ms: {frame.body!r} from {frame.headers['destination']}, "
              f"scheduledJobId {frame.headers.get('scheduledJobId')}")
        arrivals.append({"body": frame.body, "destination": frame.headers["destination"], "ms": elapsed,
                         "headers": dict(frame.headers)})
    leftover = [frame.body for frame in inbox.rest(quiet=2 * period / 1000)]
    consumer.disconnect(receipt="bye")
    return {"arrivals": arrivals, "leftover": leftover}


def main() -> None:
    args = arguments(__doc__)
    with target(args.url) as broker:
        run(broker.host, broker.port, broker.login, broker.passcode)


if __name__ == "__main__":
    main()
