"""Probe of queue federation (issue 31, item B): what the demand hook costs a broker
without federation, and how fast a queue link moves messages.

1. ``hook``: core alone, no federation configured: consume + cancel, and enqueue +
   deliver + ack through one queue, in CPU seconds (``time.process_time``) per
   operation. Run it on the code before and after the change
   (``PYTHONPATH=/work/main/src`` vs ``PYTHONPATH=src``): the hook adds a dict look-up
   to consume/cancel and nothing to the message path.
2. ``link`` (needs ``leveret.federation.queue_link``): two ``leveret server``
   processes, N messages of 100 B published upstream, then one downstream pika
   consumer (prefetch 200, acks every 50); messages/s across the link (``on-confirm``,
   prefetch 1000) and CPU microseconds per message of each broker (from /proc). (Not
   in-process brokers: their threads and the client's share one GIL, which makes the
   rate a measure of thread switching.)

3. ``rabbitmq``: the same as ``link`` with two RabbitMQ 3.10 nodes (``rabbitmq_federation``
   on the downstream one), for comparison.

Bounded: under a minute each. ``python3 bench/federation_queue_probe.py [hook] [link]
[rabbitmq]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

N_HOOK = 200_000
N_CONSUME = 50_000
N_LINK = 20_000


class _Consumer:
    def __init__(self, tag: str) -> None:
        self.tag, self.prefetch, self.exclusive, self.no_ack, self.arguments = tag, 0, False, False, {}
        self.priority = 0
        self.global_prefetch = 0
        self.selector = None
        self.examined = 0
        self.held: list = []

    def can_accept(self) -> bool:
        return True

    def deliver(self, queue: object, entry: object) -> None:
        self.held.append(entry)

    def cancel_by_broker(self) -> None:
        pass


def hook() -> None:
    from leveret.core import BrokerCore, Message
    from leveret.core.clock import ManualClock
    from leveret.core.message import Properties

    core = BrokerCore(ManualClock())
    queue = core.vhosts["/"].declare_queue("q", None)
    consumers = [_Consumer(f"c{n}") for n in range(N_CONSUME)]
    start = time.process_time()
    for consumer in consumers:
        queue.add_consumer(consumer)
        queue.remove_consumer(consumer)
    consume = (time.process_time() - start) / N_CONSUME
    consumer = _Consumer("c")
    queue.add_consumer(consumer)
    message = Message.build("", "q", b"x" * 100, Properties())
    start = time.process_time()
    for _ in range(N_HOOK):
        queue.enqueue(message)
        queue.ack(consumer.held.pop())
    path = (time.process_time() - start) / N_HOOK
    print(f"hook: consume+cancel {consume * 1e6:.2f} us CPU, enqueue+deliver+ack {path * 1e6:.3f} us CPU")


def link(kind: str = "leveret") -> None:
    import base64
    import json
    import urllib.request

    import pika
    from brokers import Leveret, RabbitMQ, free_port

    if kind == "rabbitmq":
        up_broker, down_broker = RabbitMQ(), RabbitMQ(federation=True)
    else:
        up_broker, down_broker = Leveret(), Leveret(extra_args=["--http-port", str(free_port())])
    with up_broker as up, down_broker as down:
        http_port = down.http_port if kind == "rabbitmq" else int(down.extra_args[-1])
        _wait_http(http_port)

        def put(path: str, body: dict) -> None:
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}{path}",
                data=json.dumps(body).encode(),
                method="PUT",
                headers={
                    "content-type": "application/json",
                    "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                },
            )
            urllib.request.urlopen(request, timeout=10).read()

        queue = "probe"
        for broker in (up, down):
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
            connection.channel().queue_declare(queue)
            connection.close()
        put(
            "/api/parameters/federation-upstream/%2F/up",
            {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"}},
        )
        put(
            "/api/policies/%2F/up",
            {"pattern": "^probe$", "apply-to": "queues", "definition": {"federation-upstream": "up"}},
        )
        publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port))
        channel = publisher.channel()
        body = b"x" * 100
        for _ in range(N_LINK):
            channel.basic_publish("", queue, body)
        publisher.close()
        consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", down.port))
        receive = consumer.channel()
        receive.basic_qos(prefetch_count=200)
        got = [0]

        def on_message(ch: object, method: object, properties: object, _body: bytes) -> None:
            got[0] += 1
            if got[0] % 50 == 0:
                receive.basic_ack(method.delivery_tag, multiple=True)  # type: ignore[attr-defined]

        up_cpu, down_cpu = up.cpu_seconds(), down.cpu_seconds()
        wall = time.monotonic()
        receive.basic_consume(queue, on_message)
        deadline = wall + 60
        while got[0] < N_LINK and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        wall = time.monotonic() - wall
        up_cpu, down_cpu = up.cpu_seconds() - up_cpu, down.cpu_seconds() - down_cpu
        consumer.close()
        moved = max(got[0], 1)
        print(
            f"{kind} link: {got[0]}/{N_LINK} messages of 100 B moved in {wall:.2f} s: "
            f"{got[0] / wall:.0f} msg/s; "
            f"CPU per message: upstream {up_cpu / moved * 1e6:.0f} us, downstream (with the link) "
            f"{down_cpu / moved * 1e6:.0f} us"
        )


def _wait_http(port: int) -> None:
    """Until the management API answers (RabbitMQ's starts after AMQP)."""
    import urllib.request

    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=2)
            return
        except urllib.error.HTTPError:
            return  # 401: it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    which = sys.argv[1:] or ["hook", "link"]
    if "hook" in which:
        hook()
    if "link" in which:
        link()
    if "rabbitmq" in which:
        link("rabbitmq")
