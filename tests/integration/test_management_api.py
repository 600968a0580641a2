"""The management API's lists, exchanges, queues, bindings, connections, channels,
consumers, nodes, overview, publish, get and health checks, as RabbitMQ 3.10's
management plugin answers them: every ``target`` test runs against leveret and a
RabbitMQ node (when installed) with the same HTTP and AMQP calls and expects the same
statuses and bodies (read from RabbitMQ 3.10.8)."""

from __future__ import annotations

import functools
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest
from eventually import eventually
from stomp_clients import Client
from targets import Target, unique

from leveret import BlockingBroker

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
ACCESS_REFUSED = {"error": "not_authorised", "reason": "Access refused."}


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


#: RabbitMQ's statistics lag behind: poll for up to 15 s until ``check()`` is truthy.
wait_for = functools.partial(eventually, timeout=15.0, interval=0.2)


# -- lists --------------------------------------------------------------------------
def test_lists_sort_page_filter_and_pick_columns(target, vhost):
    v = q(vhost)
    for name in ("qb", "qa", "abc", "qc", "zz"):
        assert target.http("PUT", f"/api/queues/{v}/{name}", {})[0] == 201
    status, body = target.http("GET", f"/api/queues/{v}?page=1&page_size=2&name=Q&columns=name,vhost")
    assert status == 200
    assert body == {"filtered_count": 3, "item_count": 2, "page": 1, "page_count": 2, "page_size": 2,
                    "total_count": 5,
                    "items": [{"name": "qa", "vhost": vhost}, {"name": "qb", "vhost": vhost}]}
    query = "page=2&page_size=2&name=^q&use_regex=true&columns=name"
    status, body = target.http("GET", f"/api/queues/{v}?{query}")
    assert (status, body["items"], body["page"]) == (200, [{"name": "qc"}], 2)
    status, body = target.http("GET", f"/api/queues/{v}?sort=name&sort_reverse=true&columns=name,arguments.x")
    assert body == [{"name": n, "arguments": {}} for n in ("zz", "qc", "qb", "qa", "abc")]
    # without page, name filters nothing (RabbitMQ filters only pages)
    assert len(target.http("GET", f"/api/queues/{v}?name=q&columns=name")[1]) == 5


@pytest.mark.parametrize(("query", "error"), [
    ("page=9", {"error": "page_out_of_range", "reason": "Page out of range, page: 9 page size: 100, len: 1"}),
    ("page=1&page_size=501", {"error": "invalid_pagination_parameters",
                              "reason": "Invalid pagination parameters: page number 1, page size 501"}),
    ("page=0", {"error": "invalid_pagination_parameters",
                "reason": "Invalid pagination parameters: page number 0, page size undefined"}),
    ("page=x", {"error": "bad_request", "reason": "Pagination parameters are invalid"}),
])
def test_bad_paging_is_a_400(target, vhost, query, error):
    assert target.http("PUT", f"/api/queues/{q(vhost)}/only", {})[0] == 201
    assert target.http("GET", f"/api/queues/{q(vhost)}?{query}") == (400, error)


def test_exchanges_page_and_sort(target, vhost):
    status, body = target.http("GET", f"/api/exchanges/{q(vhost)}?page=1&name=AMQ.D&columns=name,type")
    assert status == 200
    assert body["items"] == [{"name": "amq.direct", "type": "direct"}]
    names = [e["name"] for e in target.http("GET", f"/api/exchanges/{q(vhost)}?sort=name")[1]]
    assert names[0] == "" and "amq.topic" in names and names == sorted(names)


# -- exchanges ----------------------------------------------------------------------
def test_exchange_put_get_delete(target, vhost):
    v = q(vhost)
    assert target.http("PUT", f"/api/exchanges/{v}/x", {"type": "topic", "durable": True}) == (201, None)
    assert target.http("PUT", f"/api/exchanges/{v}/x", {"type": "topic", "durable": True}) == (204, None)
    status, body = target.http("GET", f"/api/exchanges/{v}/x")
    assert status == 200
    keys = ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
    assert {k: body[k] for k in keys} == \
        {"name": "x", "vhost": vhost, "type": "topic", "durable": True, "auto_delete": False,
         "internal": False,
         "arguments": {}}
    assert target.http("PUT", f"/api/exchanges/{v}/x", {"type": "fanout", "durable": True}) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'type' for exchange 'x' in vhost '{vhost}': "
                  "received 'fanout' but current is 'topic'"})
    assert target.http("PUT", f"/api/exchanges/{v}/y", {"type": "bogus"}) == \
        (400, {"error": "bad_request", "reason": "unknown exchange type 'bogus'"})
    assert target.http("PUT", f"/api/exchanges/{v}/amq.mine", {"type": "direct"}) == (401, ACCESS_REFUSED)
    assert target.http("PUT", f"/api/exchanges/{v}/z", {"type": "direct", "durable": "yes"}) == \
        (400, {"error": "bad_request", "reason": ["not_boolean", "yes"]})
    assert target.http("GET", f"/api/exchanges/{v}/y") == (404, NOT_FOUND)
    default = target.http("GET", f"/api/exchanges/{v}/amq.default")[1]
    assert (default["name"], default["type"], default["durable"]) == ("", "direct", True)
    assert target.http("DELETE", f"/api/exchanges/{v}/amq.direct") == (401, ACCESS_REFUSED)
    assert target.http("DELETE", f"/api/exchanges/{v}/x") == (204, None)
    assert target.http("DELETE", f"/api/exchanges/{v}/x") == (404, NOT_FOUND)
    assert target.http("GET", f"/api/exchanges/nope-{vhost}/x") == (404, NOT_FOUND)


