"""Logging in on the sans-I/O Connection: the loopback-only rule for ``guest``.

The Connection is fed bytes directly (no socket) with the real BrokerCore; the address
it came from is what the listener passes as ``from_loopback``.
"""

from __future__ import annotations

from pamqp import commands, encode as pamqp_encode, frame as pamqp_frame
from sans_io import FakeLoop, FakeTransport

from leveret.amqp.frames import FRAME_METHOD, PROTOCOL_HEADER, FrameReader, encode_frame
from leveret.core.auth import User, UserDatabase
from leveret.core.broker import BrokerCore
from leveret.protocol.amqp import Connection

C = commands.Connection


class Client:
    """A Connection from ``peer``, fed as the listener feeds it (flush after each read)."""

    def __init__(self, from_loopback: bool, core: BrokerCore | None = None) -> None:
        self.loop = FakeLoop()
        self.core = core or BrokerCore(self.loop)
        self.transport = FakeTransport()
        self.pending: set[Connection] = set()
        self.connection = Connection(self.core, self.transport, self.loop, self.pending.add,
                                     "192.0.2.7:40000" if not from_loopback else "127.0.0.1:40000",
                                     from_loopback)

    def feed(self, data: bytes) -> None:
        self.connection.data_received(data)
        for connection in list(self.pending):
            connection.flush()
        self.pending.clear()

    def send(self, method) -> None:
        self.feed(pamqp_frame.marshal(method, 0))

    def methods(self) -> list:
        """Every method written so far, decoded."""
        frames = FrameReader(1 << 20).feed(bytes(self.transport.output))
        return [pamqp_frame.unmarshal(encode_frame(t, ch, payload))[2]
                for t, ch, payload in frames if t == FRAME_METHOD]

    def login(self, user: str, password: str, mechanism: str = "PLAIN") -> None:
        self.feed(PROTOCOL_HEADER)
        assert isinstance(self.methods()[-1], C.Start)
        if mechanism == "PLAIN":
            response = f"\x00{user}\x00{password}"
        else:  # AMQPLAIN: a field table without its length prefix
            response = pamqp_encode.field_table({"LOGIN": user, "PASSWORD": password})[4:].decode()
        self.send(C.StartOk(client_properties={"product": "test"}, mechanism=mechanism,
                            response=response, locale="en_US"))


def test_guest_from_a_non_loopback_address_is_refused_with_403():
    client = Client(from_loopback=False)
    client.login("guest", "guest")
    start, close = client.methods()
    assert isinstance(start, C.Start)
    assert isinstance(close, C.Close)
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - user 'guest' can only connect via localhost")
    assert (close.class_id, close.method_id) == (10, 11)  # connection.start-ok
    assert client.connection.state == "closing" and client.connection.user is None
    # the client's close-ok ends it; the broker never got to tune or open
    client.send(C.CloseOk())
    assert client.connection.state == "closed" and client.transport.closed
    assert not any(isinstance(m, (C.Tune, C.OpenOk)) for m in client.methods())


def test_guest_from_a_non_loopback_address_is_refused_with_amqplain_too():
    client = Client(from_loopback=False)
    client.login("guest", "guest", mechanism="AMQPLAIN")
    close = client.methods()[-1]
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - user 'guest' can only connect via localhost")


def test_guest_from_a_non_loopback_address_with_a_wrong_password_gets_the_login_refused_text():
    client = Client(from_loopback=False)
    client.login("guest", "wrong")
    close = client.methods()[-1]
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
             "For details see the broker logfile.")


def test_guest_from_loopback_gets_connection_tune():
    client = Client(from_loopback=True)
    client.login("guest", "guest")
    assert isinstance(client.methods()[-1], C.Tune)
    assert client.connection.state == "tune" and client.connection.user.name == "guest"


def test_a_user_not_limited_to_loopback_logs_in_from_anywhere():
    users = UserDatabase([User.with_password("guest", "guest"), User.with_password("alice", "s3cret")],
                         loopback_users=["guest"])
    client = Client(from_loopback=False, core=BrokerCore(FakeLoop(), users=users))
    client.login("alice", "s3cret")
    assert isinstance(client.methods()[-1], C.Tune)
    assert client.connection.user.name == "alice"
