"""AMQP 1.0 connections for operators, with python-qpid-proton (its blocking API) against
a real leveret: the management API lists them (protocol ``AMQP 1.0``, user, vhost, SASL
mechanism, container id), ``GET /api/connections/{name}/sessions`` shows their sessions
and links in RabbitMQ 4's shape (windows, handles, addresses, settle modes, credit,
unsettled and unconfirmed deliveries, filters), 404 for no such connection and 400 for
an AMQP 0-9-1 one (RabbitMQ 4's answers), an operator's close (HTTP ``DELETE`` and
``leveret ctl close_connection``) reaches the client as ``close`` with
``amqp:connection:forced``, and Prometheus counts AMQP 1.0 messages under
``protocol="amqp10"``."""

from __future__ import annotations

import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator

import pika
import pytest
from eventually import eventually
from prometheus_client.parser import text_string_to_metric_families
from proton import Endpoint, Message, Timeout
from proton.reactor import AtMostOnce, Selector
from proton.utils import BlockingConnection, ConnectionClosed
from servers import ServerProcess, ctl_rows as ctl
from targets import Target

from leveret import BlockingBroker

FORCED = "amqp:connection:forced"


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, prometheus_port=0) as broker:
        yield broker


@pytest.fixture(scope="module")
def api(broker: BlockingBroker) -> Target:
    return Target.of(broker)


def connect(port: int, container: str, user: str | None = "guest") -> BlockingConnection:
    if user is None:  # SASL ANONYMOUS
        return BlockingConnection(
            f"amqp://127.0.0.1:{port}",
            container=container_of(container),
            allowed_mechs="ANONYMOUS",
            timeout=5,
        )
    return BlockingConnection(
        f"amqp://{user}:{user}@127.0.0.1:{port}", container=container_of(container), timeout=5
    )


def container_of(name: str):
    from proton.reactor import Container

    return Container(container_id=name)


def pumping(connection: BlockingConnection):
    """``wait`` for :func:`eventually` that runs proton's I/O meanwhile (its blocking API
    sends a disposition only when it runs)."""

    def wait(seconds: float) -> None:
        try:
            connection.wait(lambda: False, timeout=seconds)
        except Timeout:
            pass

    return wait


def row_of(api: Target, container: str) -> dict | None:
    rows = api.http("GET", "/api/connections")[1]
    return next((r for r in rows if r["client_properties"].get("container_id") == container), None)


def sessions(api: Target, name: str) -> tuple[int, object]:
    return api.http("GET", f"/api/connections/{urllib.parse.quote(name, safe='')}/sessions")


def queue(api: Target) -> str:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    assert api.http("PUT", f"/api/queues/%2F/{name}", {"durable": True})[0] == 201
    return name


def closed_with(connection: BlockingConnection) -> tuple[str, str]:
    """The condition and text of the broker's ``close`` (proton raises ConnectionClosed
    once it arrives)."""
    with pytest.raises(ConnectionClosed):
        connection.wait(lambda: False, timeout=5, msg="no close from the broker")
    condition = connection.conn.remote_condition
    assert condition is not None
    return condition.name, condition.description


# -- the connection list ----------------------------------------------------------------
@pytest.mark.parametrize(("user", "mechanism"), [("guest", "PLAIN"), (None, "ANONYMOUS")])
def test_the_api_lists_an_amqp10_connection(broker, api, user, mechanism):
    container = f"ops-{uuid.uuid4().hex[:8]}"
    connection = connect(broker.amqp_port, container, user)
    try:
        row = eventually(lambda: row_of(api, container))
        assert row is not None
        assert row["protocol"] == "AMQP 1.0"
        assert row["container_id"] == container  # RabbitMQ 4 lists it at the top level
        assert (row["user"], row["vhost"], row["auth_mechanism"]) == ("guest", "/", mechanism)
        # RabbitMQ 4's meanings: the client's max-frame-size (proton's 32 KiB: the largest
        # frame the broker sends it) and the highest channel number
        assert (row["frame_max"], row["channel_max"]) == (32768, 63)
        assert row["channels"] == 0  # no session yet
        name = urllib.parse.quote(row["name"], safe="")
        assert api.http("GET", f"/api/connections/{name}")[1]["protocol"] == "AMQP 1.0"
        assert row_of(api, container) in api.http("GET", "/api/vhosts/%2F/connections")[1]
    finally:
        connection.close()
    assert eventually(lambda: row_of(api, container) is None)


