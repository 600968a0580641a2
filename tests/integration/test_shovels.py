"""Shovels on real brokers: leveret → leveret, leveret ↔ RabbitMQ 3.10, defined over
HTTP (RabbitMQ's ``PUT /api/parameters/shovel/...``), in the config file and with
``leveret ctl``; with ``on-confirm`` nothing is lost when either side is killed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from eventually import eventually, eventually_equal, poll
from postgres import free_port
from servers import ServerProcess
from targets import Target, unique

from leveret import BlockingBroker

TIMEOUT = 60.0


@pytest.fixture
def source() -> Iterator[Target]:
    """An in-process leveret with its management API: where shovels are defined."""
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))


@pytest.fixture
def destination() -> Iterator[Target]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))


def publish(url: str, queue: str, count: int, prefix: str = "m") -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for number in range(count):
        channel.basic_publish("", queue, f"{prefix}{number}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()


def depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1
    finally:
        if connection.is_open:
            connection.close()


def wait_depth(url: str, queue: str, count: int, timeout: float = TIMEOUT) -> None:
    found = eventually_equal(lambda: depth(url, queue), count, timeout, 0.1)
    assert found == count, f"{queue} has {found} messages, not {count}"


def bodies(url: str, queue: str) -> list[str]:
    """Every message of ``queue``, consumed and acked."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    found = []
    while True:
        method, _, body = channel.basic_get(queue)
        if method is None:
            break
        found.append(body.decode())
        channel.basic_ack(method.delivery_tag)
    connection.close()
    return found


def put_shovel(target: Target, name: str, value: dict, vhost: str = "%2F") -> int:
    return target.http("PUT", f"/api/parameters/shovel/{vhost}/{name}", {"value": value})[0]


def test_a_shovel_moves_a_queue_to_another_leveret_and_reports_its_status(source, destination):
    src_queue, dest_queue = unique("outbox"), unique("inbox")
    publish(source.url(), src_queue, 500)
    value = {"src-uri": "amqp://", "src-queue": src_queue, "dest-uri": destination.url(),
             "dest-queue": dest_queue}  # fmt: skip
    assert put_shovel(source, "move", value) == 201
    wait_depth(destination.url(), dest_queue, 500)
    wait_depth(source.url(), src_queue, 0)
    assert sorted(bodies(destination.url(), dest_queue)) == sorted(f"m{n}" for n in range(500))
    [row] = source.http("GET", "/api/shovels")[1]
    assert row["name"] == "move" and row["vhost"] == "/" and row["type"] == "dynamic"
    assert row["state"] == "running" and row["messages_forwarded"] == 500
    assert "guest:" not in row["dest_uri"]  # no password in the status
    stored = source.http("GET", "/api/parameters/shovel/%2F/move")[1]
    assert stored == {"component": "shovel", "vhost": "/", "name": "move", "value": value}
    assert put_shovel(source, "move", {**value, "ack-mode": "on-publish"}) == 204  # replaced
    assert source.http("DELETE", "/api/parameters/shovel/%2F/move")[0] == 204
    assert eventually(lambda: not source.http("GET", "/api/shovels")[1], 5)
    publish(source.url(), src_queue, 3)  # no shovel any more: they stay
    time.sleep(0.5)
    assert depth(source.url(), src_queue) == 3


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_other_ack_modes_move_messages_to_an_exchange_with_its_key(source, destination, ack_mode):
    src_queue, dest_queue = unique("outbox"), unique("routed")
    connection = pika.BlockingConnection(pika.URLParameters(destination.url()))
    channel = connection.channel()
    channel.queue_declare(dest_queue, durable=True)
    channel.queue_bind(dest_queue, "amq.direct", "shovelled")
    connection.close()
    publish(source.url(), src_queue, 50)
    value = {
        "src-uri": "amqp://", "src-queue": src_queue, "dest-uri": [destination.url()],
        "dest-exchange": "amq.direct", "dest-exchange-key": "shovelled", "ack-mode": ack_mode,
    }  # fmt: skip
    assert put_shovel(source, "routed", value) == 201
    wait_depth(destination.url(), dest_queue, 50)
    wait_depth(source.url(), src_queue, 0)


def test_src_delete_after_queue_length_moves_that_many_then_the_shovel_deletes_itself(source, destination):
    src_queue, dest_queue = unique("outbox"), unique("inbox")
    publish(source.url(), src_queue, 30)
    value = {
        "src-uri": "amqp://", "src-queue": src_queue, "dest-uri": destination.url(),
        "dest-queue": dest_queue, "src-delete-after": "queue-length", "src-prefetch-count": 7,
    }  # fmt: skip
    assert put_shovel(source, "once", value) == 201
    wait_depth(destination.url(), dest_queue, 30)
    assert eventually(lambda: not source.http("GET", "/api/parameters/shovel")[1], 10)
    publish(source.url(), src_queue, 5)  # later ones stay
    time.sleep(0.5)
    assert depth(source.url(), src_queue) == 5 and depth(destination.url(), dest_queue) == 30


