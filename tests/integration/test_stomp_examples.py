"""The stomp.py examples of examples/stomp/, each run against an embedded leveret (STOMP on
a free port, data on disk as a ``leveret server`` keeps it) through its ``run()``, with
what happened checked precisely: counts, bodies, headers.

The examples are loaded from their files under names of their own (``stomp_example_*``):
examples/ has an AMQP ``email_retry`` too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from leveret import BlockingBroker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stomp"
HOST = "127.0.0.1"


def example(name: str) -> ModuleType:
    if str(EXAMPLES) not in sys.path:  # the examples import stomp_common from beside them
        sys.path.append(str(EXAMPLES))
    module_name = f"stomp_example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


@pytest.fixture
def broker(tmp_path):
    """A leveret with its data on disk and ActiveMQ's policy for the queues STOMP makes."""
    with BlockingBroker(amqp_port=0, stomp_port=0, data_dir=str(tmp_path / "data")) as running:
        yield running


def queue_names(broker: BlockingBroker) -> set[str]:
    return broker.call(lambda: set(broker.core.vhosts["/"].queues))


# -- 1. queue_producer_consumer ------------------------------------------------------------
def test_queue_producer_consumer(broker):
    result = example("queue_producer_consumer").run(HOST, broker.broker.stomp_port, count=5)
    assert len(result["sent"]) == 5
    assert [r["body"] for r in result["received"]] == result["sent"]  # all of them, in order
    assert '"item": "widget-3"' in result["sent"][2]
    ids = set()
    for number, received in enumerate(result["received"], 1):
        headers = received["headers"]
        assert headers["destination"] == "/queue/orders"
        assert headers["persistent"] == "true" and headers["priority"] == "4" and headers["expires"] == "0"
        assert headers["content-type"] == "application/json"
        assert headers["order-number"] == str(number)  # the producer's own header
        assert headers["subscription"] == "orders-worker"
        assert headers["x-delivery-count"] == "0" and "redelivered" not in headers
        assert headers["message-id"].startswith("ID:") and "ack" in headers
        ids.add(headers["message-id"])
    assert len(ids) == 5
    assert result["leftover"] == 0  # every one was acknowledged
    assert "orders" in queue_names(broker)


# -- 2. topic_pubsub -------------------------------------------------------------------------
def test_topic_pubsub(broker):
    module = example("topic_pubsub")
    result = module.run(HOST, broker.broker.stomp_port)
    assert result == {
        "/topic/prices.*": [
            ("/topic/prices.europe", "EURO STOXX 50 4890.5"),
            ("/topic/prices.asia", "NIKKEI 225 38210.0"),
            ("/topic/prices.america", "S&P 500 5210.3"),
        ],
        "/topic/prices.>": [(topic, body) for topic, body in module.PRICES],
    }


# -- 3. durable_subscriber -------------------------------------------------------------------
def test_durable_subscriber(broker):
    result = example("durable_subscriber").run(HOST, broker.broker.stomp_port)
    assert result == {
        "online": ["trade 1: BUY 100 ACME"],
        "caught_up": ["trade 2: SELL 50 ACME", "trade 3: BUY 10 INITECH", "trade 4: SELL 10 INITECH"],
        "after_removal": [],
    }
    # removed at the end: no queue left behind for the subscription
    assert "durable.trade-archiver.archive" not in queue_names(broker)


# -- 4. transacted_session -------------------------------------------------------------------
TRANSACTED = {
    "before_commit": [],
    "committed": ["invoice 1", "invoice 2", "invoice 3"],
    "after_abort": [],
    "leftover": [],
}


def check_transacted(result: dict) -> None:
    redelivered = result.pop("redelivered")
    assert result == TRANSACTED
    assert redelivered["body"] == "invoice 3"  # its ACK was in the aborted transaction
    headers = redelivered["headers"]
    # the consumer left with DISCONNECT: a plain return, not a failed delivery
    assert headers["redelivered"] == "true" and headers["x-delivery-count"] == "0"
    assert headers["x-acquired-count"] == "1"
    assert headers["destination"] == "/queue/invoices" and headers["persistent"] == "true"