def test_exchange_delete_if_unused_keeps_a_used_one(target, vhost):
    v = q(vhost)
    target.http("PUT", f"/api/exchanges/{v}/x", {"type": "direct"})
    target.http("PUT", f"/api/queues/{v}/q", {})
    assert target.http("POST", f"/api/bindings/{v}/e/x/q/q", {"routing_key": "k"})[0] == 201
    assert target.http("DELETE", f"/api/exchanges/{v}/x?if-unused=true") == \
        (400, {"error": "bad_request", "reason": f"exchange 'x' in vhost '{vhost}' in use"})
    assert target.http("GET", f"/api/exchanges/{v}/x")[0] == 200
    assert target.http("DELETE", f"/api/exchanges/{v}/x") == (204, None)


# -- queues -------------------------------------------------------------------------
def test_queue_put_get_delete(target, vhost):
    v = q(vhost)
    assert target.http("PUT", f"/api/queues/{v}/q", {"durable": True, "arguments": {"x-max-length": 5}}) == \
        (201, None)
    assert target.http("PUT", f"/api/queues/{v}/q", {"durable": True, "arguments": {"x-max-length": 5}}) == \
        (204, None)
    assert target.http("PUT", f"/api/queues/{v}/q", {"durable": False}) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue 'q' in vhost '{vhost}': "
                  "received 'false' but current is 'true'"})
    assert target.http("PUT", f"/api/queues/{v}/bad", {"arguments": {"x-max-length": "x"}}) == (400, {
        "error": "bad_request",
        "reason": f"invalid arg 'x-max-length' for queue 'bad' in vhost '{vhost}': "
                  '"expected integer, got longstr"'})
    assert target.http("GET", f"/api/queues/{v}/bad") == (404, NOT_FOUND)
    assert target.http("PUT", f"/api/queues/{v}/amq.q", {}) == (401, ACCESS_REFUSED)
    status, body = target.http("GET", f"/api/queues/{v}/q")
    assert status == 200
    keys = ("name", "vhost", "type", "durable", "auto_delete", "exclusive", "arguments")
    assert {k: body[k] for k in keys} == \
        {"name": "q", "vhost": vhost, "type": "classic", "durable": True, "auto_delete": False,
         "exclusive": False,
         "arguments": {"x-max-length": 5}}
    assert target.http("DELETE", f"/api/queues/{v}/q") == (204, None)
    assert target.http("DELETE", f"/api/queues/{v}/q") == (404, NOT_FOUND)


def test_queue_delete_if_empty_and_if_unused(target, vhost):
    v = q(vhost)
    target.http("PUT", f"/api/queues/{v}/q", {})
    assert target.http("POST", f"/api/exchanges/{v}/amq.default/publish", {
        "properties": {}, "routing_key": "q", "payload": "m", "payload_encoding": "string"}) == \
        (200, {"routed": True})
    assert target.http("DELETE", f"/api/queues/{v}/q?if-empty=true") == \
        (400, {"error": "bad_request", "reason": f"queue 'q' in vhost '{vhost}' not empty"})
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.basic_consume("q", lambda *args: None)
    assert wait_for(lambda: target.http("DELETE", f"/api/queues/{v}/q?if-unused=true")[0] == 400)
    assert target.http("DELETE", f"/api/queues/{v}/q?if-unused=true") == \
        (400, {"error": "bad_request", "reason": f"queue 'q' in vhost '{vhost}' in use"})
    assert target.http("GET", f"/api/queues/{v}/q")[0] == 200
    connection.close()
    assert target.http("DELETE", f"/api/queues/{v}/q") == (204, None)


# -- bindings -----------------------------------------------------------------------
def test_bindings_with_properties_key_and_location(target, vhost):
    v = q(vhost)
    target.http("PUT", f"/api/exchanges/{v}/x", {"type": "direct"})
    target.http("PUT", f"/api/exchanges/{v}/x2", {"type": "fanout"})
    target.http("PUT", f"/api/queues/{v}/q", {})
    status, _, headers = target.http_raw("POST", f"/api/bindings/{v}/e/x/q/q", {"routing_key": "a b~c"})
    assert (status, headers["location"]) == (201, "q/a%2Bb%257Ec")
    status, _, headers = target.http_raw("POST", f"/api/bindings/{v}/e/x/e/x2", {})
    assert (status, headers["location"]) == (201, "x2/~")
    status, _, headers = target.http_raw("POST", f"/api/bindings/{v}/e/x/q/q",
                                         {"routing_key": "", "arguments": {"k": "v"}})
    assert status == 201
    with_args = urllib.parse.unquote_plus(headers["location"].split("/")[-1])
    assert with_args.startswith("~") and len(with_args) == 7  # "~" + a 32-bit hash, base64url

    rows = target.http("GET", f"/api/bindings/{v}/e/x/q/q")[1]
    assert rows == [
        {"source": "x", "vhost": vhost, "destination": "q", "destination_type": "queue", "routing_key": "",
         "arguments": {"k": "v"}, "properties_key": with_args},
        {"source": "x", "vhost": vhost, "destination": "q", "destination_type": "queue",
         "routing_key": "a b~c", "arguments": {}, "properties_key": "a+b%7Ec"},
    ]
    queue_rows = target.http("GET", f"/api/queues/{v}/q/bindings")[1]
    assert queue_rows[0] == {"source": "", "vhost": vhost, "destination": "q", "destination_type": "queue",
                             "routing_key": "q", "arguments": {}, "properties_key": "q"}
    assert queue_rows[1:] == rows
    assert [r["destination"] for r in target.http("GET", f"/api/exchanges/{v}/x/bindings/source")[1]] == \
        ["q", "q", "x2"]
    assert target.http("GET", f"/api/exchanges/{v}/x2/bindings/destination")[1] == [
        {"source": "x", "vhost": vhost, "destination": "x2", "destination_type": "exchange",
         "routing_key": "", "arguments": {}, "properties_key": "~"}]
    assert len(target.http("GET", f"/api/bindings/{v}")[1]) == 4

    assert target.http("GET", f"/api/bindings/{v}/e/x/q/q/{q('a+b%7Ec')}")[1]["routing_key"] == "a b~c"
    assert target.http("GET", f"/api/bindings/{v}/e/x/q/q/{q(with_args)}")[1]["arguments"] == {"k": "v"}
    assert target.http("GET", f"/api/bindings/{v}/e/x/q/q/~AAAAAA") == (404, NOT_FOUND)
    assert target.http("GET", f"/api/bindings/{v}/e/x/q/q/x~y~z") == (404, NOT_FOUND)
    assert target.http("DELETE", f"/api/bindings/{v}/e/x/q/q/{q(with_args)}") == (204, None)
    assert target.http("DELETE", f"/api/bindings/{v}/e/x/q/q/{q(with_args)}") == (404, NOT_FOUND)
    assert target.http("DELETE", f"/api/bindings/{v}/e/x/e/x2/~") == (204, None)
    assert [r["routing_key"] for r in target.http("GET", f"/api/bindings/{v}/e/x/q/q")[1]] == ["a b~c"]

    # the binding routes, and stops routing once deleted
    assert target.http("POST", f"/api/exchanges/{v}/x/publish", {
        "properties": {}, "routing_key": "a b~c", "payload": "m", "payload_encoding": "string"}) == \
        (200, {"routed": True})
    assert target.http("DELETE", f"/api/bindings/{v}/e/x/q/q/a%2Bb%257Ec") == (204, None)
    assert target.http("POST", f"/api/exchanges/{v}/x/publish", {
        "properties": {}, "routing_key": "a b~c", "payload": "m", "payload_encoding": "string"}) == \
        (200, {"routed": False})


