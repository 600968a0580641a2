"""pytest-rabbitmq's fixtures on leveret (``leveret.testing.rabbitmq``), driven the way
pytest-rabbitmq 5's README shows them, in inner pytest runs (pytester).

Checked: the README's uses (``rabbitmq``, ``rabbitmq_proc``, the factories), the
process fixture's attributes, the cleanup of exchanges and queues between tests (and
that a custom teardown replaces it), the opt-in switch in its three spellings, the
pytest-rabbitmq settings (``--rabbitmq-port``, ``rabbitmq_host``...), the subprocess
broker and ``stopped()``, that with pytest-rabbitmq installed and the switch off
its fixtures are the ones in use, and that the framework snippets of docs/testing.md
(celery, dramatiq, FastStream, taskiq) pass as written. bench/rabbitmq_fixture_probe.py runs the cleanup
file below against pytest-rabbitmq on a RabbitMQ node too.
"""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# The inner runs never load pytest-rabbitmq unless a test says so: its fixtures would
# start a RabbitMQ node (20-30 s) and it is not a dependency of leveret.
NO_PYTEST_RABBITMQ = ("-p", "no:pytest_rabbitmq")

README_TESTS = """
import pika


def test_rabbitmq_fixture_available(rabbitmq):
    assert rabbitmq is not None
    assert isinstance(rabbitmq, pika.BlockingConnection)
    channel = rabbitmq.channel()
    assert channel.is_open


def test_process_attributes(rabbitmq_proc):
    assert type(rabbitmq_proc).__module__ == "leveret.testing.rabbitmq.executor"
    assert rabbitmq_proc.host == "127.0.0.1"
    assert isinstance(rabbitmq_proc.port, int) and rabbitmq_proc.port > 0
    assert (rabbitmq_proc.user, rabbitmq_proc.password, rabbitmq_proc.vhost) == ("guest", "guest", "/")
    assert rabbitmq_proc.url == f"amqp://guest:guest@127.0.0.1:{rabbitmq_proc.port}/%2F"
    assert rabbitmq_proc.running()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_proc.url))
    assert connection.is_open
    connection.close()
"""

# Runs in file order: the first test leaves exchanges, queues, bindings and a message
# behind; the next ones find nothing of it. Only AMQP is used (passive declares), so
# the same file passes on pytest-rabbitmq with RabbitMQ (bench/rabbitmq_fixture_probe.py).
CLEANUP_TESTS = """
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

LEFT = [("exchange", "orders"), ("exchange", "events"), ("queue", "work"), ("queue", "scratch")]


def test_leave_things_behind(rabbitmq):
    channel = rabbitmq.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.exchange_declare("events", "fanout")
    channel.queue_declare("work", durable=True)
    channel.queue_declare("scratch")
    channel.queue_bind("work", "orders", "#")
    channel.basic_publish("orders", "a.b", b"left over", pika.BasicProperties(delivery_mode=2))


@pytest.mark.parametrize("kind,name", LEFT)
def test_gone(rabbitmq, kind, name):
    channel = rabbitmq.channel()
    declare = channel.exchange_declare if kind == "exchange" else channel.queue_declare
    with pytest.raises(ChannelClosedByBroker) as closed:
        declare(name, passive=True)
    assert closed.value.reply_code == 404


def test_amq_exchanges_stay(rabbitmq):
    channel = rabbitmq.channel()
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        channel.exchange_declare(name, passive=True)


def test_queue_comes_back_empty(rabbitmq):
    channel = rabbitmq.channel()
    channel.queue_declare("work", durable=True)
    assert channel.basic_get("work", auto_ack=True) == (None, None, None)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_readme_fixtures_with_the_switch(pytester):
    pytester.makepyfile(test_readme=README_TESTS)
    result = pytester.runpytest("--leveret-rabbitmq", *NO_PYTEST_RABBITMQ)
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("spelling", ["flag", "ini", "env", "-p"])
def test_switch_spellings(pytester, monkeypatch, spelling):
    pytester.makepyfile(test_readme=README_TESTS)
    args = list(NO_PYTEST_RABBITMQ)
    monkeypatch.delenv("LEVERET_RABBITMQ", raising=False)
    if spelling == "flag":
        args.append("--leveret-rabbitmq")
    elif spelling == "ini":
        pytester.makeini("[pytest]\nleveret_rabbitmq = true\n")
    elif spelling == "env":
        monkeypatch.setenv("LEVERET_RABBITMQ", "1")
    else:
        args += ["-p", "leveret.testing.rabbitmq.plugin"]
    pytester.runpytest(*args).assert_outcomes(passed=2)


def test_switch_off_defines_no_rabbitmq_fixture(pytester, monkeypatch):
    monkeypatch.delenv("LEVERET_RABBITMQ", raising=False)
    pytester.makeini("[pytest]\nleveret_rabbitmq = false\n")
    pytester.makepyfile(test_readme=README_TESTS)
    result = pytester.runpytest(*NO_PYTEST_RABBITMQ)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*fixture 'rabbitmq' not found*", "*fixture 'rabbitmq_proc' not found*"])


def test_cleanup_between_tests(pytester):
    pytester.makepyfile(test_cleanup=CLEANUP_TESTS)
    result = pytester.runpytest("--leveret-rabbitmq", *NO_PYTEST_RABBITMQ, "-p", "no:randomly")
    result.assert_outcomes(passed=7)


def test_custom_teardown_replaces_the_cleanup(pytester):
    # With a teardown that deletes nothing, the cleanup tests fail: they can fail.
    pytester.makeconftest(
        """