def test_transacted_session_in_memory():
    with BlockingBroker(amqp_port=0, stomp_port=0) as broker:
        check_transacted(example("transacted_session").run(HOST, broker.broker.stomp_port, timeout=5))


def test_transacted_session_on_disk(broker):
    check_transacted(example("transacted_session").run(HOST, broker.broker.stomp_port, timeout=1))


# -- 5. client_ack_redelivery ----------------------------------------------------------------
def test_client_ack_redelivery(broker):
    result = example("client_ack_redelivery").run(HOST, broker.broker.stomp_port)
    jobs = result["second_worker"]
    assert set(jobs) == {"job 2", "job 3"}  # job 1 was acknowledged before the crash
    assert jobs["job 2"]["redelivered"] == "true" and jobs["job 2"]["x-delivery-count"] == "1"
    assert jobs["job 3"]["redelivered"] == "false" and jobs["job 3"]["x-delivery-count"] == "0"
    assert result["leftover"] == []


# -- 6. email_retry --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def email_result(tmp_path_factory):
    module = example("email_retry")
    data_dir = str(tmp_path_factory.mktemp("email") / "data")
    with BlockingBroker(amqp_port=0, stomp_port=0, data_dir=data_dir,
                        stomp_queue_arguments=module.POLICY) as broker:
        result = module.run(HOST, broker.broker.stomp_port, seconds=10)
        arguments = broker.call(lambda: dict(broker.core.vhosts["/"].queues["emails"].arguments))
    return result, arguments


def test_email_retry(email_result):
    result, arguments = email_result
    assert arguments["x-max-redeliveries"] == 3 and arguments["x-redelivery-exponential"] is True
    assert sorted(result["sent"]) == ["ada@example.org", "cy@example.org"]
    assert result["attempts"] == {"ada@example.org": 1, "bob@bounce.example": 4,
                                  "cy@example.org": 1, "dee@bounce.example": 4}
    for address in ("bob@bounce.example", "dee@bounce.example"):
        # exponential back-off: 100, 200, 400 ms (the first gap also holds stomp.py's
        # Nagle delay of its NACK, about 40 ms)
        for gap, nominal in zip(result["gaps_ms"][address], (100, 200, 400), strict=True):
            assert nominal - 20 <= gap <= nominal + 250, (address, result["gaps_ms"])
    dead = sorted(result["dead"], key=lambda d: d["to"])
    assert [d["to"] for d in dead] == ["bob@bounce.example", "dee@bounce.example"]
    batches = set()
    for letter in dead:
        headers = letter["headers"]
        assert headers["original-destination"] == "/queue/emails"
        assert headers["dlqDeliveryFailureCause"] == "delivery_limit"
        assert headers["persistent"] == "true" and headers["content-type"] == "application/json"
        assert headers["subscription"] == "dead-letters"
        batches.add(headers["batch"])
    assert len(batches) == 1  # the selector took this run's dead letters


def test_dead_letters_name_the_dlq_as_their_destination(email_result):
    result, _ = email_result
    assert [d["headers"]["destination"] for d in result["dead"]] == ["/queue/ActiveMQ.DLQ"] * 2


# -- scheduled_delivery ---------------------------------------------------------------------
def test_scheduled_delivery(broker):
    result = example("scheduled_delivery").run(HOST, broker.broker.stomp_port, delay=600, period=200)
    arrivals = result["arrivals"]
    pings = [a for a in arrivals if a["destination"] == "/queue/pings"]
    (reminder,) = [a for a in arrivals if a["destination"] == "/queue/reminders"]
    assert [p["body"] for p in pings] == ["ping"] * 4  # REPEAT 3: four deliveries
    for ping, due in zip(pings, (200, 400, 600, 800), strict=True):
        assert due - 30 <= ping["ms"] <= due + 1000  # (ms from the first SEND: the ping's is later)
    assert reminder["body"] == "your table at 8 pm" and 600 <= reminder["ms"] <= 1600
    assert reminder["headers"]["persistent"] == "true"
    assert reminder["headers"]["scheduledJobId"] == reminder["headers"]["message-id"]
    assert len({p["headers"]["scheduledJobId"] for p in pings}) == 1
    for arrival in arrivals:
        assert not any(name.startswith("AMQ_SCHEDULED_") for name in arrival["headers"])
    assert result["leftover"] == []