def test_binding_to_missing_ends_is_a_404(target, vhost):
    v = q(vhost)
    target.http("PUT", f"/api/exchanges/{v}/x", {"type": "direct"})
    target.http("PUT", f"/api/queues/{v}/q", {})
    assert target.http("POST", f"/api/bindings/{v}/e/nope/q/q", {}) == \
        (404, {"error": "not_found", "reason": f"no exchange 'nope' in vhost '{vhost}'"})
    assert target.http("POST", f"/api/bindings/{v}/e/x/q/nope", {}) == \
        (404, {"error": "not_found", "reason": f"no queue 'nope' in vhost '{vhost}'"})
    assert target.http("GET", f"/api/bindings/{v}/e/x/q/nope") == (200, [])
    assert target.http("GET", f"/api/exchanges/{v}/nope/bindings/source") == (200, [])


# -- publish and get ----------------------------------------------------------------
def test_publish_and_get_with_ack_modes(target, vhost):
    v = q(vhost)
    target.http("PUT", f"/api/queues/{v}/q", {"durable": True})
    properties = {"delivery_mode": 2, "headers": {"h": 1, "s": "x"}, "content_type": "text/plain",
                  "priority": 3, "timestamp": 1700000000, "message_id": "m1"}
    assert target.http("POST", f"/api/exchanges/{v}/amq.default/publish", {
        "properties": properties, "routing_key": "q", "payload": "hello", "payload_encoding": "string"}) == \
        (200, {"routed": True})
    assert target.http("POST", f"/api/exchanges/{v}/amq.default/publish", {
        "properties": {}, "routing_key": "q", "payload": "AAEC/w==", "payload_encoding": "base64"}) == \
        (200, {"routed": True})
    assert target.http("POST", f"/api/exchanges/{v}/amq.default/publish", {
        "properties": {}, "routing_key": "nowhere", "payload": "x", "payload_encoding": "string"}) == \
        (200, {"routed": False})

    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 3}
    assert target.http("POST", f"/api/queues/{v}/q/get", get) == (200, [
        {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": "q", "message_count": 1,
         "properties": properties, "payload": "hel", "payload_encoding": "string"},
        {"payload_bytes": 4, "redelivered": False, "exchange": "", "routing_key": "q", "message_count": 0,
         "properties": [], "payload": "\x00\x01\x02", "payload_encoding": "string"},
    ])
    status, items = target.http("POST", f"/api/queues/{v}/q/get",
                                {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})
    assert (status, items[0]["payload"], items[0]["redelivered"], items[0]["payload_encoding"]) == \
        (200, "aGVsbG8=", True, "base64")
    status, items = target.http("POST", f"/api/queues/{v}/q/get",
                                {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert (items[0]["payload"], items[0]["payload_encoding"]) == ("AAEC/w==", "base64")  # not UTF-8
    assert target.http("POST", f"/api/queues/{v}/q/get",
                       {"count": 3, "ackmode": "reject_requeue_false", "encoding": "auto"})[0] == 200
    assert target.http("POST", f"/api/queues/{v}/q/get",
                       {"count": 3, "ackmode": "reject_requeue_false", "encoding": "auto"}) == (200, [])


def test_publish_reaches_an_amqp_consumer(target, vhost):
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.queue_declare("q")
    assert target.http("POST", f"/api/exchanges/{q(vhost)}/amq.default/publish", {
        "properties": {"headers": {"n": 7}, "correlation_id": "c"}, "routing_key": "q", "payload": "hi",
        "payload_encoding": "string"}) == (200, {"routed": True})
    _, properties, body = channel.basic_get("q", auto_ack=True)
    assert (body, properties.headers, properties.correlation_id) == (b"hi", {"n": 7}, "c")
    connection.close()


@pytest.mark.parametrize(("body", "error"), [
    ({"properties": {}, "payload": "x", "payload_encoding": "string"},
     {"error": "bad_request", "reason": "[{key_missing,routing_key}]"}),
    ({"properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "nope"},
     {"error": "bad_request", "reason": ["unsupported_encoding", "nope"]}),
    ({"properties": {"delivery_mode": "x"}, "routing_key": "q", "payload": "x", "payload_encoding": "string"},
     {"error": "bad_request", "reason": ["not_int", "delivery_mode"]}),
])
def test_bad_publishes_are_a_400_and_publish_nothing(target, vhost, body, error):
    v = q(vhost)
    target.http("PUT", f"/api/queues/{v}/q", {})
    assert target.http("POST", f"/api/exchanges/{v}/amq.default/publish", body) == (400, error)
    assert target.http("POST", f"/api/queues/{v}/q/get",
                       {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}) == (200, [])


def test_publish_and_get_errors(target, vhost):
    v = q(vhost)
    assert target.http("POST", f"/api/exchanges/{v}/nope/publish", {
        "properties": {}, "routing_key": "q", "payload": "x", "payload_encoding": "string"}) == \
        (400, {"error": "bad_request", "reason": f"404 NOT_FOUND - no exchange 'nope' in vhost '{vhost}'"})
    assert target.http("POST", f"/api/queues/{v}/nope/get",
                       {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}) == \
        (404, {"error": "not_found", "reason": f"NOT_FOUND - no queue 'nope' in vhost '{vhost}'"})
    target.http("PUT", f"/api/queues/{v}/q", {})
    no_count = {"ackmode": "ack_requeue_true", "encoding": "auto"}
    assert target.http("POST", f"/api/queues/{v}/q/get", no_count) == \
        (400, {"error": "bad_request", "reason": "[{key_missing,count}]"})
    assert target.http("POST", f"/api/queues/{v}/q/get",
                       {"count": 1, "ackmode": "ack_requeue_true", "encoding": "zzz"}) == \
        (400, {"error": "bad_request", "reason": "Unsupported encoding. Please use auto or base64."})


# -- connections, channels, consumers ----------------------------------------------
def test_connections_channels_and_consumers(target, vhost):
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("q")
    channel.basic_qos(prefetch_count=7)
    channel.basic_consume("q", lambda *args: None, consumer_tag="ctag")
    local = connection._impl.socket.getsockname() if hasattr(connection._impl, "socket") else None
    v = q(vhost)

    rows = wait_for(lambda: [c for c in target.http("GET", f"/api/vhosts/{v}/connections")[1]
                             if c.get("channels")])  # RabbitMQ lists a connection before its stats
    assert len(rows) == 1
    row = rows[0]
    assert (row["vhost"], row["user"], row["protocol"], row["state"], row["type"]) == \
        (vhost, "guest", "AMQP 0-9-1", "running", "network")
    assert row["client_properties"]["product"] == "Pika Python Client Library"
    assert row["name"] == f"{row['peer_host']}:{row['peer_port']} -> {row['host']}:{row['port']}"
    assert row["port"] == target.amqp_port and row["channels"] == 1
    assert isinstance(row["connected_at"], int) and row["connected_at"] > 1_600_000_000_000
    if local is not None:
        assert row["peer_port"] == local[1]
    name = row["name"]
    assert target.http("GET", f"/api/connections/{q(name)}")[1]["name"] == name
    assert name in [c["name"] for c in target.http("GET", "/api/connections")[1]]

    channels = wait_for(lambda: [c for c in target.http("GET", f"/api/vhosts/{v}/channels")[1]
                                 if c["consumer_count"] == 1])
    assert len(channels) == 1
    ch = channels[0]
    assert {k: ch[k] for k in ("number", "name", "vhost", "user", "confirm", "prefetch_count",
                               "consumer_count",
                               "transactional", "state", "messages_unacknowledged", "messages_unconfirmed",
                               "connection_details")} == {
        "number": 1, "name": f"{name} (1)", "vhost": vhost, "user": "guest", "confirm": True,
        "prefetch_count": 7,
        "consumer_count": 1, "transactional": False, "state": "running", "messages_unacknowledged": 0,
        "messages_unconfirmed": 0,
        "connection_details": {"name": name, "peer_host": row["peer_host"], "peer_port": row["peer_port"]}}
    assert target.http("GET", f"/api/channels/{q(ch['name'])}")[1]["number"] == 1

    consumers = target.http("GET", f"/api/consumers/{v}")[1]
    node = target.http("GET", "/api/overview")[1]["node"]
    assert consumers == [{
        "arguments": {}, "ack_required": True, "active": True, "activity_status": "up",
        "channel_details": {"connection_name": name, "name": f"{name} (1)", "node": node, "number": 1,
                            "peer_host": row["peer_host"], "peer_port": row["peer_port"], "user": "guest"},
        "consumer_tag": "ctag", "exclusive": False, "prefetch_count": 7,
        "queue": {"name": "q", "vhost": vhost}}]
    details = wait_for(lambda: target.http("GET", f"/api/queues/{v}/q")[1]["consumer_details"])
    assert details == consumers
    connection.close()


def test_closing_a_connection_sends_320_with_the_reason(target, vhost):
    connection = target.amqp(vhost=vhost)
    connection.channel()
    rows = wait_for(lambda: target.http("GET", f"/api/vhosts/{q(vhost)}/connections")[1])
    name = rows[0]["name"]
    status, _ = target.http("DELETE", f"/api/connections/{q(name)}", headers={"X-Reason": "maintenance now"})
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
    assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - maintenance now")
    assert wait_for(lambda: target.http("GET", f"/api/connections/{q(name)}")[0] == 404)
    assert target.http("DELETE", f"/api/connections/{q(name)}") == (404, NOT_FOUND)


def test_a_management_user_sees_only_its_own_connections(target, vhost):
    user = unique("u")
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})[0] == 201
    try:
        full = {"configure": ".*", "write": ".*", "read": ".*"}
        assert target.http("PUT", f"/api/permissions/{q(vhost)}/{user}", full)[0] == 201
        guest = target.amqp(vhost=vhost)
        mine = target.amqp(user, "pw", vhost)
        path = f"/api/vhosts/{q(vhost)}/connections"
        rows = wait_for(lambda: len(target.http("GET", path)[1]) == 2 and
                        target.http("GET", path, user=user, password="pw")[1])
        assert [r["user"] for r in rows] == [user]
        guests = [r["name"] for r in target.http("GET", f"/api/vhosts/{q(vhost)}/connections")[1]
                  if r["user"] == "guest"]
        refused = (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
        assert target.http("GET", f"/api/connections/{q(guests[0])}", user=user, password="pw") == refused
        assert target.http("DELETE", f"/api/connections/{q(guests[0])}", user=user, password="pw") == refused
        assert len(target.http("GET", f"/api/vhosts/{q(vhost)}/connections")[1]) == 2
        assert target.http("GET", "/api/nodes", user=user, password="pw") == \
            (401, {"error": "not_authorised", "reason": "Not monitor user"})
        guest.close()
        mine.close()
    finally:
        target.http("DELETE", f"/api/users/{user}")


# -- overview, nodes, health --------------------------------------------------------
def test_overview_and_nodes(target):
    status, overview = target.http("GET", "/api/overview")
    assert status == 200
    for key in ("cluster_name", "node", "rabbitmq_version", "product_name", "product_version",
                "erlang_version", "erlang_full_version", "queue_totals", "object_totals", "listeners",
                "statistics_db_event_queue",
                "management_version", "exchange_types"):
        assert key in overview, key
    major, minor = (int(p) for p in overview["rabbitmq_version"].split(".")[:2])
    assert (major, minor) >= (3, 7)
    assert set(overview["object_totals"]) == {"channels", "connections", "consumers", "exchanges", "queues"}
    if target.name == "leveret":  # RabbitMQ's are empty until its statistics come in
        lengths = {"messages", "messages_ready", "messages_unacknowledged"}
        assert set(overview["queue_totals"]) == lengths | {f"{name}_details" for name in lengths}
        assert {"publish", "publish_details", "ack", "deliver_get"} <= set(overview["message_stats"])
        assert {"queue_declared", "connection_created_details"} <= set(overview["churn_rates"])
    amqp = [listener for listener in overview["listeners"] if listener["protocol"] == "amqp"]
    assert amqp and amqp[0]["port"] == target.amqp_port and amqp[0]["node"] == overview["node"]
    assert {"node", "protocol", "ip_address", "port"} <= set(amqp[0])

    # RabbitMQ's node statistics (uptime ...) come a few seconds after it starts
    status, nodes = wait_for(lambda: (lambda answer: "uptime" in answer[1][0] and answer)(
        target.http("GET", "/api/nodes")))
    assert status == 200 and len(nodes) == 1
    node = nodes[0]
    for key in ("name", "uptime", "run_queue", "processors", "os_pid", "fd_total", "proc_total", "mem_limit",
                "mem_alarm", "disk_free_limit", "disk_free_alarm", "rates_mode", "enabled_plugins",
                "running", "type"):
        assert key in node, key
    assert node["name"] == overview["node"] and node["running"] is True
    assert target.http("GET", f"/api/nodes/{q(node['name'])}")[1]["name"] == node["name"]
    if target.name == "leveret":  # RabbitMQ 3.10 answers 500 here
        assert target.http("GET", "/api/nodes/nobody@nowhere") == (404, NOT_FOUND)


def test_health_checks(target, vhost):
    assert target.http("GET", f"/api/aliveness-test/{q(vhost)}") == (200, {"status": "ok"})
    assert target.http("GET", "/api/aliveness-test/nope-nope") == (404, NOT_FOUND)
    for check in ("alarms", "local-alarms", "virtual-hosts"):
        assert target.http("GET", f"/api/health/checks/{check}") == (200, {"status": "ok"}), check
    assert target.http("GET", f"/api/health/checks/port-listener/{target.amqp_port}") == \
        (200, {"status": "ok", "port": target.amqp_port})
    status, body = target.http("GET", "/api/health/checks/port-listener/1")
    assert (status, body["status"], body["reason"], body["missing"]) == \
        (503, "failed", "No active listener", 1)
    assert target.http("GET", "/api/health/checks/protocol-listener/amqp") == \
        (200, {"status": "ok", "protocol": "amqp"})
    status, body = target.http("GET", "/api/health/checks/protocol-listener/nope")
    assert (status, body["status"], body["missing"]) == (503, "failed", "nope")
    assert target.http("GET", "/api/health/checks/node-is-quorum-critical") == \
        (200, {"status": "ok", "reason": "single node cluster"})
    assert target.http("GET", "/api/health/checks/alarms", password="wrong")[0] == 401


def test_leveret_readiness_and_version_need_no_login(target):
    """Newer RabbitMQ's (3.13+) unauthenticated checks; 3.10 has none of them."""
    if target.name == "rabbitmq":
        pytest.skip("RabbitMQ 3.10 has no is-in-service, ready-to-serve-clients or /api/version")
    for check in ("is-in-service", "ready-to-serve-clients"):
        assert target.http("GET", f"/api/health/checks/{check}", password="wrong") == (200, {"status": "ok"})
    status, version = target.http("GET", "/api/version", password="wrong")
    assert status == 200 and version.startswith("3.")


def test_a_resource_alarm_fails_the_alarm_checks():
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        management = broker.broker.management
        assert management is not None
        target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
        assert target.http("GET", "/api/health/checks/alarms") == (200, {"status": "ok"})
        broker.call(broker.core.set_alarm, True, "memory")
        status, body = target.http("GET", "/api/health/checks/alarms")
        assert (status, body["status"], body["reason"]) == (503, "failed", "resource alarm(s) in effect")
        assert target.http("GET", "/api/health/checks/is-in-service")[0] == 503
        assert target.http("GET", "/api/nodes")[1][0]["mem_alarm"] is True
        broker.call(broker.core.set_alarm, False, "memory")
        assert target.http("GET", "/api/health/checks/alarms") == (200, {"status": "ok"})


# -- permissions and bad input ------------------------------------------------------
def test_changes_need_the_users_amqp_permissions(target, vhost):
    """A management user acts with its own configure/write/read permissions."""
    user = unique("u")
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})[0] == 201
    try:
        v = q(vhost)
        only_mine = {"configure": "^mine", "write": "^mine", "read": "^mine"}
        assert target.http("PUT", f"/api/permissions/{v}/{user}", only_mine)[0] == 201
        target.http("PUT", f"/api/queues/{v}/theirs", {})
        target.http("PUT", f"/api/exchanges/{v}/theirs-x", {"type": "direct"})

        def as_user(method, path, body=None):
            return target.http(method, path, body, user=user, password="pw")

        assert as_user("PUT", f"/api/queues/{v}/mine-q", {}) == (201, None)
        assert as_user("PUT", f"/api/queues/{v}/other", {}) == (401, ACCESS_REFUSED)
        assert as_user("DELETE", f"/api/queues/{v}/theirs") == (401, ACCESS_REFUSED)
        assert as_user("PUT", f"/api/exchanges/{v}/other", {"type": "direct"}) == (401, ACCESS_REFUSED)
        assert as_user("POST", f"/api/bindings/{v}/e/theirs-x/q/mine-q", {}) == (401, ACCESS_REFUSED)
        refused = f"in vhost '{vhost}' refused for user '{user}'"
        assert as_user("POST", f"/api/exchanges/{v}/theirs-x/publish", {
            "properties": {}, "routing_key": "k", "payload": "x", "payload_encoding": "string"}) == \
            (400, {"error": "bad_request",
                   "reason": f"403 ACCESS_REFUSED - access to exchange 'theirs-x' {refused}"})
        assert as_user("POST", f"/api/queues/{v}/theirs/get",
                       {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}) == \
            (401, {"error": "not_authorised",
                   "reason": f"ACCESS_REFUSED - access to queue 'theirs' {refused}"})
        assert as_user("DELETE", f"/api/queues/{v}/theirs/contents") == (401, ACCESS_REFUSED)
        assert target.http("GET", f"/api/queues/{v}/theirs")[0] == 200
        assert target.http("GET", f"/api/queues/{v}/other") == (404, NOT_FOUND)
        no_vhost = (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})
        assert target.http("GET", "/api/queues/%2F", user=user, password="pw") == no_vhost
        assert target.http("PUT", "/api/queues/%2F/mine-too", {}, user=user, password="pw") == no_vhost
    finally:
        target.http("DELETE", f"/api/users/{user}")