# -- sessions and links -----------------------------------------------------------------
def test_sessions_show_windows_links_credit_and_addresses(broker, api):
    q = queue(api)
    container = f"ops-{uuid.uuid4().hex[:8]}"
    connection = connect(broker.amqp_port, container)
    try:
        sender = connection.create_sender(f"/queues/{q}", name="my sender")
        for i in range(3):
            sender.send(Message(body=f"m{i}"))  # unsettled: waits for accepted
        receiver = connection.create_receiver(
            f"/queues/{q}", name="my receiver", credit=10, options=Selector("color = 'red' OR color IS NULL")
        )
        for _ in range(3):
            receiver.receive(timeout=5)  # not accepted yet: 3 unsettled deliveries
        row = eventually(lambda: row_of(api, container))
        assert row is not None and row["channels"] == 1
        status, answer = sessions(api, row["name"])
        assert status == 200 and isinstance(answer, list)
        [session] = answer
        assert session["channel_number"] == 0
        assert session["handle_max"] == 255
        assert session["outgoing_unsettled_deliveries"] == 3
        assert session["next_outgoing_id"] == 3  # three transfer frames sent
        assert session["next_incoming_id"] == 3  # three received
        for window in ("incoming_window", "remote_incoming_window", "remote_outgoing_window"):
            assert isinstance(session[window], int) and session[window] > 0, window
        [incoming] = session["incoming_links"]
        assert incoming == {
            "handle": 0,
            "link_name": "my sender",
            "target_address": f"/queues/{q}",
            "snd_settle_mode": "mixed",  # proton's default
            "max_message_size": 16 * 1024 * 1024,
            "delivery_count": 3,
            "credit": incoming["credit"],
            "unconfirmed_messages": 0,
        }
        assert 0 < incoming["credit"] <= 256
        [outgoing] = session["outgoing_links"]
        assert outgoing == {
            "handle": 1,
            "link_name": "my receiver",
            "source_address": f"/queues/{q}",
            "queue_name": q,
            "send_settled": False,
            "max_message_size": "unlimited",
            "filter": [
                {
                    "name": "selector",
                    "descriptor": "apache.org:selector-filter:string",
                    "value": "color = 'red' OR color IS NULL",
                }
            ],
            "delivery_count": 3,
            "credit": 7,
            "consumer_timeout": False,
        }
        for _ in range(3):
            receiver.accept()  # proton's blocking receiver settles the oldest delivery
        assert eventually(
            lambda: sessions(api, row["name"])[1][0]["outgoing_unsettled_deliveries"] == 0,
            wait=pumping(connection),
        )
    finally:
        connection.close()


def test_a_second_session_and_settled_links(broker, api):
    """Two sessions, each on its channel; a sender that settles first shows
    ``snd_settle_mode`` ``settled``, a receiver taking settled deliveries
    ``send_settled``."""
    q = queue(api)
    container = f"ops-{uuid.uuid4().hex[:8]}"
    connection = connect(broker.amqp_port, container)
    try:
        connection.create_receiver(f"/queues/{q}", name="r0", credit=5)  # the default session
        session = connection.conn.session()
        session.open()
        sender = session.sender("settled sender")
        sender.target.address = f"/queues/{q}"
        sender.snd_settle_mode = sender.SND_SETTLED
        sender.open()
        receiver = session.receiver("settled receiver")
        receiver.source.address = f"/queues/{q}"
        receiver.snd_settle_mode = receiver.SND_SETTLED
        receiver.open()
        receiver.flow(4)
        connection.wait(
            lambda: (
                bool(receiver.state & Endpoint.REMOTE_ACTIVE) and bool(sender.state & Endpoint.REMOTE_ACTIVE)
            ),
            timeout=5,
        )
        row = eventually(lambda: row_of(api, container))
        assert row is not None

        def two() -> list | None:
            answer = sessions(api, row["name"])[1]
            return answer if len(answer) == 2 and answer[1]["outgoing_links"] else None

        answer = eventually(two)
        assert answer is not None
        assert [s["channel_number"] for s in answer] == [0, 1]
        # proton's blocking API grants its own prefetch (10) beside the credit asked for
        assert [(link["link_name"], link["credit"] >= 5) for link in answer[0]["outgoing_links"]] == [
            ("r0", True)
        ]
        second = answer[1]
        assert [(link["link_name"], link["snd_settle_mode"]) for link in second["incoming_links"]] == [
            ("settled sender", "settled")
        ]
        [out] = second["outgoing_links"]
        assert (out["link_name"], out["send_settled"], out["credit"]) == ("settled receiver", True, 4)
        assert eventually(lambda: row_of(api, container)["channels"] == 2)
    finally:
        connection.close()


