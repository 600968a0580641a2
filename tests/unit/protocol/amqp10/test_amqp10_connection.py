"""The AMQP 1.0 adapter's state machine, sans-I/O: SASL, open, sessions, links, credit,
outcomes and the errors each level closes with."""

from __future__ import annotations

from amqp10_sans_io import Client, message_payload

from leveret.core.broker import BrokerCore
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.connection import IDLE_TIME_OUT
from leveret.protocol.amqp10.frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    SASL_HEADER,
    TYPE_SASL,
    ProtocolHeader,
    encode_frame,
)
from leveret.protocol.amqp10.links import LINK_CREDIT
from leveret.protocol.amqp10.session import INCOMING_WINDOW


def _declare(core: BrokerCore, name: str, **arguments) -> None:
    core.vhosts.get("/").declare_queue(name, None, False, True, False, False, arguments or None)


def _ready(client: Client) -> None:
    client.open()
    client.begin()


def test_sasl_header_answered_with_mechanisms(client: Client) -> None:
    client.write(SASL_HEADER)
    items = client.received()
    assert items[0] == ProtocolHeader(3)
    mechanisms = items[1].body
    assert isinstance(mechanisms, perf.SaslMechanisms)
    assert set(mechanisms.sasl_server_mechanisms) == {"PLAIN", "ANONYMOUS"}


def test_amqp_header_without_sasl_is_refused_with_the_sasl_header(client: Client) -> None:
    client.write(AMQP_HEADER)
    assert client.received() == [ProtocolHeader(3)]
    assert client.closed


def test_other_version_is_refused(client: Client) -> None:
    client.write(b"AMQP\x03\x02\x00\x00")
    assert client.received() == [ProtocolHeader(3)]
    assert client.closed


def test_plain_login_ok_then_open(client: Client) -> None:
    opened = client.open()
    assert opened.max_frame_size == 128 * 1024
    assert opened.idle_time_out == IDLE_TIME_OUT
    assert "ANONYMOUS-RELAY" in (opened.offered_capabilities or ())
    assert client.connection.user is not None and client.connection.user.name == "guest"


def test_wrong_password_gets_auth_outcome_and_close(client: Client, loop) -> None:
    items = client.login(response=b"\x00guest\x00wrong")
    loop.advance(5)  # the login throttle's wait, if any
    items += client.received()
    outcomes = [item.body for item in items if getattr(item, "type", None) == TYPE_SASL]
    assert isinstance(outcomes[-1], perf.SaslOutcome) and outcomes[-1].code == perf.SASL_AUTH
    assert client.closed


def test_anonymous_is_guest(client: Client) -> None:
    items = client.login("ANONYMOUS", b"")
    assert isinstance(items[-1].body, perf.SaslOutcome) and items[-1].body.code == perf.SASL_OK


def test_external_without_certificate_is_refused(client: Client, loop) -> None:
    items = client.login("EXTERNAL", b"")
    loop.advance(5)
    bodies = [getattr(item, "body", None) for item in items + client.received()]
    assert isinstance(bodies[-1], perf.SaslOutcome) and bodies[-1].code == perf.SASL_AUTH


def test_unknown_vhost_closes_with_not_found(client: Client) -> None:
    client.login()
    client.write(AMQP_HEADER)
    client.send(perf.Open("c", hostname="vhost:nope"))
    bodies = [item.body for item in client.received()[1:]]
    assert isinstance(bodies[0], perf.Open)
    assert isinstance(bodies[1], perf.Close) and bodies[1].error.condition == "amqp:not-found"
    assert client.closed


def test_frame_before_open_over_512_bytes_is_a_framing_error(client: Client) -> None:
    client.login()
    client.write(AMQP_HEADER)
    client.received()
    client.send(perf.Open("c" * 600))
    bodies = [item.body for item in client.received()]
    assert isinstance(bodies[-1], perf.Close)
    assert bodies[-1].error.condition == "amqp:connection:framing-error"
    assert client.closed