def test_a_body_that_is_not_json_changes_nothing(target, vhost):
    v = q(vhost)
    status, _, _ = target.http_raw("PUT", f"/api/queues/{v}/q", None, headers={})
    assert status == 201  # no body: the defaults
    for path in (f"/api/queues/{v}/q2", f"/api/exchanges/{v}/x2"):  # raw: Target sends JSON only
        request = urllib.request.Request(f"http://{target.host}:{target.http_port}{path}", data=b"{not json",
                                         method="PUT", headers={"Content-Type": "application/json",
                                                                "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("accepted")
        except urllib.error.HTTPError as error:
            assert error.code == 400
        assert target.http("GET", path) == (404, NOT_FOUND)


def test_stomp_connections_are_listed_and_closed():
    with BlockingBroker(amqp_port=0, http_port=0, stomp_port=0) as broker:
        management = broker.broker.management
        assert management is not None and broker.broker.stomp_port is not None
        target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
        client = Client(broker.broker.stomp_port)
        client.subscribe("/queue/jobs", ack="client-individual")
        rows = target.http("GET", "/api/connections")[1]
        assert [(r["protocol"], r["port"], r["user"], r["vhost"]) for r in rows] == \
            [("STOMP 1.2", broker.broker.stomp_port, "guest", "/")]
        consumers = target.http("GET", "/api/consumers")[1]
        assert [(c["queue"]["name"], c["ack_required"]) for c in consumers] == [("jobs", True)]
        overview = target.http("GET", "/api/overview")[1]
        assert overview["object_totals"]["connections"] == 1
        assert {"protocol": "stomp", "port": broker.broker.stomp_port} in \
            [{"protocol": x["protocol"], "port": x["port"]} for x in overview["listeners"]]
        assert target.http("DELETE", f"/api/connections/{q(rows[0]['name'])}",
                           headers={"X-Reason": "bye"}) == (204, None)
        error = client.error()
        assert b"bye" in error.body or "bye" in str(error.headers)
        assert wait_for(lambda: target.http("GET", "/api/connections")[1] == [])


# -- policies -----------------------------------------------------------------------
def test_policies_are_set_read_applied_and_cleared(target, vhost):
    v = q(vhost)
    policy = {"pattern": "^ttl", "definition": {"message-ttl": 1000}, "priority": 1, "apply-to": "queues"}
    assert target.http("PUT", f"/api/policies/{v}/p1", policy) == (201, None)
    assert target.http("PUT", f"/api/policies/{v}/p1", policy) == (204, None)
    row = {"vhost": vhost, "name": "p1", "pattern": "^ttl", "apply-to": "queues",
           "definition": {"message-ttl": 1000}, "priority": 1}
    assert target.http("GET", f"/api/policies/{v}/p1") == (200, row)
    assert target.http("GET", f"/api/policies/{v}") == (200, [row])
    assert row in target.http("GET", "/api/policies")[1]
    other = {"pattern": "x", "definition": {"message-ttl": 1}}
    assert target.http("PUT", f"/api/policies/{v}/p2", other) == (201, None)
    assert target.http("GET", f"/api/policies/{v}/p2")[1]["apply-to"] == "all"
    assert target.http("PUT", f"/api/queues/{v}/ttl-q", {})[0] == 201
    # RabbitMQ shows a queue's policy once its statistics come in
    assert wait_for(lambda: target.http("GET", f"/api/queues/{v}/ttl-q")[1].get("policy") == "p1")
    assert target.http("DELETE", f"/api/policies/{v}/p1") == (204, None)
    assert target.http("DELETE", f"/api/policies/{v}/p1") == (404, NOT_FOUND)
    assert target.http("GET", f"/api/policies/{v}/p1") == (404, NOT_FOUND)


@pytest.mark.parametrize(("body", "reason"), [
    ({"definition": {"message-ttl": 1}}, "[{key_missing,pattern}]"),
    ({"pattern": "x", "definition": {}}, "Validation failed\n\nno policy provided\n"),
    ({"pattern": "x", "definition": {"message-ttl": 1}, "apply-to": "nope"},
     "Validation failed\n\napply-to 'nope' unrecognised; should be 'queues', 'exchanges' or 'all'\n"),
    ({"pattern": "x", "definition": {"message-ttl": 1}, "priority": "x"},
     'Validation failed\n\npriority should be a number, actually was &lt;&lt;"x"&gt;&gt;\n'),
    ({"pattern": "(", "definition": {"message-ttl": 1}}, "Validation failed"),
    ({"pattern": "x", "definition": {"message-ttl": "x"}}, "Validation failed"),
    # out of 16..255: a stream matched by it could not be recovered at the next start
    ({"pattern": "x", "definition": {"stream-filter-size-bytes": 5}}, "Validation failed"),
])
def test_bad_policies_are_refused_and_change_nothing(target, vhost, body, reason):
    status, answer = target.http("PUT", f"/api/policies/{q(vhost)}/bad", body)
    assert (status, answer["error"]) == (400, "bad_request")
    assert answer["reason"] == reason or \
        (reason == "Validation failed" and answer["reason"].startswith(reason))
    assert target.http("GET", f"/api/policies/{q(vhost)}/bad") == (404, NOT_FOUND)


def test_only_policymakers_change_policies(target, vhost):
    user = unique("u")
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})[0] == 201
    try:
        full = {"configure": ".*", "write": ".*", "read": ".*"}
        assert target.http("PUT", f"/api/permissions/{q(vhost)}/{user}", full)[0] == 201
        policy = {"pattern": "x", "definition": {"message-ttl": 1}}
        assert target.http("PUT", f"/api/policies/{q(vhost)}/p", policy, user=user, password="pw") == \
            (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
        assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "policymaker"})[0] == 204
        path = f"/api/policies/{q(vhost)}"
        assert target.http("PUT", f"{path}/p", policy, user=user, password="pw") == (201, None)
        assert [p["name"] for p in target.http("GET", path, user=user, password="pw")[1]] == ["p"]
        assert target.http("DELETE", f"/api/policies/{q(vhost)}/p", user=user, password="pw") == (204, None)
    finally:
        target.http("DELETE", f"/api/users/{user}")