def test_sessions_of_a_missing_connection_is_404(api):
    status, body = api.http(
        "GET", "/api/connections/" + urllib.parse.quote("1.2.3.4:5 -> 6.7.8.9:10", safe="") + "/sessions"
    )
    assert status == 404
    assert body == {"error": "Object Not Found", "reason": "Not Found"}


def test_sessions_of_an_amqp091_connection_is_400(broker, api):
    """RabbitMQ 4: ``400 connection does not use AMQP 1.0``."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        port = connection._impl._transport._sock.getsockname()[1]
        rows = api.http("GET", "/api/connections")[1]
        [row] = [r for r in rows if r["peer_port"] == port]
        assert row["protocol"] == "AMQP 0-9-1"
        status, body = sessions(api, row["name"])
        assert status == 400
        assert body == {"error": "bad_request", "reason": "connection does not use AMQP 1.0"}
    finally:
        connection.close()


# -- closing ----------------------------------------------------------------------------
def test_an_operators_close_is_connection_forced(broker, api):
    container = f"ops-{uuid.uuid4().hex[:8]}"
    connection = connect(broker.amqp_port, container)
    try:
        connection.create_receiver(f"/queues/{queue(api)}", credit=1)
        row = eventually(lambda: row_of(api, container))
        assert row is not None
        name = urllib.parse.quote(row["name"], safe="")
        status, _ = api.http("DELETE", f"/api/connections/{name}", headers={"X-Reason": "maintenance"})
        assert status == 204
        condition, text = closed_with(connection)
        assert condition == FORCED
        assert "maintenance" in text
        assert eventually(lambda: row_of(api, container) is None)
        assert api.http("GET", f"/api/connections/{name}/sessions")[0] == 404
    finally:
        connection.close()


def test_deleting_the_vhost_closes_its_amqp10_connections(broker, api):
    vhost = f"ops-{uuid.uuid4().hex[:6]}"
    assert api.http("PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert api.http(
        "PUT", f"/api/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )[0] in (201, 204)
    connection = BlockingConnection(
        f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}", virtual_host=f"vhost:{vhost}", timeout=5
    )
    try:
        assert api.http("DELETE", f"/api/vhosts/{vhost}")[0] == 204
        condition, _ = closed_with(connection)
        assert condition == FORCED
    finally:
        connection.close()


def test_a_user_sees_the_sessions_of_their_own_connections_only(broker, api):
    """As ``/api/connections/{name}``: a user without ``administrator``/``monitoring``
    gets 401 for another user's connection (RabbitMQ's ``is_authorized_user``)."""
    user = f"u{uuid.uuid4().hex[:6]}"
    assert api.http("PUT", f"/api/users/{user}", {"password": user, "tags": "management"})[0] == 201
    assert api.http("PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})[
        0
    ] in (201, 204)
    theirs = connect(broker.amqp_port, f"ops-{uuid.uuid4().hex[:8]}", user)
    container = f"ops-{uuid.uuid4().hex[:8]}"
    guests = connect(broker.amqp_port, container)
    try:
        row = eventually(lambda: row_of(api, container))
        assert row is not None
        path = f"/api/connections/{urllib.parse.quote(row['name'], safe='')}/sessions"
        assert api.http("GET", path, user=user, password=user)[0] == 401
        own = [r for r in api.http("GET", "/api/connections", user=user, password=user)[1]]
        assert [r["user"] for r in own] == [user]
        own_path = f"/api/connections/{urllib.parse.quote(own[0]['name'], safe='')}/sessions"
        assert api.http("GET", own_path, user=user, password=user) == (200, [])
    finally:
        theirs.close()
        guests.close()
        api.http("DELETE", f"/api/users/{user}")


def test_ctl_lists_and_closes_amqp10_connections(tmp_path):
    server = ServerProcess(tmp_path / "data")
    try:
        container = f"ctl-{uuid.uuid4().hex[:8]}"
        connection = connect(server.port, container)
        try:
            columns = ("name", "protocol", "user", "vhost", "auth_mechanism", "channels", "client_properties")
            rows = ctl(tmp_path / "data", "list_connections", *columns)
            mine = [r for r in rows if f'"container_id": "{container}"' in r[6]]
            assert len(mine) == 1
            assert mine[0][1:6] == ["AMQP 1.0", "guest", "/", "PLAIN", "0"]
            ctl(tmp_path / "data", "close_connection", mine[0][0], "go away")
            condition, text = closed_with(connection)
            assert condition == FORCED and "go away" in text
            rows = ctl(tmp_path / "data", "list_connections", *columns)
            assert not [r for r in rows if f'"container_id": "{container}"' in r[6]]
        finally:
            connection.close()
    finally:
        server.kill()


# -- Prometheus -------------------------------------------------------------------------
def scrape(broker: BlockingBroker) -> dict[tuple[str, frozenset], float]:
    url = str(broker.prometheus_url).rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


CLASSIC = "rabbit_classic_queue"


def value(samples: dict, name: str, protocol: str, queue_type: str | None = None) -> float:
    labels = {("protocol", protocol)} | ({("queue_type", queue_type)} if queue_type else set())
    return samples.get((name, frozenset(labels)), 0.0)


def test_prometheus_counts_amqp10_messages_under_protocol_amqp10(broker, api):
    """RabbitMQ 4's ``protocol="amqp10"`` series: AMQP 1.0 clients' publishes,
    deliveries, acknowledgements, publishers and consumers; the ``amqp091`` series do not
    move (a sum over ``protocol`` is the broker's total)."""
    q = queue(api)
    before = scrape(broker)
    connection = connect(broker.amqp_port, f"ops-{uuid.uuid4().hex[:8]}")
    try:
        sender = connection.create_sender(f"/queues/{q}", name="unsettled")
        for i in range(3):
            sender.send(Message(body=f"m{i}"))
        settled = connection.create_sender(f"/queues/{q}", name="settled", options=AtMostOnce())
        settled.send(Message(body="settled"))
        nowhere = connection.create_sender("/exchanges/amq.direct/no-such-key")
        with pytest.raises(Exception, match="38"):  # released: PN_RELEASED, routed nowhere
            nowhere.send(Message(body="lost"))
        receiver = connection.create_receiver(f"/queues/{q}", credit=10)
        for _ in range(4):
            receiver.receive(timeout=5)
            receiver.accept()

        def counted(samples: dict) -> bool:
            def delta(name: str, protocol: str = "amqp10", queue_type: str | None = CLASSIC) -> float:
                return value(samples, name, protocol, queue_type) - value(before, name, protocol, queue_type)

            return (
                delta("rabbitmq_global_messages_received_total", queue_type=None) == 5
                and delta("rabbitmq_global_messages_received_confirm_total", queue_type=None) == 5
                and delta("rabbitmq_global_messages_routed_total", queue_type=None) == 4
                and delta("rabbitmq_global_messages_unroutable_returned_total", queue_type=None) == 1
                and delta("rabbitmq_global_messages_confirmed_total", queue_type=None) == 5
                and delta("rabbitmq_global_messages_delivered_consume_manual_ack_total") == 4
                and delta("rabbitmq_global_messages_acknowledged_total") == 4
                and value(samples, "rabbitmq_global_publishers", "amqp10") == 3
                and value(samples, "rabbitmq_global_consumers", "amqp10") == 1
                and delta("rabbitmq_global_messages_received_total", "amqp091", None) == 0
                and delta("rabbitmq_global_messages_delivered_total", "amqp091") == 0
                and value(samples, "rabbitmq_global_consumers", "amqp091") == 0
            )

        assert eventually(lambda: counted(scrape(broker)), wait=pumping(connection))
    finally:
        connection.close()

    def gone() -> bool:  # the links went with the connection
        samples = scrape(broker)
        return all(value(samples, f"rabbitmq_global_{g}", "amqp10") == 0 for g in ("publishers", "consumers"))

    assert eventually(gone)
