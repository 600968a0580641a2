"""Defects found on the second reading of the AMQP 1.0 adapter, sans-I/O: serial-number
wrap of delivery ids and transfer ids, and the other edge cases each test names."""

from __future__ import annotations

from amqp10_sans_io import Client, message_payload

from leveret.core.broker import BrokerCore
from leveret.protocol.amqp10 import performatives as perf


def _declare(core: BrokerCore, name: str, **arguments) -> None:
    core.vhosts.get("/").declare_queue(name, None, False, True, False, False, arguments or None)


def _ready(client: Client) -> None:
    client.open()
    client.begin()


def _fill(client: Client, count: int) -> None:
    client.attach_sender("/queues/q", settled=True)
    for delivery_id in range(count):
        client.transfer(0, delivery_id, message_payload(b"m%d" % delivery_id), settled=True)


def test_disposition_range_across_the_delivery_id_wrap_settles(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    _fill(client, 3)
    session = client.connection.sessions[0]
    session.next_delivery_id = 2**32 - 2
    client.attach_receiver("/queues/q")
    client.flow(1, 3)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert [t.delivery_id for t in transfers] == [2**32 - 2, 2**32 - 1, 0]
    # RFC 1982 serial numbers (§2.8.11): first 2**32-2, last 0 is the three of them
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 2**32 - 2, 0, True, perf.Accepted()))
    queue = core.vhosts.get("/").queues["q"]
    assert session.unsettled == {}
    assert queue.message_count == 0 and queue.unacked_count == 0


