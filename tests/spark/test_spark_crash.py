"""Crash recovery of a streaming query in its own process: SIGKILL mid-batch, restart
from the checkpoint. A stream read into a deduplicating queue is exactly once; a queue
read through leases is at least once, with nothing lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pika
import pytest
from spark_support import drain

from leveret.spark.amqp import Client

pytestmark = pytest.mark.timeout(120)

JOB = Path(__file__).with_name("crash_job.py")
N = 1000


@pytest.fixture
def channel(leveret_broker):
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))
    yield conn.channel()
    if conn.is_open:
        conn.close()


def _start(url: str, kind: str, source: str, target: str, checkpoint: Path,
           log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with log.open("ab") as out:
        # its own session (process group): the kill takes the JVM and workers with it
        return subprocess.Popen([sys.executable, str(JOB), url, kind, source, target,
                                 str(checkpoint)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _count(client: Client, queue: str) -> int:
    return client.queue_exists(queue).message_count


def _kill_mid_run(proc: subprocess.Popen, client: Client, target: str, log: Path) -> int:
    """SIGKILL the job's process group once it has written a batch and a half."""
    deadline = time.monotonic() + 45
    while True:
        count = _count(client, target)
        if count >= 300:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the job wrote {count} row(s) and exited {proc.returncode}: "
                        f"{log.read_text()[-3000:]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return count


def _finish(proc: subprocess.Popen, log: Path) -> None:
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail(f"the restarted job did not finish: {log.read_text()[-3000:]}")
    assert code == 0, log.read_text()[-3000:]


def _publish(channel, queue: str) -> None:
    for i in range(N):
        channel.basic_publish("", queue, f"r{i:04d}".encode(),
                              pika.BasicProperties(delivery_mode=2))


def test_stream_into_a_dedup_queue_is_exactly_once_across_a_sigkill(leveret_broker, channel,
                                                                      tmp_path):
    url = leveret_broker.amqp_url
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare("copy", durable=True, arguments={"x-message-deduplication": True})
    _publish(channel, "log")
    checkpoint, log = tmp_path / "ck", tmp_path / "job.log"
    with Client(url) as client:
        killed_at = _kill_mid_run(_start(url, "stream", "log", "copy", checkpoint, log),
                                  client, "copy", log)
        assert killed_at < N
        assert any((checkpoint / "offsets").iterdir())
        _finish(_start(url, "stream", "log", "copy", checkpoint, log), log)
    bodies = Counter(body.decode() for _, _, body in drain(channel, "copy"))
    assert set(bodies) == {f"r{i:04d}" for i in range(N)}
    assert max(bodies.values()) == 1  # replayed rows kept their ids and were dropped


def test_queue_read_through_leases_is_at_least_once_across_a_sigkill(leveret_broker, channel,
                                                                       tmp_path):
    url = leveret_broker.amqp_url
    channel.queue_declare("jobs", durable=True)
    channel.queue_declare("done", durable=True)
    _publish(channel, "jobs")
    checkpoint, log = tmp_path / "ck", tmp_path / "job.log"
    with Client(url) as client:
        killed_at = _kill_mid_run(_start(url, "queue", "jobs", "done", checkpoint, log),
                                  client, "done", log)
        assert killed_at < N
        # the killed run's leases return to the queue after leaseTtlMs (3 s) if the
        # restart has not read them again by then; run until the queue is empty
        for _ in range(3):
            _finish(_start(url, "queue", "jobs", "done", checkpoint, log), log)
            info = client.rpc("lease.info", {"queue": "jobs", "group": "crash"})
            if _count(client, "jobs") == 0 and info["held"] == 0:
                break
            time.sleep(3.5)
        assert _count(client, "jobs") == 0
        assert client.rpc("lease.info", {"queue": "jobs", "group": "crash"})["held"] == 0
    bodies = Counter(body.decode() for _, _, body in drain(channel, "done"))
    assert set(bodies) == {f"r{i:04d}" for i in range(N)}  # nothing lost
    assert sum(bodies.values()) >= N
