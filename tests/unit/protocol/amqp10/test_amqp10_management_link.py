"""The management node's link pair on the sans-I/O AMQP 1.0 adapter (leveret.protocol.
amqp10.management_link): attaching both halves, requests answered on the paired link
with RabbitMQ 4's response properties, credit both ways, and the refusals."""

from __future__ import annotations

from typing import Any

from amqp10_sans_io import Client

from leveret.core.auth import Permission, User
from leveret.core.broker import BrokerCore
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.frames import AMQP_HEADER
from leveret.protocol.amqp10.management_link import REQUEST_CREDIT
from leveret.protocol.amqp10.types import Symbol, ULong, decode_all, encode

PAIRED = {Symbol("paired"): True}


def attach(client: Client, name: str, handle: int, client_sends: bool, properties: Any = PAIRED) -> list:
    if client_sends:
        frame = perf.Attach(
            name,
            handle,
            perf.ROLE_SENDER,
            perf.SND_SETTLED,
            perf.RCV_FIRST,
            perf.Source("/management"),
            perf.Target("/management"),
            initial_delivery_count=0,
            properties=properties,
        )
    else:
        frame = perf.Attach(
            name,
            handle,
            perf.ROLE_RECEIVER,
            perf.SND_SETTLED,
            perf.RCV_FIRST,
            perf.Source("/management"),
            perf.Target("/management"),
            properties=properties,
        )
    client.send(frame)
    return client.bodies()


def request(
    method: str, path: str, body: Any = None, message_id: Any = "m-1", reply_to: str = "$me"
) -> bytes:
    sections = [
        perf.Properties(message_id=message_id, to=path, subject=method, reply_to=reply_to),
        perf.AmqpValue(body),
    ]
    return b"".join(encode(perf.to_described(s)) for s in sections)


def sections(transfer_payload: bytes) -> list:
    return [perf.from_described(value) for value in decode_all(transfer_payload)]


def pair(client: Client, credit: int = 10) -> None:
    client.open()
    client.begin()
    sent = attach(client, "pair", 0, True)
    assert isinstance(sent[0], perf.Attach) and sent[0].role == perf.ROLE_RECEIVER
    assert sent[0].properties == PAIRED
    assert isinstance(sent[1], perf.Flow) and sent[1].link_credit == REQUEST_CREDIT
    (answer,) = attach(client, "pair", 1, False)
    assert answer.role == perf.ROLE_SENDER and answer.snd_settle_mode == perf.SND_SETTLED
    if credit:
        client.flow(1, credit)
        assert client.bodies() == []


def responses(client: Client) -> list[list]:
    return [sections(item.payload) for item in client.received() if isinstance(item.body, perf.Transfer)]


def test_a_request_is_answered_on_the_paired_link(client: Client, core: BrokerCore) -> None:
    pair(client)
    client.transfer(0, 0, request("PUT", "/queues/q1", {"durable": True}), settled=True)
    items = client.received()
    transfers = [item for item in items if isinstance(item.body, perf.Transfer)]
    assert len(transfers) == 1
    transfer = transfers[0].body
    assert transfer.handle == 1 and transfer.settled
    props, app, value = sections(transfers[0].payload)
    assert (props.subject, props.correlation_id, props.to) == ("201", "m-1", None)
    assert app.value == {"http:response": "1.1"}
    assert value.value["name"] == "q1" and value.value["durable"] is True
    assert "q1" in core.vhosts["/"].queues


def test_the_message_id_of_any_type_is_the_correlation_id(client: Client) -> None:
    pair(client)
    for delivery, message_id in enumerate([b"\x01\x02", ULong(7), "text"]):
        client.transfer(0, delivery, request("GET", "/queues/none", message_id=message_id), settled=True)
        ((props, _, _),) = responses(client)
        assert (props.subject, props.correlation_id) == ("404", message_id)


def test_an_unsettled_request_is_accepted_and_settled(client: Client) -> None:
    pair(client)
    client.transfer(0, 0, request("DELETE", "/queues/none"))
    bodies = client.bodies()
    dispositions = [b for b in bodies if isinstance(b, perf.Disposition)]
    assert (
        len(dispositions) == 1
        and dispositions[0].settled
        and isinstance(dispositions[0].state, perf.Accepted)
    )
    assert any(isinstance(b, perf.Transfer) for b in bodies)


