"""The pytest-rabbitmq fixtures: pytest-rabbitmq 5 on a RabbitMQ node against leveret's.

Runs the cleanup test file of tests/integration/test_rabbitmq_fixture.py (one test
leaves exchanges, queues, bindings and a message behind, six others check they are
gone; AMQP only, so the file is right for both) in a pytest subprocess:

* ``rabbitmq``: pytest-rabbitmq's own fixtures, starting rabbitmq-server (3.10 here)
  and calling rabbitmqctl twice per test for its cleanup;
* ``leveret``: the same file with ``--leveret-rabbitmq`` (in-process broker).

Prints, per side: the outcome line, wall seconds and CPU seconds (user + system of
the pytest process and the children it waited for, from getrusage). The RabbitMQ side
is skipped when pytest-rabbitmq or rabbitmq-server is not installed. Bounded: about a
minute for RabbitMQ, seconds for leveret.

    python3 bench/rabbitmq_fixture_probe.py [--only leveret|rabbitmq]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from test_rabbitmq_fixture import CLEANUP_TESTS  # noqa: E402


def run(side: str) -> tuple[str, float, float]:
    """Run the cleanup file on one side; (last output line, wall s, CPU s)."""
    with tempfile.TemporaryDirectory(prefix=f"fixture-probe-{side}-") as tmp:
        Path(tmp, "test_cleanup.py").write_text(CLEANUP_TESTS)
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_cleanup.py"]
        if side == "leveret":
            args += ["--leveret-rabbitmq", "-p", "no:pytest_rabbitmq"]
        else:
            args += ["--basetemp", str(Path(tmp, "base"))]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
        )
        env.pop("LEVERET_RABBITMQ", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stdout.strip().splitlines()
    return (lines[-1] if lines else done.stderr.strip()[-300:]), wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["leveret", "rabbitmq"])
    options = parser.parse_args()
    sides = [options.only] if options.only else ["rabbitmq", "leveret"]
    for side in sides:
        if side == "rabbitmq" and (
            importlib.util.find_spec("pytest_rabbitmq") is None
            or not shutil.which("rabbitmq-server", path="/usr/lib/rabbitmq/bin")
        ):
            print(f"{side:8}  skipped: pytest-rabbitmq or /usr/lib/rabbitmq/bin/rabbitmq-server missing")
            continue
        outcome, wall, cpu = run(side)
        print(f"{side:8}  {outcome}  wall {wall:.1f} s  cpu {cpu:.1f} s")


if __name__ == "__main__":
    main()