from leveret.testing.rabbitmq import factories

seen = []


def keep_everything(process, connection):
    seen.append((process.port, connection.is_open, sorted(process.list_queues())))


rabbitmq_proc = factories.rabbitmq_proc()
rabbitmq = factories.rabbitmq("rabbitmq_proc", teardown=keep_everything)
"""
    )
    pytester.makepyfile(test_cleanup=CLEANUP_TESTS)
    result = pytester.runpytest(*NO_PYTEST_RABBITMQ)
    result.assert_outcomes(passed=2, failed=5)
    result.stdout.fnmatch_lines(["*test_gone*exchange-orders*", "*test_queue_comes_back_empty*"])


def test_readme_factories_without_the_switch(pytester):
    port = free_port()
    pytester.makepyfile(
        test_factories=f"""
from leveret.testing.rabbitmq import factories

rabbitmq_my_proc = factories.rabbitmq_proc(port=None)
rabbitmq_my = factories.rabbitmq("rabbitmq_my_proc")

rabbitmq_fixed_proc = factories.rabbitmq_proc(port={port}, server="/nowhere", node="ignored")
calls = []


def teardown(process, connection):
    calls.append((process.port, connection.is_open))


rabbitmq_fixed = factories.rabbitmq("rabbitmq_fixed_proc", teardown=teardown)


def test_two_brokers(rabbitmq_my, rabbitmq_my_proc, rabbitmq_fixed, rabbitmq_fixed_proc):
    assert rabbitmq_fixed_proc.port == {port}
    assert rabbitmq_my_proc.port != {port}
    rabbitmq_my.channel().queue_declare("only-on-my")
    assert rabbitmq_my_proc.list_queues() == ["only-on-my"]
    assert rabbitmq_fixed_proc.list_queues() == []


def test_teardown_was_called():
    assert calls == [({port}, True)]


def test_plain_names_not_defined(request):
    assert "rabbitmq" not in request.fixturenames
"""
    )
    result = pytester.runpytest(*NO_PYTEST_RABBITMQ)
    result.assert_outcomes(passed=3)


def test_port_from_a_range(pytester):
    port = free_port()
    pytester.makepyfile(
        test_range=f"""
from leveret.testing.rabbitmq import factories

ranged_proc = factories.rabbitmq_proc(port=[({port}, {port}), {{{port}}}])


def test_range(ranged_proc):
    assert ranged_proc.port == {port}
