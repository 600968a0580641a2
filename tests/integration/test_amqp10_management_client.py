"""RabbitMQ 4's management node over AMQP 1.0, driven by rabbitmq-amqp-python-client
(unmodified) against a real leveret over TCP: declare, delete, bind, unbind, purge and
queue info, RabbitMQ's status codes for failures, an unauthorised user's session ended,
and publishing and consuming through the client to what it declared."""

from __future__ import annotations

from collections.abc import Iterator

import proton
import pytest
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

rabbitmq_amqp = pytest.importorskip("rabbitmq_amqp_python_client")

from rabbitmq_amqp_python_client import (  # noqa: E402
    AMQPMessagingHandler,
    ClassicQueueSpecification,
    Converter,
    Environment,
    ExchangeSpecification,
    ExchangeToExchangeBindingSpecification,
    ExchangeToQueueBindingSpecification,
    ExchangeType,
    Message,
    OutcomeState,
    QueueType,
    QuorumQueueSpecification,
    StreamSpecification,
    ValidationCodeException,
)
from rabbitmq_amqp_python_client.qpid.proton.utils import LinkDetached  # noqa: E402

import leveret  # noqa: E402
from leveret.core.auth import Permission, User  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[leveret.BlockingBroker]:
    with leveret.BlockingBroker(amqp_port=0) as running:

        def add_user() -> None:
            core = running.core
            core.add_user(User.with_password("bob", "secret"))
            core.set_permission("bob", "/", Permission(configure="^bob", write="^bob", read="^bob"))

        running.call(add_user)
        yield running


def connect(broker: leveret.BlockingBroker, user: str = "guest", password: str = "guest"):
    environment = Environment(f"amqp://{user}:{password}@127.0.0.1:{broker.amqp_port}/")
    connection = environment.connection()
    connection.dial()
    return environment, connection


@pytest.fixture
def client(broker) -> Iterator:
    environment, connection = connect(broker)
    management = connection.management()
    yield connection, management
    management.close()
    connection.close()
    environment.close()


def on_broker(broker: leveret.BlockingBroker, fn):
    return broker.call(lambda: fn(broker.core.vhosts["/"]))


def test_declare_info_and_delete_classic_quorum_and_stream_queues(broker, client):
    _, management = client
    management.declare_queue(ClassicQueueSpecification(name="mq-classic", max_len=10))
    management.declare_queue(QuorumQueueSpecification(name="mq-quorum"))
    management.declare_queue(StreamSpecification(name="mq-stream"))
    info = management.queue_info("mq-classic")
    assert (info.name, info.queue_type, info.is_durable, info.is_exclusive) == (
        "mq-classic",
        QueueType.classic,
        True,
        False,
    )
    assert info.arguments == {"x-queue-type": "classic", "x-max-length": 10}
    assert (info.message_count, info.consumer_count) == (0, 0)
    assert info.leader.startswith("leveret@") and list(info.members) == [info.leader]
    assert management.queue_info("mq-quorum").queue_type == QueueType.quorum
    assert management.queue_info("mq-stream").queue_type == QueueType.stream
    types = on_broker(broker, lambda v: {n: v.queues[n].type_name for n in v.queues if n.startswith("mq-")})
    assert types == {"mq-classic": "classic", "mq-quorum": "quorum", "mq-stream": "stream"}
    # the same declaration again is fine
    management.declare_queue(ClassicQueueSpecification(name="mq-classic", max_len=10))
    for name in ("mq-classic", "mq-quorum", "mq-stream"):
        management.delete_queue(name)
    assert on_broker(broker, lambda v: [n for n in v.queues if n.startswith("mq-")]) == []


def test_a_missing_queue_is_404_and_an_inequivalent_redeclare_a_precondition_failure(client):
    _, management = client
    with pytest.raises(ValidationCodeException, match="404"):
        management.queue_info("mq-nowhere")
    management.declare_queue(ClassicQueueSpecification(name="mq-twice", max_len=5))
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):
        management.declare_queue(ClassicQueueSpecification(name="mq-twice", max_len=6))
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):
        management.declare_exchange(
            ExchangeSpecification(name="amq.direct", exchange_type=ExchangeType.fanout)
        )
    management.delete_queue("mq-twice")


def test_names_are_percent_encoded(broker, client):
    _, management = client
    name = "mq a/b é?#"
    management.declare_queue(ClassicQueueSpecification(name=name))
    assert management.queue_info(name).name == name
    assert on_broker(broker, lambda v: name in v.queues)
    management.delete_queue(name)
    assert not on_broker(broker, lambda v: name in v.queues)


