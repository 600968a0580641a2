"""Instructions per message on the core's path, counted by valgrind's callgrind: the
same count whatever else the machine does, where CPU time moves by ±30% between runs
of the same tree on a small VM (bench/run.py's µs CPU/msg).

Usage::

    git worktree add /tmp/old <commit>
    python bench/instructions.py --baseline /tmp/old      # this tree beside an older one

Each scenario runs in one process without sockets, on tests/sans_io.py's Harness with
one consumer (prefetch 2000), as bench/remote_path.py does, with each tree's own
harness: ``ack`` is 1000 publishes of 100 B then 10 multiple acks, per round;
``nack`` is 1000 publishes, a nack with requeue of each delivery, then one multiple
ack of the redeliveries. Each is counted at two round counts and the difference
divided by the messages between them, so start-up and imports cancel out. Needs
valgrind (Debian's package); a run takes about a minute per tree and scenario.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH = 1000  # publishes per round (remote_path.BATCH)
ROUNDS = (3, 13)  # the two round counts whose difference is measured


def scenario(name: str, rounds: int) -> None:
    """Run ``name`` for ``rounds`` rounds in this process (under callgrind)."""
    from pamqp import commands
    from remote_path import harness
    from sans_io import method_frame

    from leveret.amqp.frames import encode_publish

    h = harness(False)
    publishes = encode_publish(1, "", "bench", b"x" * 100, {}, 4096) * BATCH
    plan = []  # the frames, made before the counted work repeats
    for k in range(rounds):
        if name == "ack":
            base = BATCH * k
            frames = [method_frame(1, commands.Basic.Ack(delivery_tag=base + i, multiple=True))
                      for i in range(100, BATCH + 1, 100)]
        else:
            base = 2 * BATCH * k
            nack = commands.Basic.Nack
            nacks = b"".join(method_frame(1, nack(delivery_tag=base + i, multiple=False, requeue=True))
                             for i in range(1, BATCH + 1))
            ack = commands.Basic.Ack(delivery_tag=base + 2 * BATCH, multiple=True)
            frames = [nacks, method_frame(1, ack)]
        plan.append(frames)
    connection = h.connection
    for frames in plan:
        connection.data_received(publishes, whole=True)
        for frame in frames:
            connection.data_received(frame, whole=True)
        for pending in list(h.pending):
            pending.flush()
        h.pending.clear()
        h.transport.output.clear()
    assert h.core.vhosts["/"].queues["bench"].message_count == 0


def count(tree: Path, name: str, rounds: int, python: str) -> int:
    """Instructions of one run of ``name`` with the code of ``tree`` (a checkout)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / d) for d in ("src", "bench", "tests")))
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, __file__,
         "--scenario", name, "--rounds", str(rounds)],
        env=env, capture_output=True, text=True, check=True,
    )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"no count from callgrind:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def per_message(tree: Path, name: str, python: str) -> float:
    low, high = (count(tree, name, rounds, python) for rounds in ROUNDS)
    return (high - low) / ((ROUNDS[1] - ROUNDS[0]) * BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout to count beside this one")
    parser.add_argument("--scenarios", default="ack,nack")
    # the interpreter itself, not a shim script (pyenv's), so that callgrind counts Python
    parser.add_argument("--python", default=os.path.realpath(sys.executable))
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scenario:
        if sys.path[0] == str(HERE):  # the tree's own bench/ (on PYTHONPATH), not this one's
            del sys.path[0]
        scenario(args.scenario, args.rounds)
        return
    trees = [("this", HERE.parent)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    for name in args.scenarios.split(","):
        found = {label: per_message(tree, name, args.python) for label, tree in trees}
        line = f"{name:5} " + "  ".join(
            f"{label} {value:,.0f} instructions/msg" for label, value in found.items()
        )
        if "baseline" in found:
            line += f"  (this/baseline {found['this'] / found['baseline']:.4f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