"""
    )
    pytester.runpytest(*NO_PYTEST_RABBITMQ).assert_outcomes(passed=1)


SETTINGS_TEST = """
def test_settings(rabbitmq_proc):
    assert (rabbitmq_proc.host, rabbitmq_proc.port) == ("127.0.0.1", {port})
"""


@pytest.mark.parametrize("where", ["command line", "ini"])
@pytest.mark.parametrize("pytest_rabbitmq", ["absent", "loaded"])
def test_pytest_rabbitmq_settings_are_read(pytester, where, pytest_rabbitmq):
    if pytest_rabbitmq == "loaded":
        pytest.importorskip("pytest_rabbitmq")
    port = free_port()
    pytester.makepyfile(test_settings=SETTINGS_TEST.format(port=port))
    args = ["--leveret-rabbitmq", "--strict-config"]
    ini = "[pytest]\nrabbitmq_host = 127.0.0.1\nrabbitmq_ctl = /nowhere\nrabbitmq_node = ignored\n"
    if where == "ini":
        ini += f"rabbitmq_port = {port}\n"
    else:
        args.append(f"--rabbitmq-port={port}")
    pytester.makeini(ini)
    if pytest_rabbitmq == "absent":
        args += NO_PYTEST_RABBITMQ
    pytester.runpytest(*args).assert_outcomes(passed=1)


def test_pytest_rabbitmq_not_shadowed_when_switched_off(pytester, monkeypatch):
    pytest.importorskip("pytest_rabbitmq")
    monkeypatch.delenv("LEVERET_RABBITMQ", raising=False)
    pytester.makepyfile(test_readme=README_TESTS)
    listing = pytester.runpytest("--fixtures", "-v")
    assert listing.ret == 0
    text = listing.stdout.str()
    owner = {}
    section = None
    for line in text.splitlines():
        if "fixtures defined from" in line:
            section = line.split("fixtures defined from", 1)[1].strip(" -")
        elif line.startswith(("rabbitmq ", "rabbitmq_proc ")):
            owner[line.split()[0]] = section
    assert owner == {
        "rabbitmq": "pytest_rabbitmq.factories.client",
        "rabbitmq_proc": "pytest_rabbitmq.factories.process",
    }
    # Switched on, leveret's win over pytest-rabbitmq's (no RabbitMQ node is started).
    pytester.runpytest("--leveret-rabbitmq").assert_outcomes(passed=2)


def test_in_process_stopped_keeps_the_port(pytester):
    pytester.makepyfile(
        test_stopped="""
import pika
import pytest
from pika.exceptions import AMQPConnectionError


def test_stopped(rabbitmq_proc):
    port = rabbitmq_proc.port
    with rabbitmq_proc.stopped():
        assert not rabbitmq_proc.running()
        with pytest.raises(AMQPConnectionError):
            pika.BlockingConnection(pika.URLParameters(rabbitmq_proc.url))
    assert rabbitmq_proc.running() and rabbitmq_proc.port == port
    pika.BlockingConnection(pika.URLParameters(rabbitmq_proc.url)).close()
"""
    )
    pytester.runpytest("--leveret-rabbitmq", *NO_PYTEST_RABBITMQ).assert_outcomes(passed=1)


def test_cleanup_skips_an_exclusive_queue_of_another_connection(pytester, caplog, monkeypatch):
    # pytest-rabbitmq's teardown fails there (405 RESOURCE_LOCKED closes its only
    # channel); leveret's logs it, opens a channel and deletes the rest.
    # The logger is watched directly: a framework test earlier in the session may have
    # configured logging (celery's worker does), disabling or detaching existing loggers.
    logger = logging.getLogger("leveret.testing.rabbitmq")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    pytester.makepyfile(
        test_exclusive="""
import pika

kept = []


def test_exclusive_elsewhere(rabbitmq_proc, rabbitmq):
    other = pika.BlockingConnection(pika.URLParameters(rabbitmq_proc.url))
    kept.append(other)
    other.channel().queue_declare("mine", exclusive=True)
    rabbitmq.channel().queue_declare("shared")


