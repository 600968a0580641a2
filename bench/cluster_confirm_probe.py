"""Cross-node persistent publishes with confirms, in both directions at once (not a test).

Two nodes n1, n2 of a cluster on a private PostgreSQL; 100 durable queues, queue ``2k``
owned by n1 and ``2k+1`` by n2 (declared through their owner). ``--publishers P``
publishers, publisher ``p`` connected to node ``p % 2``, each publishing persistent
100-byte messages alternately to its queues ``2p`` and ``2p+1`` (one local, one remote)
in batches of 50, at most 200 unconfirmed (bench/cluster_bench.py's ``persistent``
workload without consumers). Prints published and confirmed counts over ``--seconds``:
with 1 publisher only n1 forwards, with 2 or more both nodes forward to each other.

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/cluster_confirm_probe.py [--publishers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import cluster_bench as cb  # noqa: E402
from postgres import PostgresServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    pg = PostgresServer().start()
    cluster = cb.LeveretCluster(2, pg.url).start()
    try:
        names = [f"q{i:03d}" for i in range(cb.QUEUES)]
        asyncio.run(cb._declare(cluster, names, "persistent"))
        now = time.time()
        spec = cb.WorkerSpec(
            endpoints=[(node.host, node.port) for node in cluster.nodes],
            publishers=[(p % 2, [names[2 * p], names[2 * p + 1]]) for p in range(args.publishers)],
            consumers=[], persistent=True, t_start=now + 2, t_end=now + 2 + args.seconds)
        result = asyncio.run(cb.run_worker(spec))
        first, last = result["first"], result["last"]
        print(f"{args.publishers} publishers: at the start {first['published']} published, "
              f"{first['confirmed']} confirmed; {args.seconds:.0f} s later {last['published']} published, "
              f"{last['confirmed']} confirmed, {last['nacked']} nacked; errors {result['errors']}")
    finally:
        cluster.stop()
        pg.close()


if __name__ == "__main__":
    main()
