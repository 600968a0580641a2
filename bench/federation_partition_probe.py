"""How long a federation link takes to notice a network partition (packets dropped, no
RST: nothing tells either peer but AMQP heartbeats), leveret → leveret beside RabbitMQ
3.10 → RabbitMQ 3.10.

An exchange link runs through the fault tests' proxy (tests/tcp_proxy.py); the probe
freezes the link's connection and reports the seconds until ``/api/federation-links``
shows it is not ``running`` any more, and until it runs again on a new connection (the
proxy lets new connections through). Idle waiting, bounded by ``--limit`` seconds.

    PYTHONPATH=src python3 bench/federation_partition_probe.py [--brokers leveret,rabbitmq]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE)]

from federation_sides import LeveretSide, RabbitSide, federate, links  # noqa: E402
from tcp_proxy import CuttableProxy  # noqa: E402


def probe(kind: str, limit: float) -> tuple[float | None, float | None, str | None]:
    """(seconds until the link leaves ``running``, seconds until it runs again, the
    error shown); None where ``limit`` passed first."""
    workdir = Path(tempfile.mkdtemp(prefix="partition-"))
    if kind == "leveret":
        up, down = LeveretSide(workdir / "up").start(), LeveretSide(workdir / "down").start()
    else:
        up, down = RabbitSide("up"), RabbitSide("down")
    proxy = CuttableProxy(up.amqp_port)
    try:
        for side in (up, down):
            connection = side.target.amqp()
            connection.channel().exchange_declare("part.x", "direct", durable=True)
            connection.close()
        federate(
            down.target, f"amqp://guest:guest@127.0.0.1:{proxy.port}", "^part\\.x$", **{"reconnect-delay": 1}
        )

        def state() -> tuple[str | None, str | None]:
            rows = links(down.target)
            return (rows[0].get("status"), rows[0].get("error")) if rows else (None, None)

        deadline = time.monotonic() + 30
        while state()[0] != "running":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: the link did not start: {state()}")
            time.sleep(0.1)
        time.sleep(1)
        frozen = proxy.freeze()
        began = time.monotonic()
        noticed = back = None
        error = None
        while time.monotonic() - began < limit:
            status, shown = state()
            if noticed is None and status != "running":
                noticed, error = time.monotonic() - began, shown
            if noticed is not None and status == "running":
                back = time.monotonic() - began
                break
            time.sleep(0.25)
        print(
            f"{kind}: {frozen} connection(s) frozen; link left running after "
            f"{'-' if noticed is None else f'{noticed:.1f}'} s ({error!r}), running again after "
            f"{'-' if back is None else f'{back:.1f}'} s",
            flush=True,
        )
        return noticed, back, error
    finally:
        proxy.close()
        up.stop()
        down.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="leveret,rabbitmq")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds to wait at most")
    args = parser.parse_args()
    for kind in args.brokers.split(","):
        probe(kind, args.limit)


if __name__ == "__main__":
    main()