GOOD = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://"}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"src-queue": None, "dest-queue": "q"}, "exactly one of src-queue"),
        ({"ack-mode": "sometimes"}, "ack-mode"),
        ({"src-uri": "http://x"}, "src-uri"),
        ({"bogus": 1}, "unrecognised"),
        ({"src-delete-after": -1}, "delete-after"),
    ],
)
def test_a_bad_definition_is_refused_with_rabbitmqs_400(source, change, reason):
    value = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    status, body = source.http("PUT", "/api/parameters/shovel/%2F/bad", {"value": value})
    assert status == 400 and body["error"] == "bad_request"
    assert body["reason"].startswith("Validation failed") and reason in body["reason"]
    assert source.http("GET", "/api/parameters")[1] == []


def test_a_user_without_policymaker_may_not_define_shovels(source):
    assert source.http("PUT", "/api/users/plain", {"password": "pw", "tags": ""})[0] == 201
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert source.http("PUT", "/api/permissions/%2F/plain", everything)[0] == 201
    body = {"value": {**GOOD, "dest-queue": "b"}}
    status, _ = source.http("PUT", "/api/parameters/shovel/%2F/s", body, user="plain", password="pw")
    assert status == 401


def server(tmp_path: Path, name: str, port: int, *args: str) -> ServerProcess:
    return ServerProcess(tmp_path / name, "--amqp-port", str(port), "--http-port", "-1", *args)


@pytest.mark.parametrize("killed", ["destination", "source"])
def test_on_confirm_loses_nothing_when_either_side_is_killed(tmp_path, killed):
    """Both brokers are processes with data directories; the shovel runs on the
    source. ``kill -9`` of one side mid-transfer, then a restart: every message
    arrives (duplicates allowed)."""
    src_port, dest_port = free_port(), free_port()
    dest_url = f"amqp://guest:guest@127.0.0.1:{dest_port}/%2F"
    config = tmp_path / "shovel.toml"
    config.write_text(
        '[[shovels]]\nname = "bulk"\nsrc-uri = "amqp://"\nsrc-queue = "outbox"\n'
        f'dest-uri = "{dest_url}"\ndest-queue = "inbox"\nsrc-prefetch-count = 200\nreconnect-delay = 0.2\n'
    )
    total = 4000
    src = server(tmp_path, "src", src_port)  # no shovel yet: fill the queue first
    publish(src.url, "outbox", total)
    src.terminate()
    dest = server(tmp_path, "dest", dest_port)
    src = server(tmp_path, "src", src_port, "--config", str(config))
    try:
        deadline = time.monotonic() + TIMEOUT
        while depth(dest.url, "inbox") < total // 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        if killed == "destination":
            dest.kill()
            dest = server(tmp_path, "dest", dest_port)
        else:
            src.kill()
            src = server(tmp_path, "src", src_port, "--config", str(config))
        wait_depth(src.url, "outbox", 0)
        received = set(bodies(dest.url, "inbox"))
        assert received == {f"m{n}" for n in range(total)}
    finally:
        src.kill()
        dest.kill()


def test_leveret_shovels_to_and_from_rabbitmq(source, rabbitmq_target):
    """Both directions, run by leveret: leveret → RabbitMQ, then RabbitMQ → leveret."""
    outbox, inbox, back = unique("outbox"), unique("inbox"), unique("back")
    publish(source.url(), outbox, 200)
    rabbit = rabbitmq_target.url()
    to_rabbit = {"src-uri": "amqp://", "src-queue": outbox, "dest-uri": rabbit, "dest-queue": inbox}
    assert put_shovel(source, "to-rabbit", to_rabbit) == 201
    wait_depth(rabbitmq_target.url(), inbox, 200)
    from_rabbit = {"src-uri": rabbit, "src-queue": inbox, "dest-uri": "amqp://", "dest-queue": back}
    assert put_shovel(source, "from-rabbit", from_rabbit) == 201
    wait_depth(source.url(), back, 200)
    assert sorted(bodies(source.url(), back)) == sorted(f"m{n}" for n in range(200))
    assert depth(rabbitmq_target.url(), inbox) == 0


def test_ctl_sets_lists_and_clears_shovel_parameters(server_process, tmp_path):
    import subprocess
    import sys

    data_dir = str(tmp_path / "data")
    value = '{"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}'

    def ctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "leveret", "ctl", "--data-dir", data_dir, *args],
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    assert ctl("set_parameter", "shovel", "a-to-b", value).returncode == 0
    listed = ctl("list_parameters")
    assert listed.returncode == 0 and "a-to-b" in listed.stdout and "shovel" in listed.stdout
    publish(server_process.url, "a", 10)
    wait_depth(server_process.url, "b", 10)
    status = ctl("shovel_status")
    assert "a-to-b" in status.stdout and "running" in status.stdout
    bad = ctl("set_parameter", "shovel", "bad", '{"src-uri": "amqp://"}')
    assert bad.returncode != 0 and "src-queue" in bad.stderr
    assert ctl("clear_parameter", "shovel", "a-to-b").returncode == 0
    assert "a-to-b" not in ctl("list_parameters").stdout


