"""Crash recovery of streaming queries in their own process (crash_job.py): SIGKILL
mid-batch, then restarts from the checkpoints. A stream read into a deduplicating queue
is exactly once; a queue read through leases is at least once, with nothing lost."""

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

from leveret.amqp.client import BlockingClient as Client

pytestmark = pytest.mark.timeout(600)

JOB = Path(__file__).with_name("crash_job.py")
N = 1000
QUERIES = ["stream:log:copy", "queue:jobs:done"]


def _start(url: str, checkpoints: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with log.open("ab") as out:
        # a session (process group) of its own: the kill takes the JVM and the Python
        # workers with it, as when a machine dies
        return subprocess.Popen([sys.executable, str(JOB), url, str(checkpoints), *QUERIES],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _log_text(log: Path) -> str:
    """The job's first error line and the tail of its log, for a failure message (the
    tail alone is a Java stack trace's end, without the exception)."""
    text = log.read_text() if log.exists() else ""
    first = next((line for line in text.splitlines() if "Exception" in line or "Error" in line), "")
    return f"first error: {first}\n{text[-2500:]}"


def _count(client: Client, queue: str) -> int:
    return client.queue_exists(queue).message_count


def _finish(proc: subprocess.Popen, log: Path) -> int:
    try:
        return proc.wait(180)  # a JVM start is slow on a busy machine
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail(f"the restarted job did not finish: {_log_text(log)}")


def test_sigkill_mid_batch_then_restart_stream_exactly_once_queue_at_least_once(
        leveret_broker, tmp_path):
    url = leveret_broker.amqp_url
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare("copy", durable=True, arguments={"x-message-deduplication": True})
    channel.queue_declare("jobs", durable=True)
    channel.queue_declare("done", durable=True)
    rows = {f"r{i:04d}" for i in range(N)}
    for body in sorted(rows):
        for queue in ("log", "jobs"):
            channel.basic_publish("", queue, body.encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()  # idle from here on: a BlockingConnection would miss its heartbeats
    checkpoints, log = tmp_path / "ck", tmp_path / "job.log"

    with Client(url) as client:
        # 1. run until both queries have written at least a batch, then SIGKILL
        proc = _start(url, checkpoints, log)
        deadline = time.monotonic() + 120  # a JVM start is slow on a busy machine
        while min(_count(client, "copy"), _count(client, "done")) < 250:
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"the job exited {proc.returncode} or wrote too little: {_log_text(log)}")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        written = _count(client, "copy"), _count(client, "done")
        assert max(written) < N, f"killed too late: {written}"
        assert client.rpc("lease.info", {"queue": "jobs", "group": "crash"})["held"] > 0

        # 2. restart from the checkpoints until the queue is empty: the killed run's
        # leases return to it after leaseTtlMs (3 s) unless the restart reads them first.
        # Like a supervisor, restart a run that failed too (Spark now and then fails a
        # task of a replayed batch; the next run replays it again).
        clean_exits = 0
        for _ in range(5):
            clean_exits += _finish(_start(url, checkpoints, log), log) == 0
            info = client.rpc("lease.info", {"queue": "jobs", "group": "crash"})
            if clean_exits and _count(client, "jobs") == 0 and info["held"] == 0:
                break
            time.sleep(3.5)
        assert clean_exits, _log_text(log)
        assert _count(client, "jobs") == 0, _log_text(log)
        assert client.rpc("lease.info", {"queue": "jobs", "group": "crash"})["held"] == 0

    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    copied = Counter(body.decode() for _, _, body in drain(channel, "copy"))
    assert set(copied) == rows
    assert max(copied.values()) == 1  # replayed rows kept their message ids: dropped
    done = Counter(body.decode() for _, _, body in drain(channel, "done"))
    assert set(done) == rows  # nothing lost; a few may be there twice
    conn.close()