def test_an_exclusive_queue_belongs_to_its_connection(broker, client):
    _, management = client
    management.declare_queue(ClassicQueueSpecification(name="mq-mine", is_exclusive=True, is_durable=False))
    assert management.queue_info("mq-mine").is_exclusive is True
    environment, other = connect(broker)
    others = other.management()
    try:
        assert others.queue_info("mq-mine").is_exclusive is True
        with pytest.raises(ValidationCodeException, match="400"):
            others.declare_queue(
                ClassicQueueSpecification(name="mq-mine", is_exclusive=True, is_durable=False)
            )
        with pytest.raises(ValidationCodeException, match="400"):
            others.delete_queue("mq-mine")
    finally:
        others.close()
        other.close()
        environment.close()
    management.delete_queue("mq-mine")


def publish(connection, address: str, bodies: list[str]) -> list:
    """Publish ``bodies``; their outcomes. Each carries a message annotation: the
    client's consumer handler reads every delivery's annotations (RabbitMQ 4 always
    sends x-exchange and x-routing-key; leveret's message mapping is another item)."""
    publisher = connection.publisher(address)
    try:
        return [
            publisher.publish(
                Message(body=Converter.string_to_bytes(b), annotations={"x-opt-test": "management"})
            ).remote_state
            for b in bodies
        ]
    finally:
        publisher.close()


class Enough(Exception):
    """Raised by the handler to leave ``consumer.run()`` (as the client's own tests do)."""


class Collect(AMQPMessagingHandler):
    """Accepts ``count`` messages, then stops the consumer."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.bodies: list[str] = []

    def on_amqp_message(self, event) -> None:
        self.bodies.append(Converter.bytes_to_string(event.message.body))
        self.delivery_context.accept(event)
        if len(self.bodies) == self.count:
            raise Enough


def consume(broker, address: str, count: int) -> list[str]:
    """Consume and accept ``count`` messages on a connection of their own (the client
    leaves the container stopped once ``run()`` returns)."""
    environment, connection = connect(broker)
    handler = Collect(count)
    consumer = connection.consumer(address, message_handler=handler)
    try:
        consumer.run()
    except Enough:
        pass
    finally:
        consumer.close()
        connection.close()
        environment.close()
    return handler.bodies


def test_bind_publish_consume_purge_and_unbind_exchange_to_queue(broker, client):
    connection, management = client
    management.declare_exchange(ExchangeSpecification(name="mx-orders", exchange_type=ExchangeType.topic))
    management.declare_queue(QuorumQueueSpecification(name="mq-orders"))
    path = management.bind(
        ExchangeToQueueBindingSpecification(
            source_exchange="mx-orders", destination_queue="mq-orders", binding_key="order.*"
        )
    )
    assert path == "/bindings/src=mx-orders;dstq=mq-orders;key=order.%2A;args="
    states = publish(connection, "/exchanges/mx-orders/order.new", ["one", "two", "three"])
    assert states == [OutcomeState.ACCEPTED] * 3
    assert management.queue_info("mq-orders").message_count == 3
    assert consume(broker, "/queues/mq-orders", 2) == ["one", "two"]
    assert management.queue_info("mq-orders").message_count == 1
    assert management.purge_queue("mq-orders") == 1
    assert management.queue_info("mq-orders").message_count == 0
    management.unbind(path)
    assert on_broker(broker, lambda v: v.exchanges["mx-orders"].bindings) == {}
    with pytest.raises(Exception) as unroutable:  # the client raises SendException(released)
        publish(connection, "/exchanges/mx-orders/order.new", ["lost"])
    assert unroutable.value.args == (OutcomeState.RELEASED,)
    management.delete_exchange("mx-orders")
    management.delete_queue("mq-orders")
    assert on_broker(broker, lambda v: "mx-orders" in v.exchanges or "mq-orders" in v.queues) is False


def test_bind_and_unbind_exchange_to_exchange(broker, client):
    connection, management = client
    management.declare_exchange(ExchangeSpecification(name="mx-front", exchange_type=ExchangeType.direct))
    management.declare_exchange(ExchangeSpecification(name="mx-back", exchange_type=ExchangeType.fanout))
    management.declare_queue(ClassicQueueSpecification(name="mq-back"))
    management.bind(
        ExchangeToQueueBindingSpecification(source_exchange="mx-back", destination_queue="mq-back")
    )
    spec = ExchangeToExchangeBindingSpecification(
        source_exchange="mx-front", destination_exchange="mx-back", binding_key="k"
    )
    management.bind(spec)
    assert publish(connection, "/exchanges/mx-front/k", ["via"]) == [OutcomeState.ACCEPTED]
    assert management.queue_info("mq-back").message_count == 1
    # the client's own path for this binding says dstq= (as with RabbitMQ 4: a no-op);
    # the binding's dste= path removes it
    management.unbind(spec)
    assert len(on_broker(broker, lambda v: v.exchanges["mx-front"].bindings)) == 1
    management.unbind("/bindings/src=mx-front;dste=mx-back;key=k;args=")
    assert on_broker(broker, lambda v: v.exchanges["mx-front"].bindings) == {}
    for name in ("mx-front", "mx-back"):
        management.delete_exchange(name)
    management.delete_queue("mq-back")


class PairedRequest(MessagingHandler):
    """One management request on a link pair of python-qpid-proton's reactor (which,
    unlike the blocking API, sees a session ended with an error): ``response`` is the
    response message, ``session_error`` the condition of an ended session."""

    def __init__(self, url: str, request: proton.Message) -> None:
        super().__init__()
        self.url = url
        self.request = request
        self.response: proton.Message | None = None
        self.session_error: proton.Condition | None = None
        self.ready = 0

    def on_start(self, event) -> None:
        connection = event.container.connect(self.url, allowed_mechs="PLAIN")
        paired = Paired()
        self.sender = event.container.create_sender(connection, "/management", name="pair", options=paired)
        event.container.create_receiver(connection, "/management", name="pair", options=paired)
        self.timer = event.container.schedule(10, self)

    def on_timer_task(self, event) -> None:
        self.sender.connection.close()

    def on_link_opened(self, event) -> None:
        self.ready += 1
        self._send()

    def on_sendable(self, event) -> None:
        self._send()

    def _send(self) -> None:
        if self.ready == 2 and self.sender.credit and self.request is not None:
            self.sender.send(self.request)
            self.request = None

    def on_message(self, event) -> None:
        self.response = event.message
        self.timer.cancel()
        event.connection.close()

    def on_session_error(self, event) -> None:
        self.session_error = event.session.remote_condition
        self.timer.cancel()
        event.connection.close()


class Paired(LinkOption):
    """The link property RabbitMQ 4's management node requires of both halves."""

    def apply(self, link) -> None:
        link.properties = {proton.symbol("paired"): True}


