"""One SparkSession for the whole Spark suite (local[2], UI off, few shuffle partitions),
with the ``leveret`` data source registered from the installed package.

Executors are separate Python processes (PYSPARK_PYTHON = this interpreter) that reach
the in-process broker of ``leveret_broker`` over TCP.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pika
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java", allow_module_level=True)


@pytest.fixture(scope="session")
def spark() -> Iterator:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from leveret.spark import register

    session = (SparkSession.builder.master("local[2]").appName("leveret-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stopTimeout", "10s")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def channel(leveret_broker):
    """A pika channel on the suite's broker (``leveret_broker``)."""
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))
    yield conn.channel()
    if conn.is_open:
        conn.close()