def test_transfer_ids_wrap_at_2_to_the_32(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    _fill(client, 2)
    session = client.connection.sessions[0]
    session.next_outgoing_id = 2**32 - 1
    client.attach_receiver("/queues/q", settled=True)
    client.flow(1, 2)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 2
    client.send(perf.Flow(0, 1000, 0, 1000, echo=True))
    (flow,) = client.bodies()
    assert flow.next_outgoing_id == 1
    assert not client.closed


def test_aborted_deliveries_do_not_starve_the_sender_of_credit(client: Client, core: BrokerCore) -> None:
    _declare(core, "q")
    _ready(client)
    bodies = client.attach_sender("/queues/q")
    (flow,) = [b for b in bodies if isinstance(b, perf.Flow)]
    granted = flow.link_credit
    for delivery_id in range(granted):  # every delivery begun, then aborted (§2.6.14)
        client.transfer(0, delivery_id, b"partial", more=True)
        client.send(perf.Transfer(0, None, None, None, None, False, aborted=True))
    flows = [b for b in client.bodies() if isinstance(b, perf.Flow) and b.handle == 0]
    assert flows, "the credit the aborted deliveries used is never renewed"
    assert flows[-1].delivery_count + flows[-1].link_credit > granted
    assert not client.closed


def test_huge_credit_with_a_tiny_session_window_sends_only_the_window(
    client: Client, core: BrokerCore
) -> None:
    _declare(core, "q")
    client.open()
    client.send(perf.Begin(None, 0, 1, 1000))  # incoming-window: one transfer frame
    client.bodies()
    _fill(client, 5)
    client.attach_receiver("/queues/q", settled=True)
    client.bodies()
    client.send(perf.Flow(0, 1, 0, 1000, 1, 0, 2**32 - 1))
    assert len([b for b in client.bodies() if isinstance(b, perf.Transfer)]) == 1
    client.send(perf.Flow(1, 2, 0, 1000))  # the window reopened: two more frames
    assert len([b for b in client.bodies() if isinstance(b, perf.Transfer)]) == 2
    assert core.vhosts.get("/").queues["q"].message_count == 2


def test_far_delivery_time_holds_the_message_without_failing(client: Client, core: BrokerCore, loop) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q")
    far = {"x-opt-delivery-time": 2**63 - 1}  # the largest timestamp a long carries
    client.transfer(0, 0, message_payload(b"far", annotations=far))
    client.transfer(0, 1, message_payload(b"big delay", annotations={"x-opt-delivery-delay": 2**63 - 1}))
    client.transfer(0, 2, message_payload(b"now"))
    bodies = client.bodies()
    assert not client.closed
    assert all(isinstance(b, perf.Disposition) and isinstance(b.state, perf.Accepted) for b in bodies), bodies
    assert [e.message.body for e in core.vhosts.get("/").queues["q"].browse(10)] == [b"now"]


def test_window_reopened_by_one_links_flow_resumes_every_link(client: Client, core: BrokerCore) -> None:
    for name in ("qa", "qb"):
        _declare(core, name)
    client.open()
    client.send(perf.Begin(None, 0, 1, 1000))  # incoming-window: one transfer frame
    client.bodies()
    client.attach_sender("/queues/qa", handle=0, settled=True)
    client.attach_sender("/queues/qb", handle=1, settled=True)
    for n in range(2):
        client.transfer(0, 2 * n, message_payload(b"a%d" % n), settled=True)
        client.transfer(1, 2 * n + 1, message_payload(b"b%d" % n), settled=True)
    client.attach_receiver("/queues/qa", handle=2, settled=True)
    client.attach_receiver("/queues/qb", handle=3, settled=True)
    client.bodies()
    client.send(perf.Flow(0, 1, 0, 1000, 2, 0, 10))
    client.send(perf.Flow(0, 1, 0, 1000, 3, 0, 10))
    sent = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert [t.handle for t in sent] == [2]  # the window allows one frame
    # the window reopens (room for 10 frames) in a flow that carries link 2's state
    client.send(perf.Flow(1, 10, 0, 1000, 2, 1, 9))
    handles = sorted(b.handle for b in client.bodies() if isinstance(b, perf.Transfer))
    assert handles == [2, 3, 3], handles


def test_priority_beyond_a_ubyte_from_another_protocol_is_delivered(client: Client, core: BrokerCore) -> None:
    """The HTTP API's publish takes any integer priority; an AMQP 1.0 header holds a
    ubyte: the delivery carries it clamped (0-255) rather than failing."""
    from leveret.core.message import Message, Properties
    from leveret.core.publish import Publisher
    from leveret.core.session import Session

    _declare(core, "q")
    _ready(client)
    vhost = core.vhosts.get("/")
    session = client.connection.session
    assert isinstance(session, Session)
    publisher = Publisher(session, client.connection.sessions[0])
    for priority in (1000, -1):
        message = Message.build("", "q", b"p%d" % priority, Properties(priority=priority))
        publisher.publish(vhost.get_exchange(""), message)
    client.attach_receiver("/queues/q", settled=True)
    client.flow(1, 2)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 2
    assert not client.closed


def test_user_id_with_a_lone_surrogate_from_another_protocol_is_delivered(
    client: Client, core: BrokerCore
) -> None:
    """The HTTP API's publish takes any JSON string as ``user_id`` or ``reply_to``
    (``"\\udc80"`` too);
    no UTF-8 holds a lone surrogate: the delivery's binary user-id has it replaced
    (``?``) rather than failing."""
    from leveret.core.message import Message, Properties
    from leveret.core.publish import Publisher

    _declare(core, "q")
    _ready(client)
    vhost = core.vhosts.get("/")
    session = client.connection.session
    assert session is not None
    publisher = Publisher(session, client.connection.sessions[0])
    for properties in (Properties(user_id="\udc80", app_id="app"), Properties(reply_to="r\udc80")):
        publisher.publish(vhost.get_exchange(""), Message.build("", "q", b"odd", properties))
    client.attach_receiver("/queues/q", settled=True)
    client.flow(1, 2)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 2
    assert not client.closed


def test_nothing_is_sent_on_a_session_after_its_end(client: Client, core: BrokerCore) -> None:
    """Two receivers on one queue: the first's unsettled delivery goes back to the queue
    when the session ends; it must not go out to the second (ending too) after the end."""
    _declare(core, "q")
    _ready(client)
    _fill(client, 1)
    client.attach_receiver("/queues/q", handle=1)
    client.attach_receiver("/queues/q", handle=2)
    client.bodies()
    client.flow(1, 1)
    assert [b.handle for b in client.bodies() if isinstance(b, perf.Transfer)] == [1]
    client.flow(2, 10)
    client.bodies()
    client.send(perf.End())
    bodies = client.bodies()
    assert isinstance(bodies[-1], perf.End), bodies
    assert core.vhosts.get("/").queues["q"].message_count == 1


def test_partial_deliveries_during_an_alarm_stop_the_reading(client: Client, core: BrokerCore) -> None:
    """A delivery in several transfers is held in memory until its last frame: during a
    resource alarm its frames must block the connection as a whole message does, or a
    client never finishing its deliveries (one per link) grows the broker's memory."""
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q")
    core.set_alarm(True, "memory")
    client.transfer(0, 0, b"x" * 1000, more=True)
    assert not client.transport.reading and client.connection.blocked
    core.set_alarm(False, "memory")
    assert client.transport.reading
    client.transfer(0, 0, message_payload(b"y"))
    assert not client.closed


def test_management_argument_with_a_far_timestamp_is_a_400(client: Client) -> None:
    """A queue argument holding a timestamp no datetime holds (year past 9999) is
    refused with 400, not an exception out of the session."""
    from test_amqp10_management_link import pair, request, responses

    from leveret.protocol.amqp10.types import Timestamp

    pair(client)
    body = {"durable": True, "arguments": {"x-when": Timestamp(2**62)}}
    client.transfer(0, 0, request("PUT", "/queues/when", body), settled=True)
    (response,) = responses(client)
    properties = response[0]
    assert properties.subject == "400", response
    assert not client.closed


def test_management_info_of_a_queue_with_an_unencodable_argument(client: Client, core: BrokerCore) -> None:
    """A queue declared over HTTP may hold an argument text with a lone surrogate, which
    no AMQP string carries: its info is still answered (not an exception)."""
    from test_amqp10_management_link import pair, request, responses

    _declare(core, "odd", **{"x-note": "a\udc80b"})
    pair(client)
    client.transfer(0, 0, request("GET", "/queues/odd"), settled=True)
    (response,) = responses(client)
    assert response[0].subject == "200", response
    assert not client.closed


def test_dead_letter_with_an_unencodable_routing_key_is_delivered(client: Client, core: BrokerCore) -> None:
    """A dead-letter routing key set over HTTP may hold a lone surrogate: an AMQP 1.0
    message dead-lettered with it still reaches an AMQP 1.0 receiver (its
    ``x-routing-key`` annotation has the surrogate replaced), not an exception."""
    vhost = core.vhosts.get("/")
    vhost.declare_exchange("fan", "fanout")
    _declare(core, "dlq")
    vhost.bind("fan", vhost.get_queue("dlq"), "")
    _declare(core, "q", **{"x-dead-letter-exchange": "fan", "x-dead-letter-routing-key": "k\udc80"})
    _ready(client)
    _fill(client, 1)
    client.attach_receiver("/queues/q", handle=1)
    client.flow(1, 1)
    client.bodies()
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 0, None, True, perf.Rejected()))
    assert vhost.get_queue("dlq").message_count == 1
    client.attach_receiver("/queues/dlq", handle=2, settled=True)
    client.flow(2, 1)
    transfers = [b for b in client.bodies() if isinstance(b, perf.Transfer)]
    assert len(transfers) == 1
    assert not client.closed


