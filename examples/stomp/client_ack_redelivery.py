"""A worker that crashes before its ACK: the job goes to the next worker, with stomp.py.

The ActiveMQ scenario: workers take jobs from ``/queue/jobs`` with
``ack:client-individual`` and ``activemq.prefetchSize:1`` (one job at a time). The
first worker finishes job 1 and ACKs it, takes job 2 and crashes: its socket closes
with no ACK and no DISCONNECT. The broker has not been told job 2 is done, so it gives
job 2 to the next worker, marked ``redelivered:true``: the worker knows it may be a
job a crashed worker had half done (make the job idempotent, or check). Job 3, never
delivered, comes as a first delivery; job 1 is gone for good.

What leveret does: the same, and the redelivery says more: ``x-delivery-count`` counts
the earlier deliveries (0 on a first delivery, 1 here), so a worker can tell a job that
crashed several workers (see email_retry.py for NACK and the dead-letter queue). The
queue's redelivery policy applies to a crash too: ActiveMQ's by default, so job 2 comes
back after 1 s (``x-redelivery-delay``), and a job that crashes 7 workers ends in
``ActiveMQ.DLQ`` instead of crashing workers for ever. ActiveMQ gives job 2 back at once,
however many workers it has crashed.

    python examples/stomp/client_ack_redelivery.py                     # embedded leveret
    python examples/stomp/client_ack_redelivery.py --url stomp://127.0.0.1:61613
"""

from __future__ import annotations

from stomp_common import arguments, connect, target

QUEUE = "/queue/jobs"


def worker(host: str, port: int, login: str, passcode: str):
    """A worker subscribed to the jobs, one at a time: (connection, inbox)."""
    conn, inbox = connect(host, port, login, passcode)
    conn.subscribe(QUEUE, id="worker", ack="client-individual", receipt="subscribed",
                   headers={"activemq.prefetchSize": "1"})
    inbox.receipt("subscribed")
    return conn, inbox


def run(host: str, port: int, login: str = "guest", passcode: str = "guest") -> dict:
    producer, producer_inbox = connect(host, port, login, passcode)
    for number in (1, 2, 3):
        producer.send(QUEUE, f"job {number}", persistent="true", receipt=f"job-{number}")
        producer_inbox.receipt(f"job-{number}")
    producer.disconnect(receipt="bye")

    # the first worker: job 1 done, then a crash in the middle of job 2
    first, first_inbox = worker(host, port, login, passcode)
    job = first_inbox.message()
    print(f"worker 1 did {job.body!r} and ACKs it")
    first.ack(job.headers["ack"], receipt="done")
    first_inbox.receipt("done")
    job = first_inbox.message()
    print(f"worker 1 took {job.body!r} and crashes")
    first.transport.disconnect_socket()  # the socket closes: no ACK, no DISCONNECT

    # the next worker gets what the crash left unfinished, and the rest
    second, second_inbox = worker(host, port, login, passcode)
    jobs = {}
    for _ in range(2):
        job = second_inbox.message()  # one at a time: the next comes after this one's ACK
        redelivered = job.headers.get("redelivered", "false")
        count = job.headers.get("x-delivery-count")
        print(f"worker 2 got {job.body!r}: redelivered {redelivered}, x-delivery-count {count}")
        jobs[job.body] = {"redelivered": redelivered, "x-delivery-count": count,
                          "message-id": job.headers["message-id"]}
        second.ack(job.headers["ack"])
    leftover = [frame.body for frame in second_inbox.rest(quiet=0.3)]
    second.disconnect(receipt="bye")
    return {"second_worker": jobs, "leftover": leftover}


def main() -> None:
    args = arguments(__doc__)
    with target(args.url) as broker:
        run(broker.host, broker.port, broker.login, broker.passcode)


if __name__ == "__main__":
    main()
