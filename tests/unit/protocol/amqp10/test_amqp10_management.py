"""The AMQP 1.0 management node (leveret.protocol.amqp10.management) against a real
core: each request as rabbitmq-amqp-python-client sends it, answered with RabbitMQ 4's
status codes and bodies (rabbit_amqp_management)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from leveret.core import BrokerCore, Message
from leveret.core.access import Access
from leveret.core.auth import Permission, User
from leveret.core.clock import ManualClock
from leveret.core.errors import AccessRefused
from leveret.core.message import Properties as CoreProperties
from leveret.core.session import Session
from leveret.protocol.amqp10 import management_paths as paths
from leveret.protocol.amqp10.management import (
    NODE,
    BadRequestMessage,
    handle_request,
    parse_request,
    response_sections,
)
from leveret.protocol.amqp10.performatives import (
    AmqpValue,
    ApplicationProperties,
    Header,
    Properties,
    from_described,
    to_described,
)
from leveret.protocol.amqp10.types import Array, Symbol, Timestamp, UInt, ULong, decode_all, encode


@pytest.fixture
def core() -> BrokerCore:
    return BrokerCore(clock=ManualClock())


def session_of(core: BrokerCore, user: str = "guest", owner: object = "conn-1") -> Session:
    return Session(core.vhosts["/"], Access(core.users, core.users.users[user], "/"), owner)


@pytest.fixture
def session(core: BrokerCore) -> Session:
    return session_of(core)


def put(session: Session, path: str, body: dict) -> tuple[str, object]:
    return handle_request(session, "PUT", path, body)


def publish(core: BrokerCore, queue: str, count: int) -> None:
    vhost = core.vhosts["/"]
    for i in range(count):
        message = Message.build("", queue, b"m%d" % i, CoreProperties())
        for target in vhost.route(vhost.exchanges[""], message):
            target.enqueue(message)


# -- paths -------------------------------------------------------------------------------


def test_quote_keeps_unreserved_and_encodes_the_rest_as_utf8():
    assert paths.quote("a-b.c_d~9") == "a-b.c_d~9"
    assert paths.quote("a/b c") == "a%2Fb%20c"
    assert paths.quote("é") == "%C3%A9"
    for name in ("a/b", "q ü ?#&=;%", "", "x" * 300):
        assert paths.unquote(paths.quote(name)) == name


@pytest.mark.parametrize("bad", ["%", "%4", "%zz", "a%g1", "%C3"])
def test_unquote_refuses_bad_escapes_and_non_utf8(bad):
    with pytest.raises(paths.BadTarget):
        paths.unquote(bad)


def test_split_target_keeps_encoded_slashes_in_one_segment_and_decodes_the_query():
    assert paths.split_target("/queues/a%2Fb") == (["queues", "a%2Fb"], {})
    segments, query = paths.split_target("/bindings?src=e%201&dstq=q+1&key=")
    assert segments == ["bindings"]
    assert query == {"src": "e 1", "dstq": "q 1", "key": ""}
    with pytest.raises(paths.BadTarget):
        paths.split_target("queues/q")


def test_binding_segments_parse_and_locations_round_trip():
    ref = paths.parse_binding_segment("src=e%2F1;dstq=q1;key=a.b;args=")
    assert ref == paths.BindingRef("e/1", "queue", "q1", "a.b", "")
    assert paths.parse_binding_segment("src=e;dste=f;key=;args=").kind == "exchange"
    location = paths.binding_location("e 1", "exchange", "x/y", "k#", {"a": 1})
    ref = paths.parse_binding_segment(location.removeprefix("/bindings/"))
    assert ref == paths.BindingRef("e 1", "exchange", "x/y", "k#", paths.args_hash({"a": 1}))
    for bad in (
        "src=;dstq=q;key=;args=",
        "src=e;dstx=q;key=;args=",
        "src=e;dstq=q;key=k",
        "src=e/;dstq=q;key=;args=",
    ):
        with pytest.raises(paths.BadTarget, match="bad binding path segment"):
            paths.parse_binding_segment(bad)


def test_args_hash_is_empty_for_none_stable_and_order_insensitive():
    assert paths.args_hash({}) == paths.args_hash(None) == ""
    one = paths.args_hash({"x-match": "all", "a": 1})
    assert one == paths.args_hash({"a": 1, "x-match": "all"})
    assert len(one) == 6 and one != paths.args_hash({"x-match": "any", "a": 1})


# -- request and response messages ------------------------------------------------------------


def test_a_request_message_parses_and_the_response_echoes_its_message_id():
    sections = [
        Header(durable=False),
        Properties(message_id="id-1", to="/queues/q", subject="GET", reply_to="$me"),
        AmqpValue(None),
    ]
    payload = b"".join(encode(to_described(s)) for s in sections)
    request = parse_request([from_described(d) for d in decode_all(payload)])
    assert (request.message_id, request.method, request.target, request.body) == (
        "id-1",
        "GET",
        "/queues/q",
        None,
    )
    reply = response_sections(request, "200", {"name": "q"})
    decoded = [from_described(d) for d in decode_all(b"".join(encode(to_described(s)) for s in reply))]
    assert decoded[0].subject == "200" and decoded[0].correlation_id == "id-1"
    assert decoded[0].to is None
    assert decoded[1] == ApplicationProperties({"http:response": "1.1"})
    assert decoded[2] == AmqpValue({"name": "q"})


@pytest.mark.parametrize(
    "props",
    [
        Properties(to="/queues/q", reply_to="$me"),
        Properties(subject="GET", reply_to="$me"),
        Properties(subject="GET", to="/queues/q", reply_to="other"),
    ],
)
def test_a_message_that_is_no_request_is_refused(props):
    with pytest.raises(BadRequestMessage):
        parse_request([props, AmqpValue(None)])
    with pytest.raises(BadRequestMessage):
        parse_request([AmqpValue(None)])


# -- queues ------------------------------------------------------------------------------


def test_declare_creates_201_then_200_with_rabbitmq_info(session):
    status, info = put(session, "/queues/q1", {"durable": True, "arguments": {"x-queue-type": "classic"}})
    assert status == "201"
    assert info == {
        "leader": NODE,
        "replicas": Array("string", (NODE,)),
        "message_count": 0,
        "consumer_count": 0,
        "name": "q1",
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        "type": "classic",
        "arguments": {"x-queue-type": "classic"},
    }
    assert type(info["message_count"]) is ULong and type(info["consumer_count"]) is UInt
    assert put(session, "/queues/q1", {"durable": True, "arguments": {"x-queue-type": "classic"}})[0] == "200"
    assert session.vhost.queues["q1"].durable


def test_declare_defaults_to_durable_and_decodes_the_name(session):
    status, info = put(session, "/queues/a%2Fb%20%C3%A9", {})
    assert status == "201" and info["name"] == "a/b é" and info["durable"] is True
    assert "a/b é" in session.vhost.queues


def test_quorum_and_stream_queues_report_their_type(session):
    assert put(session, "/queues/qq", {"arguments": {"x-queue-type": "quorum"}})[1]["type"] == "quorum"
    status, info = put(session, "/queues/s", {"arguments": {"x-queue-type": "stream", "x-max-age": "1D"}})
    assert (status, info["type"], info["arguments"]["x-max-age"]) == ("201", "stream", "1D")


def test_an_inequivalent_redeclare_is_409_with_rabbitmqs_text(session):
    put(session, "/queues/q", {"durable": True, "arguments": {"x-max-length": 5}})
    status, text = put(session, "/queues/q", {"durable": False, "arguments": {"x-max-length": 5}})
    assert status == "409" and "inequivalent arg 'durable'" in text
    status, text = put(session, "/queues/q", {"arguments": {"x-max-length": 6}})
    assert status == "409" and "inequivalent arg 'x-max-length'" in text


def test_x_queue_type_of_the_queues_own_type_is_equivalent_to_none(session):
    session.vhost.declare_queue("plain", "conn-1", durable=True)
    assert put(session, "/queues/plain", {"arguments": {"x-queue-type": "classic"}})[0] == "200"
    put(session, "/queues/typed", {"arguments": {"x-queue-type": "classic"}})
    assert put(session, "/queues/typed", {"arguments": {}})[0] == "200"
    assert put(session, "/queues/typed", {"arguments": {"x-queue-type": "quorum"}})[0] == "409"


def test_arguments_of_every_amqp_type_come_back_encodable(session):
    arguments = {
        "x-ulong": ULong(2**64 - 1),
        "x-symbol": Symbol("s"),
        "x-list": [1, "a", b"b"],
        "x-map": {"k": Timestamp(1_700_000_000_000)},
        "x-array": Array("int", (1, 2)),
        "x-none": None,
    }
    status, info = put(session, "/queues/typed-args", {"arguments": arguments})
    assert status == "201"
    assert info["arguments"]["x-ulong"] == 2**64 - 1 and info["arguments"]["x-list"] == [1, "a", b"b"]
    assert info["arguments"]["x-map"]["k"] == 1_700_000_000_000 and info["arguments"]["x-array"] == [1, 2]
    encode(info)


def test_an_invalid_argument_is_409(session):
    status, text = put(session, "/queues/q", {"arguments": {"x-max-length": "lots"}})
    assert status == "409" and "x-max-length" in text


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/queues/", {}, "400", "declare queue with empty name not allowed"),
        ("/queues/a%0Ab", {}, "400", "line feed and carriage return"),
        ("/queues/amq.x", {}, "403", "queue 'amq.x' in vhost '/' starts with reserved prefix 'amq.'"),
        ("/queues/q", {"durable": "yes"}, "400", "bad queue property 'durable'"),
        ("/queues/q", {"colour": True}, "400", "bad queue property 'colour'"),
        ("/queues/q", {"arguments": {"x-x": Symbol("s"), 1: 2}}, "400", "unsupported argument 1"),
        ("/queues/q", ["not", "a", "map"], "400", "bad queue body"),
        ("/queues/q%zz", {}, "400", "bad percent-encoding"),
    ],
)
def test_bad_declarations_are_refused(session, path, body, status, text):
    got_status, got_text = put(session, path, body)
    assert (got_status, text in got_text) == (status, True), got_text


def test_another_connections_exclusive_queue_is_400(core, session):
    assert put(session, "/queues/mine", {"exclusive": True, "durable": False})[0] == "201"
    other = session_of(core, owner="conn-2")
    status, text = put(other, "/queues/mine", {"exclusive": True, "durable": False})
    assert status == "400" and "exclusive" in text
    assert handle_request(other, "DELETE", "/queues/mine", None)[0] == "400"
    assert handle_request(other, "DELETE", "/queues/mine/messages", None)[0] == "400"
    assert handle_request(other, "GET", "/queues/mine", None)[1]["exclusive"] is True


def test_the_vhosts_queue_limit_is_403(core, session):
    core.vhosts["/"].limits["max-queues"] = 1
    assert put(session, "/queues/one", {})[0] == "201"
    status, text = put(session, "/queues/two", {})
    assert status == "403" and "queue limit" in text
    assert put(session, "/queues/one", {})[0] == "200"


def test_queue_info_counts_messages_and_a_missing_queue_is_404(core, session):
    put(session, "/queues/q", {})
    publish(core, "q", 3)
    status, info = handle_request(session, "GET", "/queues/q", None)
    assert (status, info["message_count"], info["consumer_count"]) == ("200", 3, 0)
    assert handle_request(session, "GET", "/queues/nope", None) == (
        "404",
        "queue 'nope' in vhost '/' not found",
    )


def test_purge_answers_the_count_404_when_missing_and_400_for_a_stream(core, session):
    put(session, "/queues/q", {})
    publish(core, "q", 4)
    assert handle_request(session, "DELETE", "/queues/q/messages", None) == ("200", {"message_count": 4})
    assert session.vhost.queues["q"].message_count == 0
    assert handle_request(session, "DELETE", "/queues/nope/messages", None) == (
        "404",
        "no queue 'nope' in vhost '/'",
    )
    put(session, "/queues/s", {"arguments": {"x-queue-type": "stream"}})
    assert handle_request(session, "DELETE", "/queues/s/messages", None)[0] == "400"


def test_delete_queue_answers_the_count_and_a_missing_queue_is_200_zero(core, session):
    put(session, "/queues/q", {})
    publish(core, "q", 2)
    status, body = handle_request(session, "DELETE", "/queues/q", None)
    assert (status, body, type(body["message_count"])) == ("200", {"message_count": 2}, ULong)
    assert "q" not in session.vhost.queues
    assert handle_request(session, "DELETE", "/queues/q", None) == ("200", {"message_count": 0})


# -- exchanges ---------------------------------------------------------------------------


def test_declare_exchange_is_204_and_an_inequivalent_redeclare_409(session):
    body = {"durable": True, "type": "topic", "internal": False, "arguments": {}}
    assert put(session, "/exchanges/e1", body) == ("204", None)
    exchange = session.vhost.exchanges["e1"]
    assert (exchange.type, exchange.durable, exchange.internal) == ("topic", True, False)
    assert put(session, "/exchanges/e1", body) == ("204", None)
    status, text = put(session, "/exchanges/e1", {**body, "type": "fanout"})
    assert status == "409" and "inequivalent arg 'type'" in text
    assert put(session, "/exchanges/e2", {})[0] == "204"
    assert session.vhost.exchanges["e2"].type == "direct" and session.vhost.exchanges["e2"].durable


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/exchanges/", {"type": "direct"}, "403", "operation not permitted on the default exchange"),
        ("/exchanges/amq.new", {"type": "direct"}, "403", "starts with reserved prefix 'amq.'"),
        ("/exchanges/e", {"type": "nonsense"}, "400", "exchange type 'nonsense'"),
        ("/exchanges/e%0D", {"type": "direct"}, "400", "line feed and carriage return"),
        ("/exchanges/e", {"type": 5}, "400", "bad exchange property 'type'"),
    ],
)
def test_bad_exchange_declarations_are_refused(session, path, body, status, text):
    got_status, got_text = put(session, path, body)
    assert (got_status, text in got_text) == (status, True), got_text


def test_an_existing_amq_exchange_may_be_redeclared_but_not_deleted(session):
    assert put(session, "/exchanges/amq.direct", {"type": "direct"}) == ("204", None)
    status, text = handle_request(session, "DELETE", "/exchanges/amq.direct", None)
    assert status == "403" and "reserved prefix 'amq.'" in text
    assert handle_request(session, "DELETE", "/exchanges/", None)[0] == "403"


def test_delete_exchange_is_204_whether_or_not_it_exists(session):
    put(session, "/exchanges/gone", {"type": "fanout"})
    assert handle_request(session, "DELETE", "/exchanges/gone", None) == ("204", None)
    assert "gone" not in session.vhost.exchanges
    assert handle_request(session, "DELETE", "/exchanges/gone", None) == ("204", None)


# -- bindings ----------------------------------------------------------------------------


def routed(core: BrokerCore, exchange: str, key: str) -> list[str]:
    vhost = core.vhosts["/"]
    message = Message.build(exchange, key, b"x", CoreProperties())
    return sorted(q.name for q in vhost.route(vhost.exchanges[exchange], message))


def test_bind_and_unbind_exchange_to_queue(core, session):
    put(session, "/exchanges/e", {"type": "direct"})
    put(session, "/queues/q", {})
    body = {"source": "e", "destination_queue": "q", "binding_key": "k", "arguments": {}}
    assert handle_request(session, "POST", "/bindings", body) == ("204", None)
    assert routed(core, "e", "k") == ["q"]
    path = "/bindings/src=e;dstq=q;key=k;args="
    assert handle_request(session, "DELETE", path, None) == ("204", None)
    assert routed(core, "e", "k") == []
    assert handle_request(session, "DELETE", path, None) == ("204", None)


def test_bind_and_unbind_exchange_to_exchange_with_arguments(core, session):
    put(session, "/exchanges/src", {"type": "headers"})
    put(session, "/exchanges/dst", {"type": "fanout"})
    put(session, "/queues/q", {})
    handle_request(
        session, "POST", "/bindings", {"source": "dst", "destination_queue": "q", "binding_key": ""}
    )
    arguments = {"x-match": "any", "colour": "red"}
    body = {"source": "src", "destination_exchange": "dst", "binding_key": "", "arguments": arguments}
    assert handle_request(session, "POST", "/bindings", body) == ("204", None)
    assert len(session.vhost.exchanges["src"].bindings) == 1
    status, found = handle_request(session, "GET", "/bindings?src=src&dste=dst&key=", None)
    assert status == "200" and len(found) == 1
    location = found[0]["location"]
    assert found[0]["destination_exchange"] == "dst" and found[0]["arguments"] == arguments
    assert location == f"/bindings/src=src;dste=dst;key=;args={paths.args_hash(arguments)}"
    # the empty-arguments path names another binding: nothing is removed
    assert handle_request(session, "DELETE", "/bindings/src=src;dste=dst;key=;args=", None) == ("204", None)
    assert len(session.vhost.exchanges["src"].bindings) == 1
    assert handle_request(session, "DELETE", location, None) == ("204", None)
    assert session.vhost.exchanges["src"].bindings == {}


def test_binding_errors_are_400_and_the_default_exchange_403(session):
    put(session, "/queues/q", {})
    missing = {"source": "nope", "destination_queue": "q", "binding_key": "k"}
    status, text = handle_request(session, "POST", "/bindings", missing)
    assert status == "400" and "no exchange 'nope'" in text
    put(session, "/exchanges/e", {"type": "direct"})
    status, text = handle_request(
        session, "POST", "/bindings", {**missing, "source": "e", "destination_queue": "x"}
    )
    assert status == "400" and "no queue 'x'" in text
    default = {"source": "", "destination_queue": "q", "binding_key": "q"}
    assert handle_request(session, "POST", "/bindings", default) == (
        "403",
        "operation not permitted on the default exchange",
    )
    assert handle_request(session, "POST", "/bindings", {"source": "e", "binding_key": ""})[0] == "400"
    status, text = handle_request(session, "DELETE", "/bindings/src=e;dstz=q;key=;args=", None)
    assert status == "400" and "bad binding path segment" in text
    assert handle_request(session, "GET", "/bindings?src=e&key=k", None)[0] == "400"


# -- permissions -------------------------------------------------------------------------


@pytest.fixture
def limited(core: BrokerCore) -> Session:
    """A user who may read anything but configure and write only ``own.*``."""
    core.add_user(User.with_password("bob", "pw"))
    core.set_permission("bob", "/", Permission(configure="^own", write="^own", read=".*"))
    return session_of(core, "bob")


def test_a_refused_permission_raises_access_refused(session, limited):
    put(session, "/queues/theirs", {})
    put(session, "/exchanges/theirs-x", {"type": "direct"})
    assert put(limited, "/queues/own-q", {})[0] == "201"
    refusals = [
        ("PUT", "/queues/theirs", {}),
        ("DELETE", "/queues/theirs", None),
        ("PUT", "/exchanges/theirs-x", {"type": "direct"}),
        ("DELETE", "/exchanges/theirs-x", None),
        ("POST", "/bindings", {"source": "theirs-x", "destination_queue": "theirs", "binding_key": ""}),
        ("DELETE", "/bindings/src=theirs-x;dstq=theirs;key=;args=", None),
    ]
    for method, path, body in refusals:
        with pytest.raises(AccessRefused, match="refused for user 'bob'"):
            handle_request(limited, method, path, body)
    assert "theirs" in session.vhost.queues and "theirs-x" in session.vhost.exchanges
    # read alone is enough for queue info and purge, and for binding from a source
    assert handle_request(limited, "GET", "/queues/theirs", None)[0] == "200"
    assert handle_request(limited, "DELETE", "/queues/theirs/messages", None)[0] == "200"
    body = {"source": "theirs-x", "destination_queue": "own-q", "binding_key": ""}
    assert handle_request(limited, "POST", "/bindings", body)[0] == "204"


def test_reserved_names_are_403_before_permissions(limited):
    assert put(limited, "/queues/amq.q", {})[0] == "403"
    assert handle_request(limited, "DELETE", "/exchanges/amq.topic", None)[0] == "403"


# -- the rest ----------------------------------------------------------------------------


def test_unknown_paths_are_404_other_methods_405_and_token_refresh_501(session):
    assert handle_request(session, "GET", "/vhosts/x", None)[0] == "404"
    assert handle_request(session, "POST", "/queues/q", None)[0] == "405"
    assert handle_request(session, "PATCH", "/exchanges/e", None)[0] == "405"
    assert handle_request(session, "PUT", "/auth/tokens", b"token")[0] == "501"
    assert handle_request(session, "GET", "queues/q", None)[0] == "400"


# -- fuzz ----------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.builds(Symbol, st.text("abcx-", max_size=8)),
    st.builds(Timestamp, st.integers(0, 2**40)),
    st.builds(ULong, st.integers(0, 2**64 - 1)),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=12), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)
_NAMES = st.one_of(
    st.sampled_from(["q", "e", "amq.direct", "amq.q", "", "a%2Fb", "%zz", "q%0A"]), st.text(max_size=6)
)
_ARGUMENTS = st.dictionaries(
    st.sampled_from(["x-queue-type", "x-max-length", "x-match", "alternate-exchange", "x-y"]),
    st.one_of(st.sampled_from(["classic", "quorum", "stream", "all", "any", "e"]), st.integers(-2, 9)),
    max_size=2,
)
#: Well-formed bodies (most requests succeed) and any value (most fail).
_QUEUE_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "durable": st.booleans(),
        "exclusive": st.booleans(),
        "auto_delete": st.booleans(),
        "arguments": _ARGUMENTS,
    },
)
_EXCHANGE_BODIES = st.fixed_dictionaries(
    {"type": st.sampled_from(["direct", "fanout", "topic", "headers", "nonsense"])},
    optional={"durable": st.booleans(), "internal": st.booleans(), "arguments": _ARGUMENTS},
)
_BINDING_BODIES = st.fixed_dictionaries(
    {"source": _NAMES, "binding_key": st.sampled_from(["", "k", "a.#"])},
    optional={"destination_queue": _NAMES, "destination_exchange": _NAMES, "arguments": _ARGUMENTS},
)
_BODIES = st.one_of(_QUEUE_BODIES, _EXCHANGE_BODIES, _BINDING_BODIES, _VALUES)
_PATHS = st.one_of(
    st.builds("/queues/{}".format, _NAMES),
    st.builds("/queues/{}/messages".format, _NAMES),
    st.builds("/exchanges/{}".format, _NAMES),
    st.just("/bindings"),
    st.builds(
        lambda s, k, d, key, a: f"/bindings/src={s};dst{k}={d};key={key};args={a}",
        st.sampled_from(["e", "amq.direct", "", "%zz"]),
        st.sampled_from(["q", "e", "z"]),
        st.sampled_from(["q", "e", "", "%C3"]),
        st.text("ab.%", max_size=4),
        st.text("AZ-_", max_size=6),
    ),
    st.builds(
        "/bindings?src={}&dst{}={}&key={}".format,
        _NAMES,
        st.sampled_from(["q", "e"]),
        _NAMES,
        st.sampled_from(["", "k"]),
    ),
    st.builds(lambda parts: "/" + "/".join(parts), st.lists(st.text(max_size=8), max_size=4)),
    st.text(max_size=12),
)
_STATUSES = {"200", "201", "204", "400", "403", "404", "405", "409", "501"}
_METHODS = st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", ""])
#: (method, path, body): mostly requests of the right form, some anything at all.
_REQUESTS = st.one_of(
    st.tuples(st.just("PUT"), st.builds("/queues/{}".format, _NAMES), _QUEUE_BODIES),
    st.tuples(st.just("PUT"), st.builds("/exchanges/{}".format, _NAMES), _EXCHANGE_BODIES),
    st.tuples(st.just("POST"), st.just("/bindings"), _BINDING_BODIES),
    st.tuples(st.sampled_from(["GET", "DELETE"]), _PATHS, st.none()),
    st.tuples(_METHODS, _PATHS, _BODIES),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_REQUESTS)
def test_any_request_gets_a_status_never_an_exception(session, request):
    """Whatever a client sends, the node answers with a status (the guest may do
    anything, so nothing is refused as a permission) and core stays consistent."""
    status, answer = handle_request(session, *request)
    assert status in _STATUSES
    # the response encodes (a queue's arguments as the client gave them included)
    request_message = parse_request([Properties(message_id=1, to="/", subject="GET", reply_to="$me")])
    for section in response_sections(request_message, status, answer):
        encode(to_described(section))
    if status in ("200", "201") and isinstance(answer, dict) and "name" in answer:
        encode(handle_request(session, "GET", "/queues/" + paths.quote(answer["name"]), None)[1])
    if status >= "400":
        assert isinstance(answer, str)
    vhost = session.vhost
    for name, queue in vhost.queues.items():
        assert queue.name == name
        for binding in queue.bindings:
            assert binding.source.name in vhost.exchanges
