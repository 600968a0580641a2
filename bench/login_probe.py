"""Issue 27's login-guessing probe: how many wrong passwords a guesser gets answered per
second, and how long a right password takes from the address being throttled.

Runs an in-process broker (the ``leveret`` found on ``PYTHONPATH``, so the same script
measures an older tree: ``PYTHONPATH=/work/main/src python bench/login_probe.py``) with
its default throttle settings, a fresh broker per attack, over raw AMQP sockets:

- ``sequential``: one guesser, each wrong login after the previous answer;
- ``parallel``: ``--parallel`` guessers (200) from the same address at once;
- ``interleaved``: one guesser that logs in with the right password every fifth try;
- ``hang-up``: 8 guessers that hang up after 20 ms without an answer (silence is
  "wrong" once right passwords are answered at once): the passwords *checked* per
  second (the broker's ``login refused`` log lines) count, not the answers;
- ``legit``: while 20 guessers keep the address throttled, a right password from the
  same address over AMQP (start-ok to tune), STOMP (CONNECT to CONNECTED) and HTTP
  (``GET /api/whoami`` with basic auth), best and worst of 3; then the same while the
  200 parallel guessers run (they may fill the address's unauthenticated places).

Each attack runs ``--seconds`` (default 8). Figures are wall-clock rates: the machine's
load moves them a little, the throttle's intervals much more.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable

from pamqp import commands, frame

from leveret import BlockingBroker

HEADER = b"AMQP\x00\x00\x09\x01"
Guess = Callable[[], tuple[str, float]]  # one login: (outcome, seconds)


def _frame(sock: socket.socket) -> tuple[int, int, int]:
    """(channel, class id, method id) of the next method frame; (-1, 0, 0) if the
    socket closed."""
    data = b""
    while True:
        while len(data) < 7:
            chunk = sock.recv(4096)
            if not chunk:
                return -1, 0, 0
            data += chunk
        frame_type, channel, size = struct.unpack_from(">BHI", data)
        while len(data) < 8 + size:
            chunk = sock.recv(4096)
            if not chunk:
                return -1, 0, 0
            data += chunk
        if frame_type == 1:
            class_id, method_id = struct.unpack_from(">HH", data, 7)
            return channel, class_id, method_id
        data = data[8 + size :]


def amqp_login(
    port: int, password: str, hang_up_after: float | None = None, deadline: float | None = None
) -> tuple[str, float]:
    """("in" | "refused" | "closed" | "gave up", seconds from start-ok to the answer);
    "gave up" after ``hang_up_after`` seconds, or at ``deadline`` (time.monotonic())."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        return "closed", 0.0
    with sock:
        try:
            sock.sendall(HEADER)
            if _frame(sock)[0] < 0:
                return "closed", 0.0
            start_ok = commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response=f"\x00guest\x00{password}", locale="en_US"
            )
            started = time.monotonic()
            sock.sendall(frame.marshal(start_ok, 0))
            wait = 30.0 if deadline is None else max(0.001, deadline - started)
            sock.settimeout(wait if hang_up_after is None else min(wait, hang_up_after))
            _, class_id, method_id = _frame(sock)
        except TimeoutError:
            return "gave up", time.monotonic() - started
        except OSError:
            return "closed", 0.0
        elapsed = time.monotonic() - started
    if (class_id, method_id) == (10, 30):
        return "in", elapsed
    return ("refused" if (class_id, method_id) == (10, 50) else "closed"), elapsed