def test_shovels_travel_in_exported_definitions_and_survive_a_restart(tmp_path):
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "one")) as broker:
        target = Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))
        assert put_shovel(target, "a-to-b", value) == 201
        exported = target.http("GET", "/api/definitions")[1]
    assert {"value": value, "vhost": "/", "component": "shovel", "name": "a-to-b"} in exported["parameters"]
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "one")) as broker:
        target = Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))
        assert [row["name"] for row in target.http("GET", "/api/shovels")[1]] == ["a-to-b"]  # recovered
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        target = Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))
        assert target.http("POST", "/api/definitions", exported)[0] in (200, 201, 204)
        publish(target.url(), "a", 5)
        wait_depth(target.url(), "b", 5)


def test_deleting_a_vhost_deletes_its_shovels(source):
    assert source.http("PUT", "/api/vhosts/east")[0] == 201
    value = {**GOOD, "dest-queue": "b"}
    assert put_shovel(source, "in-east", value, vhost="east") == 201
    assert [r["vhost"] for r in source.http("GET", "/api/shovels")[1]] == ["east"]
    assert source.http("DELETE", "/api/vhosts/east")[0] == 204
    assert source.http("GET", "/api/parameters")[1] == []
    assert eventually(lambda: not source.http("GET", "/api/shovels")[1], 5)


def test_a_missing_destination_exchange_is_retried_until_it_exists(source, destination):
    """The destination closes the channel (404): the shovel reconnects after
    reconnect-delay, and moves the message once the exchange is there."""
    src_queue, dest_queue = unique("outbox"), unique("late")
    publish(source.url(), src_queue, 1)
    value = {**GOOD, "src-queue": src_queue, "dest-uri": destination.url(), "dest-exchange": "late-x",
             "dest-exchange-key": "k", "reconnect-delay": 0.2}  # fmt: skip
    assert put_shovel(source, "late", value) == 201

    def ended(rows: list) -> bool:
        return not rows or rows[0]["state"] == "terminated"

    rows = poll(lambda: source.http("GET", "/api/shovels")[1], ended, 10, 0.05)
    assert ended(rows)
    assert "404" in rows[0]["reason"] or "NOT_FOUND" in rows[0]["reason"]
    connection = pika.BlockingConnection(pika.URLParameters(destination.url()))
    channel = connection.channel()
    channel.exchange_declare("late-x", "direct")
    channel.queue_declare(dest_queue)
    channel.queue_bind(dest_queue, "late-x", "k")
    connection.close()
    wait_depth(destination.url(), dest_queue, 1)
    wait_depth(source.url(), src_queue, 0)


def test_no_ack_with_a_count_moves_that_many_and_leaves_the_rest(source, destination):
    src_queue, dest_queue = unique("outbox"), unique("inbox")
    publish(source.url(), src_queue, 10)
    value = {**GOOD, "src-queue": src_queue, "dest-uri": destination.url(), "dest-queue": dest_queue,
             "ack-mode": "no-ack", "src-delete-after": 2}  # fmt: skip
    assert put_shovel(source, "two", value) == 201
    wait_depth(destination.url(), dest_queue, 2)
    assert eventually(lambda: not source.http("GET", "/api/parameters")[1], 10)
    assert depth(source.url(), src_queue) == 8  # none lost


def test_rabbitmqs_extra_keys_forward_headers_and_local_vhost_uris(source):
    assert source.http("PUT", "/api/vhosts/west")[0] == 201
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert source.http("PUT", "/api/permissions/west/guest", everything)[0] in (201, 204)
    publish(source.url(), "fwd-src", 1)
    value = {"src-uri": "amqp://", "src-queue": "fwd-src", "dest-uri": "amqp:///west",
             "dest-queue": "fwd-dst", "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
             "dest-publish-properties": {"priority": 3}, "src-predeclared": True}  # fmt: skip
    assert put_shovel(source, "fwd", value) == 201
    west = source.url(vhost="west")
    wait_depth(west, "fwd-dst", 1)
    connection = pika.BlockingConnection(pika.URLParameters(west))
    _, properties, body = connection.channel().basic_get("fwd-dst", auto_ack=True)
    connection.close()
    assert body == b"m0" and properties.priority == 3
    [forwarded] = properties.headers["x-shovelled"]
    assert forwarded["shovel-name"] == "fwd" and forwarded["src-queue"] == "fwd-src"
    assert forwarded["shovel-vhost"] == "/" and isinstance(properties.headers["x-shovelled-timestamp"], int)


def test_a_finished_shovel_leaves_no_connection_open(source, destination):
    src_queue, dest_queue = unique("outbox"), unique("inbox")
    for number in range(3):
        publish(source.url(), src_queue, 2)
        value = {**GOOD, "src-queue": src_queue, "dest-uri": destination.url(), "dest-queue": dest_queue,
                 "src-delete-after": "queue-length"}  # fmt: skip
        assert put_shovel(source, f"once-{number}", value) == 201
        wait_depth(destination.url(), dest_queue, 2 * (number + 1))

    def idle() -> bool:
        return not any(broker.http("GET", "/api/connections")[1] for broker in (source, destination))

    assert eventually(idle, 10), "a finished shovel kept a connection"
