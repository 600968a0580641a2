"""What management reads of an AMQP 1.0 connection (protocol/amqp10/info.py), sans-I/O:
the sessions' windows and links as they change with transfers, flows and settlements,
a source's filters, a direct reply-to link's address, the management API's rows, and
the ``amqp10`` share of the broker's counters."""

from __future__ import annotations

from amqp10_sans_io import Client, message_payload

from leveret.core.broker import BrokerCore
from leveret.core.connections import sessions_of
from leveret.management.connection_sessions import session_row
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.links import LINK_CREDIT, MAX_MESSAGE_SIZE
from leveret.protocol.amqp10.session import INCOMING_WINDOW
from leveret.protocol.amqp10.types import Described, Symbol, ULong

SELECTOR_FILTER = ULong(0x0000468C00000004)  # the JMS selector filter, by its code
NO_LOCAL_FILTER = ULong(0x0000468C00000003)  # not applied by leveret: not shown


def _queue(core: BrokerCore, name: str) -> None:
    core.vhosts.get("/").declare_queue(name, None, False, True, False, False, None)


def _ready(client: Client) -> None:
    client.open()
    client.begin()


def test_a_session_shows_its_windows_and_its_links_as_they_change(client: Client, core: BrokerCore) -> None:
    _queue(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", handle=0)
    client.send(
        perf.Attach(
            "reader",
            1,
            perf.ROLE_RECEIVER,
            perf.SND_UNSETTLED,
            perf.RCV_FIRST,
            perf.Source(
                "/queues/q",
                filter={
                    Symbol("sql"): Described(Symbol("amqp:sql-filter"), "n IS NULL"),
                    Symbol("selector"): Described(SELECTOR_FILTER, "JMSType IS NULL"),
                    Symbol("no-local"): Described(NO_LOCAL_FILTER, []),
                },
            ),
            perf.Target(),
            max_message_size=1_000_000,
        )
    )
    client.bodies()
    client.flow(1, 5)
    for delivery_id in range(2):
        client.transfer(0, delivery_id, message_payload(b"m"))
    client.bodies()

    sessions = sessions_of(client.connection)
    assert sessions is not None
    [session] = sessions
    assert (session.channel, session.remote_channel, session.handle_max) == (0, 0, 255)
    assert session.next_incoming_id == 2  # two transfers taken
    assert session.incoming_window == INCOMING_WINDOW - 2
    assert session.next_outgoing_id == 2  # two deliveries sent
    assert session.remote_outgoing_window == 1000  # the client's begin
    assert session.outgoing_unsettled == 2
    incoming, outgoing = session.links
    assert incoming.incoming and not outgoing.incoming
    assert (incoming.handle, incoming.name, incoming.address) == (0, "sender-0", "/queues/q")
    assert (incoming.snd_settle_mode, incoming.max_message_size) == ("unsettled", MAX_MESSAGE_SIZE)
    assert (incoming.delivery_count, incoming.credit, incoming.unconfirmed) == (2, LINK_CREDIT - 2, 0)
    assert (outgoing.queue, outgoing.send_settled, outgoing.max_message_size) == ("q", False, 1_000_000)
    assert (outgoing.delivery_count, outgoing.credit) == (2, 3)

    row = session_row(session)
    assert row["outgoing_links"][0]["filter"] == [  # the filters in place (RabbitMQ 4's)
        {"name": "sql", "descriptor": "amqp:sql-filter", "value": "n IS NULL"},
        {"name": "selector", "descriptor": SELECTOR_FILTER, "value": "JMSType IS NULL"},
    ]
    assert row["incoming_links"][0]["snd_settle_mode"] == "unsettled"

    client.send(perf.Disposition(perf.ROLE_RECEIVER, 0, 1, True, perf.Accepted()))
    client.send(perf.Flow(2, 1000, 0, 7))  # the session's windows only
    client.bodies()
    [session] = sessions_of(client.connection) or ()
    assert session.outgoing_unsettled == 0
    assert session.remote_outgoing_window == 7


def test_sessions_are_listed_by_channel_and_gone_when_ended(client: Client) -> None:
    client.open()
    for channel in (3, 1):
        client.begin(channel)
    assert [s.remote_channel for s in sessions_of(client.connection) or ()] == [3, 1]  # broker's 0, 1
    client.send(perf.End(), 3)
    client.bodies()
    assert [(s.channel, s.remote_channel) for s in sessions_of(client.connection) or ()] == [(1, 1)]


def test_a_direct_reply_to_link_shows_the_address_the_broker_gave(client: Client) -> None:
    _ready(client)
    client.send(
        perf.Attach(
            "replies",
            0,
            perf.ROLE_RECEIVER,
            perf.SND_SETTLED,
            perf.RCV_FIRST,
            perf.Source(dynamic=True, capabilities=(Symbol("rabbitmq:volatile-queue"),)),
            perf.Target(),
        )
    )
    [attach] = client.bodies()
    [session] = sessions_of(client.connection) or ()
    [link] = session.links
    assert link.address == attach.source.address
    assert link.address.startswith("/queues/amq.rabbitmq.reply-to.")
    assert link.send_settled and link.max_message_size is None
    assert session_row(session)["outgoing_links"][0]["max_message_size"] == "unlimited"


def test_the_adapter_counts_its_share_of_the_broker_counters(client: Client, core: BrokerCore) -> None:
    _queue(core, "q")
    _ready(client)
    client.attach_sender("/queues/q", handle=0)
    client.attach_sender("/exchanges/amq.direct/nowhere", handle=2)
    client.attach_receiver("/queues/q", handle=1)
    client.transfer(0, 0, message_payload(b"a"))
    client.transfer(0, 1, message_payload(b"b"), settled=True)
    client.transfer(2, 2, message_payload(b"c"))
    client.connection.flush()
    client.flow(1, 10)
    client.send(perf.Disposition(perf.ROLE_RECEIVER, 0, 1, True, perf.Accepted()))
    client.bodies()
    amqp10, total = core.metrics.amqp10, core.metrics
    assert (
        (amqp10.received, amqp10.unroutable_returned) == (3, 1) == (total.received, total.unroutable_returned)
    )
    assert amqp10.received_confirm == total.received_confirm == 3
    assert amqp10.confirmed == total.confirmed == 3
    assert (amqp10.publishers, amqp10.consumers) == (2, 1)
    classic = amqp10.queue_types["classic"]
    assert (classic.delivered_consume_manual_ack, classic.acknowledged) == (2, 2)
    client.send(perf.End())
    client.bodies()
    assert (amqp10.publishers, amqp10.consumers) == (0, 0)
    assert total.publishers == 0