def test_garbage_performative_is_a_decode_error(client: Client) -> None:
    client.open()
    client.write(b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x10\xff")
    bodies = client.bodies()
    assert isinstance(bodies[-1], perf.Close) and bodies[-1].error.condition == "amqp:decode-error"


def test_begin_is_answered_with_the_windows(client: Client) -> None:
    client.open()
    begin = client.begin(channel=5)
    assert begin.remote_channel == 5
    assert begin.incoming_window == INCOMING_WINDOW


def test_frame_on_a_channel_without_session_closes(client: Client) -> None:
    client.open()
    client.send(perf.Flow(0, 10, 0, 10), channel=3)
    bodies = client.bodies()
    assert isinstance(bodies[-1], perf.Close)


def test_sender_to_queue_gets_credit_and_accepted(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    attach, flow = client.attach_sender("/queues/q")
    assert isinstance(attach, perf.Attach) and attach.role == perf.ROLE_RECEIVER
    assert flow.link_credit == LINK_CREDIT
    # two transfers in one read: one disposition settles both
    client.write(
        encode_frame(perf.Transfer(0, 0, b"0", 0, False), 0, message_payload(b"one"))
        + encode_frame(perf.Transfer(0, 1, b"1", 0, False), 0, message_payload(b"two"))
    )
    (disposition,) = client.bodies()
    assert (disposition.first, disposition.last, disposition.settled) == (0, 1, True)
    assert isinstance(disposition.state, perf.Accepted)
    assert core.vhosts.get("/").queues["q"].message_count == 2


def test_presettled_transfer_gets_no_disposition(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    client.transfer(0, 0, message_payload(), settled=True)
    assert client.bodies() == []
    assert core.vhosts.get("/").queues["q"].message_count == 1


def test_sender_to_missing_queue_is_refused_with_not_found(client: Client) -> None:
    _ready(client)
    attach, detach = client.attach_sender("/queues/missing")
    assert attach.target is None
    assert isinstance(detach, perf.Detach) and detach.closed
    assert detach.error.condition == "amqp:not-found"
    client.send(perf.Detach(0, True))  # the client's answer is taken quietly
    assert client.bodies() == []
    attach, flow = client.attach_sender("/exchanges/amq.direct/k")  # the handle is free again
    assert flow.link_credit == LINK_CREDIT


def test_unroutable_is_released(client: Client) -> None:
    _ready(client)
    client.attach_sender("/exchanges/amq.direct/nowhere")
    client.transfer(0, 0, message_payload())
    (disposition,) = client.bodies()
    assert isinstance(disposition.state, perf.Released)


def test_null_target_routes_by_to_and_rejects_a_bad_one(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender(None)
    client.transfer(0, 0, message_payload(to="/queues/q"))
    client.transfer(0, 1, message_payload(to="/exchanges/missing/k"))
    client.transfer(0, 2, message_payload())
    states = {d.first: d.state for d in client.bodies()}
    assert isinstance(states[0], perf.Accepted)
    assert isinstance(states[1], perf.Rejected) and states[1].error.condition == "amqp:not-found"
    assert isinstance(states[2], perf.Rejected) and states[2].error.condition == "amqp:invalid-field"
    assert core.vhosts.get("/").queues["q"].message_count == 1


def test_transfer_without_credit_detaches_the_link(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    core.set_alarm(True)  # no credit is renewed during an alarm
    for delivery_id in range(LINK_CREDIT + 1):
        client.transfer(0, delivery_id, message_payload(), settled=True)
    bodies = [b for b in client.bodies() if isinstance(b, perf.Detach)]
    assert bodies and bodies[0].error.condition == "amqp:link:transfer-limit-exceeded"
    assert core.vhosts.get("/").queues["q"].message_count == LINK_CREDIT


def test_multi_frame_transfer_is_one_message(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q")
    payload = message_payload(b"x" * 300_000)
    client.transfer(0, 0, payload[:100_000], more=True)
    client.transfer(0, 0, payload[100_000:200_000], more=True)
    client.transfer(0, 0, payload[200_000:])
    (disposition,) = client.bodies()
    assert isinstance(disposition.state, perf.Accepted)
    (entry,) = core.vhosts.get("/").queues["q"].browse(10)
    assert entry.message.body == b"x" * 300_000


def test_aborted_transfer_is_dropped(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q")
    client.transfer(0, 0, b"partial", more=True)
    client.send(perf.Transfer(0, 0, None, None, None, False, aborted=True))
    assert core.vhosts.get("/").queues["q"].message_count == 0


def test_receiver_gets_as_much_as_its_credit(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    for delivery_id in range(5):
        client.transfer(0, delivery_id, message_payload(b"m%d" % delivery_id), settled=True)
    (attach,) = client.attach_receiver("/queues/q")
    assert attach.role == perf.ROLE_SENDER and attach.initial_delivery_count == 0
    client.flow(1, 2)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 2
    client.flow(1, 2, delivery_count=2)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert [t.delivery_id for t in transfers] == [2, 3]


def test_drain_uses_up_the_credit(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_receiver("/queues/q")
    client.flow(1, 10, drain=True)
    (flow,) = client.bodies()
    assert (flow.handle, flow.delivery_count, flow.link_credit, flow.drain) == (1, 10, 0, True)


def test_outcomes(client: Client, core: BrokerCore) -> None:
    _declare(core, "dead")
    _declare(core, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    for delivery_id in range(4):
        client.transfer(0, delivery_id, message_payload(b"m%d" % delivery_id), settled=True)
    client.attach_receiver("/queues/q")
    client.flow(1, 4)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 4
    queue = core.vhosts.get("/").queues["q"]
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 0, None, True, perf.Accepted()))
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 1, None, True, perf.Rejected()))
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 2, None, True, perf.Released()))
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 3, None, True, perf.Modified(True, False)))
    assert core.vhosts.get("/").queues["dead"].message_count == 1
    waiting = {entry.message.body: entry for entry in queue.browse(10)}
    assert set(waiting) == {b"m2", b"m3"}
    # released: acquired once, not a failed delivery; modified with delivery-failed: one
    assert (waiting[b"m2"].delivery_count, waiting[b"m2"].failed_count) == (1, 0)
    assert (waiting[b"m3"].delivery_count, waiting[b"m3"].failed_count) == (1, 1)


def test_detach_returns_unsettled_deliveries(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    client.transfer(0, 0, message_payload(), settled=True)
    client.attach_receiver("/queues/q")
    client.flow(1, 1)
    client.bodies()
    queue = core.vhosts.get("/").queues["q"]
    assert queue.message_count == 0
    client.send(perf.Detach(1, True))
    (detach,) = client.bodies()
    assert isinstance(detach, perf.Detach) and detach.handle == 1
    assert queue.message_count == 1


def test_unattached_handle_ends_the_session(client: Client) -> None:
    _ready(client)
    client.transfer(7, 0, message_payload())
    (end,) = client.bodies()
    assert isinstance(end, perf.End) and end.error.condition == "amqp:session:unattached-handle"
    client.send(perf.End())
    assert client.connection.sessions == {}
    assert not client.closed


def test_queue_deleted_detaches_receiver_with_resource_deleted(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_receiver("/queues/q")
    core.vhosts.get("/").delete_queue("q")
    (detach,) = client.bodies()
    assert detach.error.condition == "amqp:resource-deleted"


def test_heartbeats_and_idle_timeout(client: Client, loop) -> None:
    client.open(idle_time_out=4000)
    client.received()
    loop.advance(2.1)
    client.flush()
    assert bytes(client.transport.output).endswith(EMPTY_FRAME)
    loop.advance(2 * IDLE_TIME_OUT / 1000)
    bodies = client.bodies()
    assert isinstance(bodies[-1], perf.Close)
    assert bodies[-1].error.condition == "amqp:resource-limit-exceeded"


def test_close_is_answered(client: Client) -> None:
    client.open()
    client.send(perf.Close())
    (close,) = client.bodies()
    assert isinstance(close, perf.Close) and close.error is None
    assert client.closed


def test_delivery_delay_and_time_annotations_hold_the_message(client: Client, core: BrokerCore, loop) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    now_ms = int(core.clock.time() * 1000)
    client.transfer(0, 0, message_payload(b"later", annotations={"x-opt-delivery-delay": 5000}), settled=True)
    client.transfer(
        0, 1, message_payload(b"at", annotations={"x-opt-delivery-time": now_ms + 8000}), settled=True
    )
    client.transfer(0, 2, message_payload(b"now"), settled=True)
    queue = core.vhosts.get("/").queues["q"]
    assert [e.message.body for e in queue.browse(10)] == [b"now"]
    loop.advance(5.5)
    assert [e.message.body for e in queue.browse(10)] == [b"now", b"later"]
    loop.advance(3)
    assert [e.message.body for e in queue.browse(10)] == [b"now", b"later", b"at"]


def test_direct_reply_to_address(client: Client, core: BrokerCore) -> None:
    _ready(client)
    source = perf.Source(None, dynamic=True, capabilities=("rabbitmq:volatile-queue",))
    client.send(
        perf.Attach("replies", 1, perf.ROLE_RECEIVER, perf.SND_SETTLED, perf.RCV_FIRST, source, perf.Target())
    )
    (attach,) = client.bodies()
    address = attach.source.address
    assert address.startswith("/queues/amq.rabbitmq.reply-to.")
    client.flow(1, 1)
    client.attach_sender(address, handle=2, settled=True)
    client.transfer(2, 0, message_payload(b"reply 1"), settled=True)
    client.transfer(2, 1, message_payload(b"reply 2"), settled=True)  # no credit left: dropped
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert [(t.handle, t.settled) for t in transfers] == [(1, True)]
    client.send(perf.Detach(1, True))
    assert core.vhosts.get("/").reply_consumers == {}


def test_modified_annotations_go_into_the_message(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    client.transfer(0, 0, message_payload(b"m"), settled=True)
    client.attach_receiver("/queues/q")
    client.flow(1, 1)
    client.bodies()
    modified = perf.Modified(False, False, {"x-opt-reason": "retry later"})
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 0, None, True, modified))
    client.flow(1, 1, delivery_count=1)
    (frame,) = [item for item in client.received() if isinstance(item.body, perf.Transfer)]
    assert b"x-opt-reason" in frame.payload and b"retry later" in frame.payload
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 1, None, True, perf.Modified(False, False, {"bad": 1})))
    (end,) = client.bodies()
    assert isinstance(end, perf.End) and end.error.condition == "amqp:invalid-field"
    assert core.vhosts.get("/").queues["q"].message_count == 1  # the delivery went back


def test_unfinished_deliveries_are_bounded_per_connection(
    client: Client, core: BrokerCore, monkeypatch
) -> None:
    from leveret.protocol.amqp10 import links

    monkeypatch.setattr(links, "MAX_PARTIAL_BYTES", 10_000)
    _declare(core, "q")
    _ready(client)
    for handle in range(3):
        client.attach_sender("/queues/q", handle=handle)
        client.transfer(handle, 0, b"x" * 4000, more=True)
    detaches = [b for b in client.bodies() if isinstance(b, perf.Detach)]
    assert [(d.handle, d.error.condition) for d in detaches] == [(2, "amqp:resource-limit-exceeded")]
    assert client.connection.partial_bytes == 8000
    client.transfer(0, 0, b"y", more=False)  # finishing one frees its bytes (the message is bad: detached)
    client.send(perf.Transfer(1, None, None, None, None, False, aborted=True))
    assert client.connection.partial_bytes == 0
