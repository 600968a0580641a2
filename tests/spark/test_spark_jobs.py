"""The pipeline jobs: dlq-report, dlq-replay (leases) and archive, plus the CLI."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pika
import pytest
from spark_support import drain

from leveret.amqp.client import BlockingClient as Client
from leveret.spark.jobs import archive, dlq_replay, dlq_report

pytestmark = pytest.mark.timeout(180)


def _dead_letters(channel) -> None:
    """work.dlq gets 4 rejected from 'work' (tenants a, b, a, b) and 2 expired from
    'slow' (tenant a)."""
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work.dlq"}
    channel.queue_declare("work.dlq", durable=True)
    channel.queue_declare("work", durable=True, arguments=dlx)
    channel.queue_declare("slow", durable=True, arguments={**dlx, "x-message-ttl": 1})
    for i in range(4):
        channel.basic_publish("", "work", f"w{i}".encode(), pika.BasicProperties(
            headers={"tenant": "ab"[i % 2]}, message_id=f"w{i}", content_type="text/plain"))
    for i in range(2):
        channel.basic_publish("", "slow", f"s{i}".encode(),
                              pika.BasicProperties(headers={"tenant": "a"}))
    for _ in range(4):
        method, _, _ = channel.basic_get("work")
        channel.basic_reject(method.delivery_tag, requeue=False)
    for _ in range(100):
        if channel.queue_declare("work.dlq", passive=True).method.message_count == 6:
            break
        channel.connection.sleep(0.05)


def test_dlq_report_counts_writes_parquet_and_a_chart(spark, leveret_broker, channel,
                                                      tmp_path):
    _dead_letters(channel)
    out, chart = tmp_path / "report", tmp_path / "chart.png"
    table = dlq_report(spark, leveret_broker.amqp_url, "work.dlq", str(out), ["tenant"],
                       str(chart))
    counts = {(r.original_queue, r.reason, r.tenant): r.dead_letters
              for r in table.itertuples()}
    assert counts == {("work", "rejected", "a"): 2, ("work", "rejected", "b"): 2,
                      ("slow", "expired", "a"): 2}
    assert table["hour"].notna().all()
    assert spark.read.parquet(str(out)).count() == 3
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # browsing left the dead letters in place
    assert channel.queue_declare("work.dlq", passive=True).method.message_count == 6


def test_dlq_replay_acks_only_what_it_replayed(spark, leveret_broker, channel):
    _dead_letters(channel)
    url = leveret_broker.amqp_url
    result = dlq_replay(spark, url, "work.dlq",
                        where="reason = 'rejected' AND headers['tenant'] = 'a'",
                        group="replayer")
    assert (result.leased, result.replayed, result.released) == (6, 2, 4)
    back = drain(channel, "work")
    assert sorted(body for _, _, body in back) == [b"w0", b"w2"]
    for _, props, _ in back:
        assert props.headers["x-replayed-from"] == "work.dlq"
        assert props.headers["tenant"] == "a"
        assert props.headers["x-original-message-id"] in ("w0", "w2")
        assert props.content_type == "text/plain"
    with Client(url) as client:
        assert client.rpc("lease.info", {"queue": "work.dlq", "group": "replayer"})["held"] == 0
        assert client.queue_exists("work.dlq").message_count == 4
    # everything else can be replayed too; an explicit target overrides x-death
    channel.queue_declare("elsewhere")
    result = dlq_replay(spark, url, "work.dlq", routing_key="elsewhere", group="replayer")
    assert (result.replayed, result.released) == (4, 0)
    assert len(drain(channel, "elsewhere")) == 4
    assert channel.queue_declare("work.dlq", passive=True).method.message_count == 0


def test_dlq_replay_keeps_the_death_history(spark, leveret_broker, channel):
    _dead_letters(channel)
    url = leveret_broker.amqp_url
    where = "reason = 'rejected' AND headers['tenant'] = 'a'"
    assert dlq_replay(spark, url, "work.dlq", where=where, group="replayer").replayed == 2
    bodies = []
    for _ in range(2):
        method, props, body = channel.basic_get("work")
        bodies.append(body)
        (death,) = props.headers["x-death"]
        assert {k: death[k] for k in ("reason", "queue", "exchange", "routing-keys", "count")} \
            == {"reason": "rejected", "queue": "work", "exchange": "",
                "routing-keys": ["work"], "count": 1}
        assert isinstance(death["time"], dt.datetime)
        assert props.headers["x-first-death-queue"] == "work"
        # it dies again: the broker adds to the history it kept
        channel.basic_reject(method.delivery_tag, requeue=False)
    assert sorted(bodies) == [b"w0", b"w2"]
    # replayed again: x-replayed-from and x-original-message-id are set, not duplicated
    assert dlq_replay(spark, url, "work.dlq", where=where, group="replayer").replayed == 2
    again = drain(channel, "work")
    assert sorted(body for _, _, body in again) == [b"w0", b"w2"]
    for _, props, body in again:
        (death,) = props.headers["x-death"]
        assert (death["reason"], death["queue"], death["count"]) == ("rejected", "work", 2)
        assert props.headers["x-original-message-id"] == body.decode()
        assert props.headers["x-replayed-from"] == "work.dlq"


def test_archive_copies_a_stream_by_date_incrementally(spark, leveret_broker, channel,
                                                       tmp_path):
    channel.queue_declare("audit", durable=True, arguments={"x-queue-type": "stream"})
    days = [dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC),
            dt.datetime(2024, 5, 2, 12, tzinfo=dt.UTC)]

    def publish(n, start):
        for i in range(start, start + n):
            channel.basic_publish("", "audit", f"a{i}".encode(), pika.BasicProperties(
                timestamp=int(days[i % 2].timestamp())))

    publish(10, 0)
    url, out, ck = leveret_broker.amqp_url, str(tmp_path / "archive"), str(tmp_path / "ck")
    assert archive(spark, url, "audit", out, ck) == 10
    publish(4, 10)
    assert archive(spark, url, "audit", out, ck) == 4
    df = spark.read.parquet(out)
    assert sorted((str(r.date), r.n) for r in df.groupBy("date").count()
                  .withColumnRenamed("count", "n").collect()) == \
        [("2024-05-01", 7), ("2024-05-02", 7)]
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(14))
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()
                  if p.name.startswith("date=")) == ["date=2024-05-01", "date=2024-05-02"]


def test_cli_dlq_report(leveret_broker, channel, tmp_path):
    _dead_letters(channel)
    chart = tmp_path / "c.png"
    proc = subprocess.run(
        [sys.executable, "-m", "leveret", "pipeline", "dlq-report", "work.dlq",
         "--url", leveret_broker.amqp_url, "--master", "local[1]", "--header", "tenant",
         "--chart", str(chart), "--output", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 dead letter(s)" in proc.stdout
    assert "rejected" in proc.stdout and "expired" in proc.stdout
    assert chart.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "leveret", "pipeline", "dlq-replay", "no.such.dlq",
         "--url", leveret_broker.amqp_url, "--master", "local[1]"],
        capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1 and "no.such.dlq" in proc.stderr
