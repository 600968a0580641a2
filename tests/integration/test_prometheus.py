"""Prometheus metrics over real HTTP from a real leveret, after real clients (pika,
stomp.py) publish, consume, reject and let messages expire; parsed with
prometheus-client's own parser. With ``rabbitmq-server`` installed, the same workload
runs against a private RabbitMQ 3.10 with ``rabbitmq_prometheus`` and the two scrapes
are compared (names, types, labels, counter values); without it those cases skip."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from eventually import eventually, poll
from prometheus_client.parser import text_string_to_metric_families

from leveret import BlockingBroker
from leveret.config import Settings, load
from leveret.core.auth import Permission

Samples = dict[tuple[str, frozenset], float]
AMQP = "amqp091"

#: Every metric the official RabbitMQ-Overview Grafana dashboard queries (read from
#: rabbitmq-server's deps/rabbitmq_prometheus/docker/grafana/dashboards/
#: RabbitMQ-Overview.json), as sample names.
OVERVIEW_DASHBOARD = (
    "rabbitmq_build_info",
    "rabbitmq_channels",
    "rabbitmq_channels_closed_total",
    "rabbitmq_channels_opened_total",
    "rabbitmq_connections",
    "rabbitmq_connections_closed_total",
    "rabbitmq_connections_opened_total",
    "rabbitmq_disk_space_available_bytes",
    "rabbitmq_disk_space_available_limit_bytes",
    "rabbitmq_erlang_uptime_seconds",
    "rabbitmq_global_consumers",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_global_messages_confirmed_total",
    "rabbitmq_global_messages_delivered_consume_auto_ack_total",
    "rabbitmq_global_messages_delivered_consume_manual_ack_total",
    "rabbitmq_global_messages_delivered_get_auto_ack_total",
    "rabbitmq_global_messages_delivered_get_manual_ack_total",
    "rabbitmq_global_messages_delivered_total",
    "rabbitmq_global_messages_get_empty_total",
    "rabbitmq_global_messages_received_confirm_total",
    "rabbitmq_global_messages_received_total",
    "rabbitmq_global_messages_redelivered_total",
    "rabbitmq_global_messages_routed_total",
    "rabbitmq_global_messages_unroutable_dropped_total",
    "rabbitmq_global_messages_unroutable_returned_total",
    "rabbitmq_global_publishers",
    "rabbitmq_identity_info",
    "rabbitmq_message_size_bytes_bucket",
    "rabbitmq_message_size_bytes_count",
    "rabbitmq_message_size_bytes_sum",
    "rabbitmq_process_max_fds",
    "rabbitmq_process_open_fds",
    "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages_unacked",
    "rabbitmq_queues",
    "rabbitmq_queues_created_total",
    "rabbitmq_queues_declared_total",
    "rabbitmq_queues_deleted_total",
    "rabbitmq_resident_memory_limit_bytes",
    # the older dashboard's channel families
    "rabbitmq_channel_messages_published_total",
    "rabbitmq_channel_consumers",
    "rabbitmq_channel_messages_redelivered_total",
)


def http_get(url: str) -> tuple[int, str, str]:
    """Status, Content-Type and text of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """The families (name → type) and samples ((name, labels) → value) of a scrape."""
    types, samples = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return types, samples


def scrape(base: str, path: str = "/metrics") -> tuple[dict[str, str], Samples]:
    status, content_type, text = http_get(base + path)
    assert status == 200, text
    assert content_type.startswith("text/plain")
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def broker(tmp_path) -> Iterator[BlockingBroker]:
    with BlockingBroker(
        amqp_port=0, stomp_port=0, prometheus_port=0, data_dir=str(tmp_path / "data")
    ) as running:
        yield running