def stomp_login(port: int) -> tuple[str, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode() or "closed", time.monotonic() - started


def http_login(port: int) -> tuple[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.connect()
        started = time.monotonic()
        auth = base64.b64encode(b"guest:guest").decode()
        connection.request("GET", "/api/whoami", headers={"Authorization": f"Basic {auth}"})
        response = connection.getresponse()
        response.read()
        return str(response.status), time.monotonic() - started
    finally:
        connection.close()


class Refusals(logging.Handler):
    """Counts the broker's ``login refused`` log lines (passwords checked and wrong)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    @property
    def count(self) -> int:
        return len(self.times)

    def emit(self, record: logging.LogRecord) -> None:
        if "login refused" in record.getMessage():
            self.times.append(time.monotonic())

    def rate_after(self, since: float, until: float) -> float:
        """Passwords checked per second between ``since`` and ``until``."""
        return sum(since <= t < until for t in self.times) / (until - since)


def run_guessers(count: int, seconds: float, guess: Callable[[float], Guess]) -> dict[str, int]:
    """``count`` threads calling ``guess(deadline)()`` until ``seconds`` pass (answers
    not come by then are "gave up"); outcomes counted."""
    stop = time.monotonic() + seconds
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def guesser() -> None:
        while time.monotonic() < stop:
            outcome, _ = guess(stop)()
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

    threads = [threading.Thread(target=guesser, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def attack(name: str, count: int, seconds: float, guess: Callable[[int], Guess]) -> None:
    refusals = Refusals()
    logging.getLogger("leveret.amqp").addHandler(refusals)
    with BlockingBroker(amqp_port=0) as broker:
        started = time.monotonic()
        outcomes = run_guessers(count, seconds, lambda deadline: guess(broker.amqp_port, deadline))
        elapsed = time.monotonic() - started
    logging.getLogger("leveret.amqp").removeHandler(refusals)
    answered = outcomes.get("refused", 0)
    steady = refusals.rate_after(started + seconds / 2, started + seconds)
    print(
        f"{name:12} {answered / elapsed:7.1f} refusals/s answered, {refusals.count / elapsed:7.1f} passwords"
        f" checked/s, {steady:5.1f}/s in the second half"
        f"  ({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}; {elapsed:.1f} s)"
    )


def interleaved(seconds: float) -> None:
    refusals = Refusals()
    logging.getLogger("leveret.amqp").addHandler(refusals)
    with BlockingBroker(amqp_port=0) as broker:
        started, tries, logins = time.monotonic(), 0, []
        while time.monotonic() - started < seconds:
            tries += 1
            if tries % 5 == 0:
                _, took = amqp_login(broker.amqp_port, "guest")
                logins.append(took)
            else:
                amqp_login(broker.amqp_port, "wrong")
        elapsed = time.monotonic() - started
    logging.getLogger("leveret.amqp").removeHandler(refusals)
    steady = refusals.rate_after(started + seconds / 2, started + seconds)
    print(
        f"{'interleaved':12} {refusals.count / elapsed:7.1f} guesses/s ({steady:.1f}/s in the second half)"
        " with a right password every fifth try"
        f" (its logins took {min(logins) * 1000:.1f}-{max(logins) * 1000:.1f} ms)"
    )


def legit(seconds: float, guessers: int) -> None:
    with BlockingBroker(amqp_port=0, stomp_port=0, http_port=0) as broker:
        management = broker.broker.management
        assert management is not None
        stomp_port, http_port = broker.broker.stomp_port, management.port
        assert stomp_port is not None and http_port is not None
        attack_thread = threading.Thread(
            target=run_guessers,
            args=(
                guessers,
                seconds,
                lambda deadline: lambda: amqp_login(broker.amqp_port, "wrong", None, deadline),
            ),
            daemon=True,
        )
        attack_thread.start()
        time.sleep(seconds / 2)  # the address is throttled by now
        logins: dict[str, list[tuple[str, float]]] = {"amqp": [], "stomp": [], "http": []}
        for _ in range(3):
            logins["amqp"].append(amqp_login(broker.amqp_port, "guest"))
            logins["stomp"].append(stomp_login(stomp_port))
            logins["http"].append(http_login(http_port))
        attack_thread.join()
    for protocol, results in logins.items():
        times = [took for _, took in results]
        outcomes = sorted({outcome for outcome, _ in results})
        print(
            f"{'legit ' + protocol:12} right password during {guessers} guessers: "
            f"{min(times) * 1000:7.1f} .. {max(times) * 1000:7.1f} ms  ({'/'.join(outcomes)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per attack (default 8)")
    parser.add_argument("--parallel", type=int, default=200, help="parallel guessers (default 200)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    logging.getLogger("leveret").setLevel(logging.WARNING)
    logging.getLogger("leveret").propagate = False
    logging.getLogger("leveret").addHandler(logging.NullHandler())
    seconds = args.seconds
    attack("sequential", 1, seconds, lambda port, end: lambda: amqp_login(port, "wrong", None, end))
    attack("parallel", args.parallel, seconds, lambda port, end: lambda: amqp_login(port, "wrong", None, end))
    interleaved(seconds)
    attack("hang-up", 8, seconds, lambda port, end: lambda: amqp_login(port, "wrong", 0.02, end))
    legit(seconds, 20)
    legit(seconds, args.parallel)


if __name__ == "__main__":
    main()
