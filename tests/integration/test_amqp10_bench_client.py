"""bench/amqp10_bench.py's clients against a real leveret (bench/brokers.py's launcher):
the proton engine driver and the AMQP 0-9-1 load generator move every message of a
settled and an unsettled, a 100 B and a durable 4 KB cell, and each phase's
figures add up; cell names parse back to their cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import amqp10_bench as bench

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_cell_names_round_trip() -> None:
    cells = bench.all_cells()
    assert len(cells) == 16
    assert [bench.Cell.parse(c.name) for c in cells] == cells
    for bad in ("100B-unsettled-c200", "1KB-settled-c200-durable", "100B-settled-cx-durable"):
        with pytest.raises(ValueError):
            bench.Cell.parse(bad)


def test_every_message_moves_both_protocols() -> None:
    cells = [bench.Cell.parse("100B-settled-c200-transient"), bench.Cell.parse("4KB-unsettled-c200-durable")]
    s = bench.Settings(messages=1500, seconds=20.0, grace=20.0, pause=0.0)
    out = bench.run_broker("leveret", cells, s, ["amqp10", "amqp091"], SRC, None)
    assert out["errors"] == {}
    for protocol in ("amqp10", "amqp091"):
        for cell in cells:
            rows = out["rows"][f"{protocol} {cell.name}"]
            assert rows["publish"]["messages"] == 1500, (protocol, cell.name)
            assert rows["consume"]["messages"] == 1500, (protocol, cell.name)
            for phase in ("publish", "consume"):
                r = rows[phase]
                assert r["rejected"] == 0
                assert r["msg_per_s"] > 0 and r["broker_us_per_msg"] >= 0
                assert r["saturated"] in ("client", "broker", "machine (all cores)", "neither")