def dead_letter_workload(url: str) -> None:
    """The same on leveret and RabbitMQ: 3 confirmed publishes into a queue of length
    2 (1 maxlen death), 1 unroutable, 1 mandatory returned, a get rejected (1 rejected
    death), a get with auto-ack, an empty get, a consumer that nacks once with requeue
    (a redelivery) then acks, and a message that expires in a TTL queue (1 expired)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare("p-dlq")
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "p-dlq"}
    channel.queue_declare("p-work", arguments={**dead_letter, "x-max-length": 2})
    channel.queue_declare("p-ttl", arguments={**dead_letter, "x-message-ttl": 50})
    channel.queue_declare("p-acked")
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", "p-work", b"w%d" % n)
    channel.basic_publish("", "p-nowhere", b"dropped")
    try:
        channel.basic_publish("", "p-nowhere", b"returned", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    channel.basic_publish("", "p-ttl", b"expires")
    channel.basic_publish("", "p-acked", b"x" * 300)
    method, _, _ = channel.basic_get("p-work")
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert channel.basic_get("p-work", auto_ack=True)[0] is not None
    assert channel.basic_get("p-work")[0] is None
    seen: list[bool] = []

    def on_message(ch, method, properties, body) -> None:
        seen.append(method.redelivered)
        if not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
            ch.stop_consuming()

    channel.basic_consume("p-acked", on_message)
    channel.start_consuming()
    assert seen == [False, True]
    dead = eventually(lambda: channel.queue_declare("p-dlq", passive=True).method.message_count >= 3,
                      10, 0.05)
    assert dead, "the TTL message was not dead-lettered"  # maxlen, rejected, expired
    connection.close()


#: The global counters after :func:`dead_letter_workload` (RabbitMQ 3.10.8 gives the same).
EXPECTED_GLOBAL = {
    "rabbitmq_global_messages_received_total": 7,
    "rabbitmq_global_messages_received_confirm_total": 7,
    "rabbitmq_global_messages_routed_total": 5,
    "rabbitmq_global_messages_unroutable_dropped_total": 1,
    "rabbitmq_global_messages_unroutable_returned_total": 1,
    "rabbitmq_global_messages_confirmed_total": 7,
}
EXPECTED_CLASSIC = {
    "rabbitmq_global_messages_delivered_total": 4,
    "rabbitmq_global_messages_delivered_consume_manual_ack_total": 2,
    "rabbitmq_global_messages_delivered_consume_auto_ack_total": 0,
    "rabbitmq_global_messages_delivered_get_manual_ack_total": 1,
    "rabbitmq_global_messages_delivered_get_auto_ack_total": 1,
    "rabbitmq_global_messages_get_empty_total": 1,
    "rabbitmq_global_messages_redelivered_total": 1,
    "rabbitmq_global_messages_acknowledged_total": 1,
}
EXPECTED_DEAD = {"maxlen": 1, "expired": 1, "rejected": 1, "delivery_limit": 0}


def check_workload_counters(samples: Samples) -> None:
    for name, expected in EXPECTED_GLOBAL.items():
        assert value(samples, name, protocol="amqp091") == expected, name
    for name, expected in EXPECTED_CLASSIC.items():
        assert value(samples, name, protocol="amqp091", queue_type="rabbit_classic_queue") == expected, name
    for reason, expected in EXPECTED_DEAD.items():
        name = f"rabbitmq_global_messages_dead_lettered_{reason}_total"
        labels = {"queue_type": "rabbit_classic_queue"}
        if reason != "delivery_limit":  # RabbitMQ 3.10 has no classic delivery_limit series
            assert value(samples, name, **labels, dead_letter_strategy="at_most_once") == expected, name
            assert value(samples, name, **labels, dead_letter_strategy="disabled") == 0, name


def test_counters_of_a_dead_letter_workload(broker):
    dead_letter_workload(broker.amqp_url)
    _, samples = scrape(broker.prometheus_url)
    check_workload_counters(samples)
    assert value(samples, "rabbitmq_queues") == 4
    assert value(samples, "rabbitmq_queues_declared_total") == 4  # passive declares do not count
    assert value(samples, "rabbitmq_queues_created_total") == 4
    assert value(samples, "rabbitmq_queue_messages_ready") == 3  # in p-dlq
    assert value(samples, "rabbitmq_queue_messages_unacked") == 0
    assert value(samples, "rabbitmq_connections_opened_total") == 1
    assert value(samples, "rabbitmq_connections_closed_total") == 1
    assert value(samples, "rabbitmq_connections") == 0
    assert value(samples, "rabbitmq_channels_opened_total") == 1
    assert value(samples, "rabbitmq_channels_closed_total") == 1
    assert value(samples, "rabbitmq_global_publishers", protocol="amqp091") == 0  # its channel closed
    # sizes: 2+2+2+7+8+7 bytes (≤ 64) and 300 (≤ 1024)
    assert value(samples, "rabbitmq_message_size_bytes_bucket", protocol="amqp091", le="64.0") == 6
    assert value(samples, "rabbitmq_message_size_bytes_bucket", protocol="amqp091", le="256.0") == 6
    assert value(samples, "rabbitmq_message_size_bytes_bucket", protocol="amqp091", le="1024.0") == 7
    assert value(samples, "rabbitmq_message_size_bytes_bucket", protocol="amqp091", le="+Inf") == 7
    assert value(samples, "rabbitmq_message_size_bytes_count", protocol="amqp091") == 7
    assert value(samples, "rabbitmq_message_size_bytes_sum", protocol="amqp091") == 6 + 7 + 8 + 7 + 300
    identity = [key for key in samples if key[0] == "rabbitmq_identity_info"]
    assert len(identity) == 1
    labels = dict(identity[0][1])
    assert labels["rabbitmq_endpoint"] == "aggregated"
    assert labels["rabbitmq_node"].startswith("leveret@") and labels["rabbitmq_cluster"]
    assert not any(("queue", "p-work") in key[1] for key in samples)  # aggregated: no queue labels


def test_per_object_has_queue_series_and_dead_letters_per_queue_and_reason(broker):
    dead_letter_workload(broker.amqp_url)
    _, samples = scrape(broker.prometheus_url, "/metrics/per-object")
    check_workload_counters(samples)
    dead = "leveret_queue_messages_dead_lettered_total"
    for queue, reason, expected in (
        ("p-work", "maxlen", 1),
        ("p-work", "rejected", 1),
        ("p-work", "expired", 0),
        ("p-ttl", "expired", 1),
        ("p-ttl", "rejected", 0),
    ):
        labels = {"vhost": "/", "queue": queue, "reason": reason, "dead_letter_strategy": "at_most_once"}
        assert value(samples, dead, **labels) == expected, (queue, reason)
    dlq = {"vhost": "/", "queue": "p-dlq", "reason": "maxlen", "dead_letter_strategy": "disabled"}
    assert value(samples, dead, **dlq) == 0
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue="p-dlq") == 3
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue="p-work") == 0
    assert value(samples, "rabbitmq_queue_messages_published_total", vhost="/", queue="p-work") == 3
    assert value(samples, "rabbitmq_queue_messages_published_total", vhost="/", queue="p-dlq") == 0
    assert value(samples, "rabbitmq_queue_messages_redelivered_total", vhost="/", queue="p-acked") == 1
    assert value(samples, "rabbitmq_queue_messages_acked_total", vhost="/", queue="p-acked") == 1
    assert value(samples, "rabbitmq_queue_get_empty_total", vhost="/", queue="p-work") == 1
    identity = next(key for key in samples if key[0] == "rabbitmq_identity_info")
    assert dict(identity[1])["rabbitmq_endpoint"] == "per-object"


def test_every_metric_of_the_overview_dashboard_is_there(broker):
    types, samples = scrape(broker.prometheus_url)
    missing = [name for name in OVERVIEW_DASHBOARD if name not in names(samples)]
    assert not missing
    assert types["rabbitmq_global_messages_received"] == "counter"
    assert types["rabbitmq_queue_messages_ready"] == "gauge"
    assert types["rabbitmq_message_size_bytes"] == "histogram"
    assert types["rabbitmq_identity_info"] == "unknown"  # RabbitMQ's: untyped
    assert value(samples, "rabbitmq_process_resident_memory_bytes") > 1_000_000
    assert value(samples, "rabbitmq_process_open_fds") > 3
    assert value(samples, "rabbitmq_disk_space_available_bytes") > 0
    assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == Settings().disk_free_limit


def test_detailed_gives_the_families_asked_for_in_the_vhosts_asked_for(broker):
    broker.call(broker.core.add_vhost, "other")
    broker.call(broker.core.set_permission, "guest", "other", Permission())
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("d-one")
    channel.basic_publish("", "d-one", b"1")
    channel.basic_publish("", "d-one", b"2")
    channel.queue_declare("d-one", passive=True)
    connection.close()
    other = pika.BlockingConnection(pika.URLParameters(broker.amqp_url.replace("%2F", "other")))
    other.channel().queue_declare("d-two")
    other.close()

    path = "/metrics/detailed?family=queue_coarse_metrics&family=leveret_dead_letters"
    types, samples = scrape(broker.prometheus_url, path)
    assert value(samples, "rabbitmq_detailed_queue_messages_ready", vhost="/", queue="d-one") == 2
    assert value(samples, "rabbitmq_detailed_queue_messages_ready", vhost="other", queue="d-two") == 0
    assert "rabbitmq_detailed_queue_consumers" not in names(samples)  # not asked for
    assert "rabbitmq_global_messages_received_total" not in names(samples)
    assert types["leveret_queue_messages_dead_lettered"] == "counter"
    identity = next(key for key in samples if key[0] == "rabbitmq_identity_info")
    assert dict(identity[1])["rabbitmq_endpoint"] == "detailed"

    _, samples = scrape(broker.prometheus_url, "/metrics/detailed?family=queue_consumer_count&vhost=other")
    consumers = "rabbitmq_detailed_queue_consumers"
    queues = {dict(labels)["queue"] for name, labels in samples if name == consumers}
    assert queues == {"d-two"}


def test_bad_requests_get_clear_errors(broker):
    base = broker.prometheus_url
    status, _, text = http_get(base + "/metrics/detailed?family=queue_nonsense")
    assert status == 400 and "unknown family queue_nonsense" in text and "queue_coarse_metrics" in text
    status, _, text = http_get(base + "/metrics/detailed")
    assert status == 400 and "no family given" in text
    status, _, text = http_get(base + "/metrics/detailed?family=queue_coarse_metrics&vhost=nowhere")
    assert status == 400 and "unknown vhost nowhere" in text
    assert http_get(base + "/metrics/nothing")[0] == 404


def test_deleted_queues_keep_their_counts_in_the_totals(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("gone", arguments={"x-message-ttl": 0})  # expires at once, no DLX
    channel.basic_publish("", "gone", b"x")
    channel.queue_declare("gone", arguments={"x-message-ttl": 0})
    labels = {"vhost": "/", "queue": "gone", "reason": "expired", "dead_letter_strategy": "disabled"}
    assert eventually(lambda: value(scrape(broker.prometheus_url, "/metrics/per-object")[1],
                                    "leveret_queue_messages_dead_lettered_total", **labels) == 1, 10, 0.05)
    channel.queue_delete("gone")
    connection.close()
    _, samples = scrape(broker.prometheus_url)
    assert value(samples, "rabbitmq_queues_deleted_total") == 1
    assert value(samples, "rabbitmq_queues") == 0
    expired = "rabbitmq_global_messages_dead_lettered_expired_total"
    assert value(samples, expired, queue_type="rabbit_classic_queue", dead_letter_strategy="disabled") == 1
    assert value(samples, "rabbitmq_global_messages_routed_total", protocol="amqp091") == 1


def test_stomp_clients_are_counted_too(broker):
    from stomp_clients import Client

    classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
    with Client(broker.broker.stomp_port) as client:
        client.subscribe("/queue/s-metrics", ack="client-individual")
        client.send("/queue/s-metrics", "hello")
        message = client.message()
        client.ack(message)
        client.conn.begin("tx1")
        client.send("/queue/s-metrics", "in a transaction", receipt=False, transaction="tx1")
        client.conn.commit("tx1")
        client.ack(client.message())

        def both_acked(samples) -> bool:
            return value(samples, "rabbitmq_global_messages_acknowledged_total", **classic) == 2

        samples = poll(lambda: scrape(broker.prometheus_url)[1], both_acked, 10, 0.05)
        assert both_acked(samples)
        # the connection's publisher; its transaction's is part of it
        assert value(samples, "rabbitmq_global_publishers", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_global_messages_received_total", protocol="amqp091") == 2
    assert value(samples, "rabbitmq_global_messages_delivered_consume_manual_ack_total", **classic) == 2
    assert value(samples, "rabbitmq_connections_opened_total") == 1
    if value(samples, "rabbitmq_connections") != 0:
        samples = poll(lambda: scrape(broker.prometheus_url)[1],
                       lambda samples: value(samples, "rabbitmq_connections") == 0, 10, 0.05)
        assert value(samples, "rabbitmq_connections") == 0
    assert value(samples, "rabbitmq_connections_closed_total") == 1
    assert value(samples, "rabbitmq_global_publishers", protocol="amqp091") == 0


def test_the_config_file_sets_the_port(tmp_path):
    path = tmp_path / "leveret.toml"
    path.write_text("[server]\nprometheus_port = 0\n")
    settings = load(path)
    assert settings.prometheus_port == 0
    with BlockingBroker(settings, amqp_port=0) as running:
        assert running.prometheus_url is not None
        assert http_get(running.prometheus_url + "/metrics")[0] == 200
    assert BlockingBroker(amqp_port=0).prometheus_url is None  # embedded: off unless asked


# -- against RabbitMQ 3.10 ---------------------------------------------------------------
@pytest.fixture(scope="module")
def rabbitmq():
    from prometheus_rabbitmq import PrometheusRabbitMQ, rabbitmq_installed

    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed")
    node = PrometheusRabbitMQ()
    node.start()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


def test_same_names_types_labels_and_counts_as_rabbitmq(broker, rabbitmq):
    dead_letter_workload(f"amqp://guest:guest@127.0.0.1:{rabbitmq.port}/%2F")
    # RabbitMQ's counters reach Prometheus through its metrics tables: wait for them
    deadline = time.monotonic() + 30
    while True:
        rabbit_types, rabbit = parse(rabbitmq.scrape())
        received = rabbit.get(("rabbitmq_global_messages_received_total", frozenset({("protocol", AMQP)})))
        if received == 7 and rabbit.get(("rabbitmq_queues", frozenset())) == 4:
            break
        assert time.monotonic() < deadline, "RabbitMQ's metrics did not settle"
        time.sleep(0.5)
    check_workload_counters(rabbit)
    dead_letter_workload(broker.amqp_url)
    leveret_types, leveret = scrape(broker.prometheus_url)

    shared = [name for name in leveret_types if name in rabbit_types]
    assert len(shared) >= 45
    for name in shared:
        assert leveret_types[name] == rabbit_types[name], name
    missing = sorted(name for name in OVERVIEW_DASHBOARD if name not in names(rabbit))
    # rabbitmq_message_size_bytes came after 3.10
    assert missing == [
        "rabbitmq_message_size_bytes_bucket",
        "rabbitmq_message_size_bytes_count",
        "rabbitmq_message_size_bytes_sum",
    ]

    def label_names(samples: Samples) -> dict[str, set[frozenset]]:
        found: dict[str, set[frozenset]] = {}
        for name, labels in samples:
            found.setdefault(name, set()).add(frozenset(key for key, _ in labels))
        return found

    leveret_labels, rabbit_labels = label_names(leveret), label_names(rabbit)
    for name in OVERVIEW_DASHBOARD:
        if name in rabbit_labels and name not in ("rabbitmq_build_info", "rabbitmq_identity_info"):
            assert leveret_labels[name] == rabbit_labels[name], name
    # leveret's identity and build info carry RabbitMQ's labels (and 3.11's endpoint)
    identity = leveret_labels["rabbitmq_identity_info"]
    assert rabbit_labels["rabbitmq_identity_info"] <= {
        frozenset(k for k in labels if k != "rabbitmq_endpoint") for labels in identity
    }
    rabbit_build = next(iter(rabbit_labels["rabbitmq_build_info"]))
    assert rabbit_build <= next(iter(leveret_labels["rabbitmq_build_info"]))
    for name in list(EXPECTED_GLOBAL) + list(EXPECTED_CLASSIC):
        for key in [k for k in rabbit if k[0] == name]:
            assert leveret[key] == rabbit[key], key


def test_the_dead_letter_dashboard_reads_only_metrics_leveret_exports(broker):
    """docs/grafana/leveret-dead-letters.json: every metric its queries name is in a
    scrape of /metrics/per-object (labels it filters on included)."""
    path = Path(__file__).parents[2] / "docs" / "grafana" / "leveret-dead-letters.json"
    dashboard = json.loads(path.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    labels = {"rabbitmq_cluster", "rabbitmq_node", "rabbitmq_endpoint"}
    used = {name for query in queries for name in re.findall(r"\b(?:rabbitmq|leveret)_\w+", query)} - labels
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    connection.channel().queue_declare("some-queue")
    connection.close()
    _, samples = scrape(broker.prometheus_url, "/metrics/per-object")
    assert used <= names(samples), used - names(samples)
    assert "leveret_queue_messages_dead_lettered_total" in used
    for name, found in samples:
        if name == "leveret_queue_messages_dead_lettered_total":
            assert {"vhost", "queue", "reason", "dead_letter_strategy"} == {key for key, _ in found}


def test_leveret_server_prints_and_serves_its_metrics_address(tmp_path):
    """``leveret server --prometheus-port 0``: the last start-up line names the endpoint."""
    command = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "-1",
               "--mqtt-port", "0", "--web-mqtt-port", "-1",
               "--web-stomp-port", "-1", "--prometheus-port", "0", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("leveret ready: amqp://127.0.0.1:")
        match = re.fullmatch(r"leveret prometheus: (http://127\.0\.0\.1:\d+)/metrics\n", lines[1])
        assert match, lines
        _, samples = scrape(match.group(1))
        assert value(samples, "rabbitmq_queues") == 0
        assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == Settings().disk_free_limit
    finally:
        process.terminate()
        assert process.wait(20) == 0


def test_per_object_is_made_anew_once_an_interval(tmp_path):
    """``/metrics/per-object`` is served again for ``collect_statistics_interval`` (as
    RabbitMQ's per-object values change once an interval): rendering every queue's
    series is the costly scrape."""
    with BlockingBroker(amqp_port=0, prometheus_port=0, collect_statistics_interval=400) as broker:
        _, before = scrape(broker.prometheus_url, "/metrics/per-object")
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        connection.channel().queue_declare("late")
        _, cached = scrape(broker.prometheus_url, "/metrics/per-object")
        assert cached == before
        time.sleep(0.45)
        _, fresh = scrape(broker.prometheus_url, "/metrics/per-object")
        assert value(fresh, "rabbitmq_queue_messages_ready", vhost="/", queue="late") == 0
        connection.close()