def test_stream_offset_interval_beyond_the_epoch_is_refused_cleanly() -> None:
    """An interval reaching back before year 1 (``99999999Y``) is no offset: the filter
    is not applied (left out of the echo), not an exception out of the attach."""
    from leveret.protocol.amqp10.filters import source_filters
    from leveret.protocol.amqp10.types import Described, Symbol

    spec = Symbol("rabbitmq:stream-offset-spec")
    far = {Symbol("o"): Described(spec, "99999999Y")}
    assert source_filters(far, stream=True, now=1_700_000_000).echoed == {}


def test_transfers_after_the_brokers_detach_are_dropped_then_the_handle_is_free(
    client: Client, core: BrokerCore
) -> None:
    _declare(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", settled=True)
    client.send(perf.Detach(0, True))
    client.bodies()
    client.attach_sender("/queues/missing", settled=True)  # refused: attach then detach
    for delivery_id in range(3):  # sent before the client saw the detach
        client.transfer(0, delivery_id, message_payload(), settled=True, more=delivery_id < 2)
    client.send(perf.Flow(0, 1000, 0, 1000, 0, 0, 0, echo=True))
    assert client.bodies() == []
    client.send(perf.Detach(0, True))  # the answer to the broker's detach
    assert client.bodies() == []
    bodies = client.attach_sender("/queues/q", settled=True)
    assert isinstance(bodies[0], perf.Attach) and bodies[0].target is not None
    client.transfer(0, 3, message_payload(b"ok"), settled=True)
    assert [e.message.body for e in core.vhosts.get("/").queues["q"].browse(10)] == [b"ok"]
    assert not client.closed


def test_attach_above_handle_max_closes_the_connection_with_framing_error(client: Client) -> None:
    """§2.7.2: a handle outside the range the partner can handle closes the connection
    with framing-error (RabbitMQ 4: "link handle value exceeds maximum link handle
    value", amqp:connection:framing-error)."""
    client.open()
    assert client.begin().handle_max == 255
    bodies = client.attach_sender("/queues/q", handle=256)
    (close,) = [b for b in bodies if isinstance(b, perf.Close)]
    assert close.error.condition == "amqp:connection:framing-error"
    assert client.closed


def test_filters_on_text_with_a_lone_surrogate_do_not_fail() -> None:
    """Property filters compare texts by their bytes; a message published over HTTP (or
    an AMQP 0-9-1 key that is no UTF-8) may hold a lone surrogate: it matches nothing,
    rather than raising out of the queue's dispatch (the publisher's call)."""
    from leveret.core.message import Message, Properties
    from leveret.core.selector import message_lookup
    from leveret.protocol.amqp10.filters import source_filters
    from leveret.protocol.amqp10.types import Described, Symbol

    message = Message.build("", "q", b"x", Properties(message_id="ab\udc80", headers={"k": "v\udc80"}))
    for filter_map in (
        {Symbol("p"): Described(Symbol("amqp:properties-filter"), {Symbol("message-id"): "&p:ab"})},
        {Symbol("p"): Described(Symbol("amqp:properties-filter"), {Symbol("message-id"): "abc"})},
        {Symbol("a"): Described(Symbol("amqp:application-properties-filter"), {"k": "&s:v"})},
    ):
        selector = source_filters(filter_map).selector
        assert selector is not None
        assert selector.matches(message_lookup(message)) in (True, False)
