"""Messages a framework holds unacknowledged on purpose are not requeued in a loop by
the consumer timeout, with the recipe of docs/amqp.md ("Consumer timeouts"): a policy
``consumer-timeout`` longer than the longest hold on the queues where the framework
holds messages. celery holds ETA/countdown tasks on its task queue; dramatiq holds
delayed messages on its ``.DQ`` queues.

The broker runs on a :class:`~stepped_clock.SteppedClock` with RabbitMQ's default 30
minutes: once the framework holds the message, the test moves the clock 31 minutes on.
Without the recipe the channel is closed (the control case, so the test can tell); with
it nothing happens and the task runs when due (a countdown of about a second, real time).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
import stepped_clock
from eventually import eventually

from leveret.core.policy import Policy
from leveret.server.broker import BlockingBroker

THIRTY_ONE_MINUTES = 31 * 60
A_DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0) as running:  # consumer_timeout: RabbitMQ's 30 minutes
        running.clock = stepped_clock.install(running)
        yield running


def held(broker, queue: str) -> int:
    """How many of ``queue``'s messages are delivered and not yet acknowledged."""
    return broker.call(lambda: broker.core.vhosts["/"].queues[queue].unacked_count)


def timeouts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "past the consumer timeout" in r.getMessage()]


# -- celery --------------------------------------------------------------------------
CELERY_APP = '''
from celery import Celery

app = Celery("cttasks", broker={broker!r}, backend="rpc://")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_serializer="json", result_serializer="json", accept_content=["json"])


@app.task
def add(x, y):
    return x + y
'''


@pytest.fixture
def celery_tasks(broker, tmp_path, monkeypatch):
    """A celery worker (``--pool=solo``, a subprocess) and the task module, imported."""
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//"
    (tmp_path / "cttasks.py").write_text(textwrap.dedent(CELERY_APP.format(broker=url)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "cttasks", "worker", "--pool=solo", "-c", "1",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-n", f"ct{uuid.uuid4().hex[:6]}@%h"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("cttasks", None)
    import cttasks
    yield cttasks
    backend = cttasks.app.backend
    consumer = getattr(backend, "result_consumer", None)
    if consumer is not None and consumer._connection is not None:
        consumer.stop()
        consumer._connection.close()
    cttasks.app.pool.force_close_all()
    cttasks.app.close()
    worker.kill()  # nothing of it is checked any more
    worker.wait()
    log.close()
    sys.modules.pop("cttasks", None)


@pytest.mark.parametrize("recipe", [True, False], ids=["policy", "control"])
def test_celery_eta_task_held_past_the_timeout(broker, celery_tasks, caplog, recipe):
    caplog.set_level(logging.WARNING, logger="leveret.amqp")
    if recipe:  # before celery declares its queue: a policy applies to queues declared after it
        broker.call(broker.core.set_policy,
                    Policy("celery-eta", "^celery$", {"consumer-timeout": A_DAY_MS}, "queues"))
    assert celery_tasks.add.delay(0, 0).get(timeout=20) == 0  # the worker is up
    result = celery_tasks.add.apply_async((2, 3), countdown=1.5)
    eventually(lambda: held(broker, "celery") == 1, 10)  # the worker holds the ETA task
    broker.call(broker.clock.advance, THIRTY_ONE_MINUTES)
    if recipe:
        assert result.get(timeout=15) == 5
        assert timeouts(caplog) == []
        counters = broker.call(lambda: broker.core.vhosts["/"].queues["celery"].counters)
        assert counters.redelivered == 0
    else:  # the hazard the recipe avoids: the worker's channel is closed, the task goes back
        assert eventually(lambda: timeouts(caplog), 5)
        # (celery 5.7's worker stops: "Unrecoverable error: PreconditionFailed(406 ...)")
        ready = lambda: broker.call(lambda: broker.core.vhosts["/"].queues["celery"].message_count)  # noqa: E731
        assert eventually(lambda: ready() == 1, 5)


# -- dramatiq ------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", [True, False], ids=["policy", "control"])
def test_dramatiq_delayed_message_held_in_dq_past_the_timeout(broker, caplog, recipe):
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    caplog.set_level(logging.WARNING, logger="leveret.amqp")
    if recipe:
        broker.call(broker.core.set_policy,
                    Policy("dramatiq-delays", r"\.DQ$", {"consumer-timeout": A_DAY_MS}, "queues"))
    rabbit = RabbitmqBroker(url=f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2F")
    queue = "ct" + uuid.uuid4().hex[:8]
    done: list[int] = []

    @dramatiq.actor(broker=rabbit, queue_name=queue)
    def record(value):
        done.append(value)

    worker = dramatiq.Worker(rabbit, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        record.send_with_options(args=(7,), delay=1500)
        eventually(lambda: held(broker, queue + ".DQ") == 1, 10)
        broker.call(broker.clock.advance, THIRTY_ONE_MINUTES)
        if recipe:
            eventually(lambda: done == [7], 10)
            assert timeouts(caplog) == []
        else:
            assert eventually(lambda: timeouts(caplog), 5)
    finally:
        worker.stop()
        rabbit.close()