def test_only_the_exclusive_queue_is_left(rabbitmq_proc, rabbitmq):
    assert rabbitmq_proc.list_queues() == ["mine"]
    kept[0].close()
"""
    )
    result = pytester.runpytest("--leveret-rabbitmq", *NO_PYTEST_RABBITMQ)
    result.assert_outcomes(passed=2)
    # a set: the record may reach caplog's handler both here and through the root logger
    warnings = list({r.getMessage() for r in caplog.records if r.name == "leveret.testing.rabbitmq"})
    assert len(warnings) == 1 and "could not delete queue 'mine'" in warnings[0] and "405" in warnings[0]


def test_in_process_data_dir_keeps_durable_queues(pytester):
    pytester.makepyfile(
        test_data_dir="""
import pika
from leveret.testing.rabbitmq import factories

kept_proc = factories.rabbitmq_proc(data_dir=True)
kept = factories.rabbitmq("kept_proc")


def test_restart(kept_proc, kept):
    channel = kept.channel()
    channel.queue_declare("durable", durable=True)
    channel.queue_declare("transient")
    channel.confirm_delivery()
    channel.basic_publish("", "durable", b"kept", pika.BasicProperties(delivery_mode=2))
    with kept_proc.stopped():
        pass
    assert kept_proc.list_queues() == ["durable"]
    connection = pika.BlockingConnection(pika.URLParameters(kept_proc.url))
    assert connection.channel().basic_get("durable", auto_ack=True)[2] == b"kept"
    connection.close()
"""
    )
    pytester.runpytest(*NO_PYTEST_RABBITMQ).assert_outcomes(passed=1)


def test_subprocess_broker(pytester):
    pytester.makeconftest(
        """
from leveret.testing.rabbitmq import factories

rabbitmq_proc = factories.rabbitmq_proc(subprocess=True)
rabbitmq = factories.rabbitmq("rabbitmq_proc")
"""
    )
    pytester.makepyfile(
        test_subprocess="""
import pika


def test_durable_queue_survives_a_restart(rabbitmq_proc, rabbitmq):
    assert type(rabbitmq_proc).__name__ == "SubprocessLeveret"
    channel = rabbitmq.channel()
    channel.queue_declare("keep", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "keep", b"kept", pika.BasicProperties(delivery_mode=2))
    assert rabbitmq_proc.list_queues() == ["keep"]
    with rabbitmq_proc.stopped():
        assert not rabbitmq_proc.running()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_proc.url))
    assert connection.channel().basic_get("keep", auto_ack=True)[2] == b"kept"
    connection.close()


def test_cleaned(rabbitmq_proc, rabbitmq):
    assert rabbitmq_proc.list_queues() == []
"""
    )
    pytester.runpytest(*NO_PYTEST_RABBITMQ).assert_outcomes(passed=2)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def doc_snippets() -> dict[str, str]:
    """The python blocks of docs/testing.md whose first line names a file
    (``# conftest.py``, ``# test_celery.py``), by file name."""
    blocks = re.findall(r"```python\n# ((?:conftest|test_\w+)\.py)\n(.*?)```", DOCS.read_text(), re.S)
    return dict(blocks)


@pytest.mark.parametrize(
    "snippet,module",
    [
        ("test_publish.py", "pika"),
        ("test_rabbitmq.py", "pika"),
        ("test_celery.py", "celery"),
        ("test_dramatiq.py", "dramatiq"),
        ("test_faststream.py", "faststream"),
        ("test_taskiq.py", "taskiq_aio_pika"),
    ],
)
def test_docs_snippets_run(pytester, snippet, module):
    pytest.importorskip(module)
    snippets = doc_snippets()
    files = [*{"test_celery.py": ["conftest.py"]}.get(snippet, []), snippet]
    for name in files:
        # a basename of its own: the suite has its own test_dramatiq.py etc. imported
        written = name.replace("test_", "test_docs_snippet_", 1)
        pytester.path.joinpath(written).write_text(snippets[name])
    result = pytester.runpytest("--leveret-rabbitmq", *NO_PYTEST_RABBITMQ)
    result.assert_outcomes(passed=1)
