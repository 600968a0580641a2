"""disk_free_limit: below it publishers get connection.blocked and are not read from,
as in RabbitMQ; when space returns they get connection.unblocked and carry on."""

from __future__ import annotations

import pika
from eventually import eventually, pumping

from leveret import BlockingBroker


def test_low_disk_blocks_publishers_until_space_returns(tmp_path):
    # A limit above any real disk's free space raises the alarm at once.
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path), disk_free_limit=10**18) as broker:
        events = []
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        conn.add_on_connection_blocked_callback(lambda c, m: events.append("blocked"))
        conn.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        ch.basic_publish("", "q", b"while blocked", pika.BasicProperties(delivery_mode=2))
        assert eventually(lambda: "blocked" in events, interval=0.05, wait=pumping(conn))

        # A consumer on another connection is unaffected, and the blocked publisher's
        # later frames are not read: the queue holds at most the first message.
        other_conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        other = other_conn.channel()
        ch.basic_publish("", "q", b"second", pika.BasicProperties(delivery_mode=2))
        conn.process_data_events(time_limit=0.3)
        assert other.queue_declare("q", passive=True).method.message_count <= 1

        broker.broker.settings.disk_free_limit = 0
        assert eventually(lambda: "unblocked" in events, interval=0.05, wait=pumping(conn))
        assert eventually(lambda: other.queue_declare("q", passive=True).method.message_count == 2)
        assert events == ["blocked", "unblocked"]
        conn.close()
        other_conn.close()
