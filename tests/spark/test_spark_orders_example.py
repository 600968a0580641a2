"""examples/spark_orders.py end to end, on the suite's SparkSession (quick settings)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pika
import pytest

pytestmark = pytest.mark.timeout(240)

EXAMPLE = Path(__file__).parents[2] / "examples" / "spark_orders.py"


def _example():
    spec = importlib.util.spec_from_file_location("spark_orders", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_orders"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_orders_pipeline_enriches_retries_dead_letters_reports_and_replays(
        spark, leveret_broker, tmp_path):
    example = _example()
    summary = example.run(spark, leveret_broker.amqp_url, orders=40, out=str(tmp_path),
                          verbose=False)
    invalid = sum(1 for i in range(40) if example.order(i)["quantity"] <= 0)
    assert invalid == 4
    assert (summary.published, summary.enriched) == (40, 40)
    assert summary.fulfilled == 36
    assert summary.dead_lettered == invalid
    report = summary.report
    assert set(report["original_queue"]) == {"orders.fulfil"}
    assert set(report["reason"]) == {"delivery_limit"}
    assert report["dead_letters"].sum() == invalid
    assert set(report["region"]) <= {"emea", "amer", "apac"}
    assert (tmp_path / "dlq-report.png").read_bytes()[:4] == b"\x89PNG"
    assert (summary.replayed, summary.in_review) == (invalid, invalid)

    # the enriched orders in review: total and region added
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))
    channel = conn.channel()
    seen = []
    for _ in range(invalid):
        _method, props, body = channel.basic_get("orders.review", auto_ack=True)
        o = json.loads(body)
        seen.append(o["order_id"])
        assert o["quantity"] == -1 and o["total"] == -o["price"]
        assert o["region"] == example.REGIONS[o["country"]]
        assert props.headers["x-replayed-from"] == "DLQ.orders.fulfil"
        assert props.headers["region"] == o["region"]
    assert sorted(seen) == [f"o-{i:05d}" for i in range(40) if i % 10 == 7]
    conn.close()
