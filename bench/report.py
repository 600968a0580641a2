"""What the broker-against-broker benches share around their measurements.

Logging to stderr, formatting figures for tables, the loop that starts one broker, runs
the cases against it and stops it (also on an error or a signal), printing tables and
writing the JSON results. Used by stomp_bench.py, mqtt_bench.py, delayed_bench.py,
mqtt_connections.py and run.py (starting a broker); the measuring itself stays in each bench.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from brokers import Broker, BrokerError


def log(msg: str) -> None:
    """A progress line on stderr (stdout holds the tables)."""
    print(msg, file=sys.stderr, flush=True)


def fmt(v, spec: str = ",.0f") -> str:
    """``v`` formatted with ``spec``, ``-`` for None (a figure the run did not get)."""
    return "-" if v is None else format(v, spec)


def ratio(a, b) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def sigterm(signum, frame) -> None:
    """SIGTERM handler: unwinds like Ctrl-C through ``run_broker``'s finally, so the broker
    is stopped."""
    raise KeyboardInterrupt


def split_names(spec: str) -> list[str]:
    """A comma-separated option (``--cases``, ``--brokers``) as a list, blanks dropped."""
    return [n.strip() for n in spec.split(",") if n.strip()]


def check_names(given: Iterable[str], cases: Iterable[str], brokers: Iterable[str]) -> None:
    """Exit with a usage message on a name that is neither a known case nor a broker."""
    cases, brokers = tuple(cases), tuple(brokers)
    for name in given:
        if name not in (*cases, *brokers):
            raise SystemExit(
                f"unknown case or broker {name!r}: cases {', '.join(cases)}; brokers {', '.join(brokers)}"
            )


def start(name: str, broker: Broker, out: dict) -> float | None:
    """Start ``broker``, logging it; returns ``time.monotonic()`` from just before, or None
    when it failed to start (logged and put in ``out["errors"]["start"]``)."""
    log(f"[{name}] starting ...")
    t = time.monotonic()
    try:
        broker.start()
    except BrokerError as exc:
        log(f"[{name}] failed to start: {exc}")
        out["errors"]["start"] = str(exc)
        return None
    return t


def run_broker(name: str, broker: Broker, protocol: str, body: Callable[[Broker, dict], None]) -> dict:
    """Start ``broker``, log where it listens for ``protocol`` (``"STOMP"``, ``"MQTT"``: its
    ``stomp_port`` / ``mqtt_port``), call ``body(broker, out)``, stop the broker.

    Returns ``out``: ``rows`` (case -> row), ``errors`` (case or ``start`` -> message) and
    ``info`` (pid, idle RSS in MB); a broker that fails to start gets ``errors["start"]``.
    """
    out: dict = {"rows": {}, "errors": {}, "info": {}}
    t = start(name, broker, out)
    if t is None:
        return out
    try:
        port = getattr(broker, f"{protocol.lower()}_port")
        log(
            f"[{name}] ready, {protocol} on {broker.host}:{port} (pid {broker.pid}) "
            f"in {time.monotonic() - t:.1f} s"
        )
        out["info"] = {"pid": broker.pid, "idle_rss_mb": round(broker.rss_bytes() / 2**20, 1)}
        body(broker, out)
    finally:
        log(f"[{name}] stopping")
        broker.stop()
    return out


def run_each(brokers: Iterable[str], run: Callable[[str], dict]) -> dict | None:
    """``{broker: run(broker)}``, one broker after the other; None when interrupted (Ctrl-C,
    or SIGTERM with ``sigterm`` installed: the running broker was stopped on the way out)."""
    results: dict = {}
    try:
        for b in brokers:
            results[b] = run(b)
    except KeyboardInterrupt:
        log("interrupted")
        return None
    return results


def run_cases(
    name: str,
    broker: Broker,
    cases: Iterable[str],
    run: Callable[[str], dict],
    describe: Callable[[str, dict], str],
    out: dict,
    pause: float,
) -> None:
    """Run each case (``run(case)`` returns its row) into ``out["rows"]``, adding the broker's
    RSS after it (``rss_mb``) and logging ``describe(case, row)``; a failed case goes to
    ``out["errors"]`` and the next one runs; a dead broker skips the rest. ``pause``:
    idle seconds after each case."""
    for case in cases:
        if not broker.alive():
            out["errors"][case] = "broker is not running"
            log(f"[{name}] {case}: skipped, the broker died\n{broker.log_tail()}")
            continue
        try:
            row = run(case)
        except Exception as exc:  # keep going with the next case
            out["errors"][case] = f"{type(exc).__name__}: {exc}"
            log(f"[{name}] {case}: FAILED: {type(exc).__name__}: {exc}")
            continue
        row["rss_mb"] = round(broker.rss_bytes() / 2**20, 1)
        out["rows"][case] = row
        log(f"[{name}] {describe(case, row)}")
        time.sleep(pause)


def print_table(title: str, head: list[str], rows: list[list[str]]) -> None:
    """A plain text table on stdout: ``title:``, the first column left-aligned, the others
    right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(f"\n{title}:")
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def print_markdown_table(head: list[str], rows: list[list], title: str | None = None) -> None:
    """A Markdown table on stdout, every column right-aligned; ``title``: a line before it,
    after a blank line."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]

    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"

    if title is not None:
        print(f"\n{title}")
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def print_errors(results: dict) -> None:
    """One line per broker and failed case (or ``start``)."""
    for b, res in results.items():
        for what, err in res.get("errors", {}).items():
            print(f"{b} {what}: ERROR {err}")


def run_meta(**fields) -> dict:
    """The ``meta`` of a results file: time (UTC), host, cores, Python, the given fields,
    PYTHONPATH and the load average."""
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **fields,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "loadavg": os.getloadavg(),
    }


def write_results(path: str, meta: dict, results: dict) -> int:
    """Write ``{"meta": meta, "results": results}`` as JSON to ``path`` (making its folder);
    returns the exit status: 1 if any broker has errors, else 0."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    log(f"results written to {out}")
    return 1 if any(r.get("errors") for r in results.values()) else 0