def test_responses_wait_for_credit_and_requests_stop_being_credited(client: Client) -> None:
    """A client that gives no credit for responses can make the broker hold at most
    twice REQUEST_CREDIT of them: the request credit is renewed once (at half used,
    with fewer than REQUEST_CREDIT waiting), then no more."""
    pair(client, credit=0)
    held = REQUEST_CREDIT + REQUEST_CREDIT // 2
    for delivery in range(held):
        client.transfer(0, delivery, request("GET", f"/queues/q{delivery}"), settled=True)
    bodies = client.bodies()
    assert not any(isinstance(b, perf.Transfer) for b in bodies)
    assert len([b for b in bodies if isinstance(b, perf.Flow) and b.handle == 0]) == 1
    client.transfer(0, held, request("GET", "/queues/late"), settled=True)
    (detach,) = client.bodies()
    assert isinstance(detach, perf.Detach) and detach.error.condition == "amqp:link:transfer-limit-exceeded"
    client.flow(1, 3)
    assert [s[0].subject for s in responses(client)] == ["404"] * 3
    client.flow(1, 100, delivery_count=3)
    assert len(responses(client)) == held - 3


def test_credit_is_renewed_when_half_is_used(client: Client) -> None:
    pair(client)
    for delivery in range(REQUEST_CREDIT // 2):
        client.transfer(0, delivery, request("GET", "/queues/x"), settled=True)
    bodies = client.bodies()
    flows = [b for b in bodies if isinstance(b, perf.Flow) and b.handle == 0]
    assert len(flows) == 1 and flows[0].link_credit == REQUEST_CREDIT
    assert flows[0].delivery_count == REQUEST_CREDIT // 2


def test_an_attach_without_paired_is_refused(client: Client) -> None:
    client.open()
    client.begin()
    refused = attach(client, "pair", 0, True, properties=None)
    assert isinstance(refused[-1], perf.Detach)
    assert refused[-1].error.condition == "amqp:invalid-field"
    assert "paired" in refused[-1].error.description
    refused = attach(client, "pair2", 2, False, properties={Symbol("paired"): False})
    assert refused[-1].error.condition == "amqp:invalid-field"


def test_a_second_half_of_the_same_role_is_refused(client: Client) -> None:
    pair(client)
    refused = attach(client, "pair", 5, True)
    assert isinstance(refused[-1], perf.Detach)
    assert refused[-1].error.condition == "amqp:precondition-failed"


def test_a_request_on_a_half_open_pair_detaches_the_link(client: Client) -> None:
    client.open()
    client.begin()
    attach(client, "alone", 0, True)
    client.transfer(0, 0, request("GET", "/queues/q"), settled=True)
    (detach,) = client.bodies()
    assert isinstance(detach, perf.Detach) and detach.error.condition == "amqp:precondition-failed"


def test_a_message_that_is_no_request_detaches_the_link(client: Client) -> None:
    pair(client)
    client.transfer(0, 0, request("GET", "/queues/q", reply_to="elsewhere"), settled=True)
    (detach,) = client.bodies()
    assert detach.handle == 0 and detach.error.condition == "amqp:invalid-field"


def test_a_refused_permission_ends_the_session(client: Client, core: BrokerCore) -> None:
    core.add_user(User.with_password("bob", "pw"))
    core.set_permission("bob", "/", Permission(configure="^bob", write=".*", read=".*"))
    client.login(response=b"\x00bob\x00pw")
    client.write(AMQP_HEADER)
    client.send(perf.Open("client"))
    client.received()
    client.begin()
    attach(client, "pair", 0, True)
    attach(client, "pair", 1, False)
    client.flow(1, 10)
    client.transfer(0, 0, request("PUT", "/queues/bob-q", {}), settled=True)
    assert responses(client)[0][0].subject == "201"
    client.transfer(0, 1, request("PUT", "/queues/alice-q", {}), settled=True)
    detach_responses, detach_requests, end = client.bodies()
    text = "access to queue 'alice-q' in vhost '/' refused for user 'bob'"
    # both halves are detached first (a blocked client sees it), then the session ends
    assert (detach_responses.handle, detach_requests.handle) == (1, 0)
    for frame in (detach_responses, detach_requests, end):
        assert frame.error.condition == "amqp:unauthorized-access" and frame.error.description == text
    assert detach_responses.closed and isinstance(end, perf.End)
    assert "alice-q" not in core.vhosts["/"].queues


def test_the_pair_goes_with_its_halves(client: Client) -> None:
    pair(client)
    client.send(perf.Detach(1, True))
    assert isinstance(client.bodies()[0], perf.Detach)
    client.transfer(0, 0, request("GET", "/queues/q"), settled=True)
    (detach,) = client.bodies()
    assert detach.error.condition == "amqp:precondition-failed"
    # a new response half may pair again under the same name
    (answer,) = attach(client, "pair", 3, False)
    assert isinstance(answer, perf.Attach)