def test_lists_of_objects_leveret_lacks_are_empty(target):
    for path in ("/api/operator-policies", "/api/parameters"):
        assert target.http("GET", path) == (200, []), path


def test_vhost_limits(target, vhost):
    v = q(vhost)
    assert target.http("GET", f"/api/vhost-limits/{v}") == (200, [])
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-queues", {"value": 1}) == (204, None)
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-queues", {"value": 1}) == (204, None)
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-connections", {"value": 1}) == (204, None)
    row = {"vhost": vhost, "value": {"max-connections": 1, "max-queues": 1}}
    assert target.http("GET", f"/api/vhost-limits/{v}") == (200, [row])
    assert row in target.http("GET", "/api/vhost-limits")[1]

    assert target.http("PUT", f"/api/queues/{v}/a", {}) == (201, None)
    assert target.http("PUT", f"/api/queues/{v}/b", {}) == (400, {
        "error": "bad_request",
        "reason": f"cannot declare queue 'b': queue limit in vhost '{vhost}' (1) is reached"})
    first = target.amqp(vhost=vhost)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        target.amqp(vhost=vhost)
    assert "connection limit (1) is reached" in str(refused.value)
    first.close()

    assert target.http("PUT", f"/api/vhost-limits/{v}/max-bogus", {"value": 1}) == (400, {
        "error": "bad_request",
        "reason": 'Validation failed\n\nUnrecognised terms [{<<"max-bogus">>,1}] in limits\n'})
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-queues", {"value": "x"}) == (400, {
        "error": "bad_request",
        "reason": 'Validation failed\n\nmax-queues should be a number, actually was <<"x">>\n'})
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-queues", {}) == \
        (400, {"error": "bad_request", "reason": "[{key_missing,value}]"})
    assert target.http("PUT", "/api/vhost-limits/nope-nope/max-queues", {"value": 1}) == \
        (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert target.http("DELETE", f"/api/vhost-limits/{v}/max-queues") == (204, None)
    assert target.http("DELETE", f"/api/vhost-limits/{v}/max-queues") == (204, None)
    assert target.http("PUT", f"/api/queues/{v}/b", {}) == (201, None)
    assert target.http("GET", f"/api/vhost-limits/{v}") == \
        (200, [{"vhost": vhost, "value": {"max-connections": 1}}])


def test_vhost_limits_survive_a_restart(tmp_path):
    data = str(tmp_path / "data")
    for _ in range(2):
        with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
            management = broker.broker.management
            assert management is not None
            target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
            if target.http("GET", "/api/vhost-limits/%2F")[1] == []:
                assert target.http("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 0}) == (204, None)
    for _ in range(2):  # recovered, and kept by the recovery itself
        with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
            management = broker.broker.management
            assert management is not None
            target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
            assert target.http("GET", "/api/vhost-limits/%2F") == \
                (200, [{"vhost": "/", "value": {"max-queues": 0}}])
            assert target.http("PUT", "/api/queues/%2F/q", {})[0] == 400


def test_a_published_persistent_message_survives_a_restart(tmp_path):
    """A persistent message published over HTTP to a durable queue is stored: a restart
    keeps it, with its properties."""
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        management = broker.broker.management
        assert management is not None
        target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
        assert target.http("PUT", "/api/queues/%2F/kept", {"durable": True})[0] == 201
        assert target.http("POST", "/api/exchanges/%2F/amq.default/publish", {
            "properties": {"delivery_mode": 2}, "routing_key": "kept", "payload": "safe",
            "payload_encoding": "string"}) == (200, {"routed": True})
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        management = broker.broker.management
        assert management is not None
        target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
        status, items = target.http("POST", "/api/queues/%2F/kept/get",
                                    {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert (status, [(m["payload"], m["properties"]) for m in items]) == \
            (200, [("safe", {"delivery_mode": 2})])


def test_consumers_waiting_behind_a_single_active_consumer(target, vhost):
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.queue_declare("sac", arguments={"x-single-active-consumer": True})
    channel.basic_consume("sac", lambda *args: None, consumer_tag="first")
    channel.basic_consume("sac", lambda *args: None, consumer_tag="second")
    rows = wait_for(lambda: len(target.http("GET", f"/api/consumers/{q(vhost)}")[1]) == 2 and
                    target.http("GET", f"/api/consumers/{q(vhost)}")[1])
    states = sorted((c["consumer_tag"], c["active"], c["activity_status"]) for c in rows)
    assert states == [("first", True, "single_active"), ("second", False, "waiting")]
    connection.close()


def test_another_connections_exclusive_queue_is_locked(target, vhost):
    v = q(vhost)
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.queue_declare("exq", exclusive=True)
    channel.exchange_declare("x", "direct")
    locked = (f"cannot obtain exclusive access to locked queue 'exq' in vhost '{vhost}'. It could be "
              "originally declared on another connection or the exclusive property value does not match "
              "that of the original declaration.")
    refused = (400, {"error": "bad_request", "reason": locked})
    assert target.http("PUT", f"/api/queues/{v}/exq", {}) == refused
    assert target.http("POST", f"/api/bindings/{v}/e/x/q/exq", {}) == refused
    assert target.http("DELETE", f"/api/queues/{v}/exq/contents") == refused
    assert target.http("DELETE", f"/api/queues/{v}/exq") == refused
    assert target.http("POST", f"/api/queues/{v}/exq/get",
                       {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}) == \
        (400, {"error": "bad_request", "reason": f"405 RESOURCE_LOCKED - {locked}"})
    status, body = target.http("GET", f"/api/queues/{v}/exq")
    assert (status, body["exclusive"]) == (200, True)
    connection.close()


def test_vhost_limits_travel_with_the_definitions(target, vhost):
    v = q(vhost)
    assert target.http("PUT", f"/api/vhost-limits/{v}/max-queues", {"value": 7}) == (204, None)
    document = target.http("GET", "/api/definitions")[1]
    parameter = {"value": {"max-queues": 7}, "vhost": vhost, "component": "vhost-limits", "name": "limits"}
    assert parameter in document["parameters"]
    assert target.http("DELETE", f"/api/vhost-limits/{v}/max-queues") == (204, None)
    assert target.http("GET", f"/api/vhost-limits/{v}") == (200, [])
    assert target.http("POST", "/api/definitions", {"parameters": [parameter]})[0] in (201, 204)
    assert target.http("GET", f"/api/vhost-limits/{v}") == \
        (200, [{"vhost": vhost, "value": {"max-queues": 7}}])


def test_a_connection_closed_without_a_reason_gets_rabbitmqs_default(target, vhost):
    connection = target.amqp(vhost=vhost)
    connection.channel()
    name = wait_for(lambda: target.http("GET", f"/api/vhosts/{q(vhost)}/connections")[1])[0]["name"]
    watcher = unique("u")
    assert target.http("PUT", f"/api/users/{watcher}", {"password": "pw", "tags": "monitoring"})[0] == 201
    try:
        seen = target.http("GET", "/api/connections", user=watcher, password="pw")[1]
        assert name in [c["name"] for c in seen]
        assert target.http("DELETE", f"/api/connections/{q(name)}", user=watcher, password="pw") == \
            (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
    finally:
        target.http("DELETE", f"/api/users/{watcher}")
    assert target.http("DELETE", f"/api/connections/{q(name)}")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
    assert (closed.value.reply_code, closed.value.reply_text) == \
        (320, "CONNECTION_FORCED - Closed via management plugin")


def test_get_with_requeue_returns_or_fails_as_rabbitmq_4_3():
    """RabbitMQ 4.3's management settles ``ack_requeue_true`` with basic.nack (a return:
    never counted) and ``reject_requeue_true`` with basic.reject (a failed delivery):
    with x-delivery-limit 1 only the second reject dead-letters the message."""
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        management = broker.broker.management
        assert management is not None
        target = Target("leveret", broker.broker.host, broker.amqp_port, management.port)
        target.http("PUT", "/api/queues/%2F/limited", {"durable": True, "arguments": {
            "x-delivery-limit": 1, "x-dead-letter-strategy": "individual"}})
        target.http("POST", "/api/exchanges/%2F/amq.default/publish", {
            "properties": {"delivery_mode": 2}, "routing_key": "limited", "payload": "m",
            "payload_encoding": "string"})
        get = {"count": 1, "encoding": "auto"}
        for _ in range(3):
            assert len(target.http("POST", "/api/queues/%2F/limited/get",
                                   {**get, "ackmode": "ack_requeue_true"})[1]) == 1
        for left in (1, 0):
            assert len(target.http("POST", "/api/queues/%2F/limited/get",
                                   {**get, "ackmode": "reject_requeue_true"})[1]) == 1
            wait_for(lambda left=left: target.http("GET", "/api/queues/%2F/limited")[1]["messages"] == left)
        # dead-lettered to its DLQ (only a dead message goes there)
        dead = target.http("POST", "/api/queues/%2F/DLQ.limited/get",
                           {**get, "ackmode": "ack_requeue_false"})[1]
        assert dead[0]["payload"] == "m", dead