def paired_request(broker, user: str, password: str, method: str, path: str, body) -> PairedRequest:
    request = proton.Message(id="req-1", reply_to="$me", address=path, subject=method, body=body)
    handler = PairedRequest(f"amqp://{user}:{password}@127.0.0.1:{broker.amqp_port}", request)
    Container(handler).run()
    return handler


def test_the_link_pair_answers_with_rabbitmqs_properties(broker):
    handler = paired_request(broker, "guest", "guest", "GET", "/queues/mq-absent", None)
    response = handler.response
    assert response is not None and handler.session_error is None
    assert (response.subject, response.correlation_id, response.body) == (
        "404",
        "req-1",
        "queue 'mq-absent' in vhost '/' not found",
    )
    assert response.properties == {"http:response": "1.1"}


def test_a_user_without_permission_has_the_session_ended(broker):
    text = "access to queue 'mq-not-bobs' in vhost '/' refused for user 'bob'"
    environment, connection = connect(broker, "bob", "secret")
    management = connection.management()
    try:  # what bob may do, and may not, through rabbitmq-amqp-python-client
        management.declare_queue(ClassicQueueSpecification(name="bob-q"))
        assert management.queue_info("bob-q").name == "bob-q"
        management.delete_queue("bob-q")
        # the pair is detached with the error before the session ends, so the
        # client's request fails at once (RabbitMQ 4 only ends the session)
        with pytest.raises(LinkDetached) as detached:
            management.declare_queue(ClassicQueueSpecification(name="mq-not-bobs"))
        assert detached.value.condition == "amqp:unauthorized-access"
        assert text in str(detached.value)
    finally:
        connection.close()
        environment.close()
    assert not on_broker(broker, lambda v: "mq-not-bobs" in v.queues)
    # the session itself ends with the same error, as RabbitMQ 4's
    handler = paired_request(broker, "bob", "secret", "PUT", "/queues/mq-not-bobs", {"durable": True})
    assert handler.response is None
    error = handler.session_error
    assert error is not None and (error.name, error.description) == ("amqp:unauthorized-access", text)
    assert not on_broker(broker, lambda v: "mq-not-bobs" in v.queues)
