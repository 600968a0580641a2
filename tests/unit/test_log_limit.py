"""The log rate limit: a burst of one kind passes, the rest is counted and reported."""

from __future__ import annotations

import logging

from leveret.log_limit import RateLimit


def test_a_flood_of_one_kind_costs_a_burst_then_one_summary():
    clock = [0.0]
    limit = RateLimit(burst=3, period=10, now=lambda: clock[0])
    records = [logging.LogRecord("leveret.amqp", logging.INFO, __file__, 1, "connection %s: bad header",
                                 (f"peer{i}",), None) for i in range(100)]
    passed = [r for r in records if limit.filter(r)]
    assert len(passed) == 3
    other = logging.LogRecord("leveret.amqp", logging.INFO, __file__, 1, "another kind", (), None)
    assert limit.filter(other)  # kinds are counted apart
    clock[0] = 10.0
    late = logging.LogRecord("leveret.amqp", logging.INFO, __file__, 1, "connection %s: bad header", ("x",),
                             None)
    assert limit.filter(late) and late.getMessage() == "connection x: bad header (and 97 more like it)"
