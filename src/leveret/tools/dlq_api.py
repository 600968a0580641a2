"""The dead-letter console's actions from the command line (``leveret dlq retry | move |
copy | delete | jobs | cancel | audit``): a client of leveret's HTTP API under
``/api/leveret/`` (see :mod:`leveret.management.dead_letters`), so the console, the API
and the command line do the same things the same way. leveret only: RabbitMQ has no
such API (``leveret dlq replay`` works with both, over AMQP).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from .dlq import DLQError

POLL_INTERVAL = 0.2  # seconds between two looks at a running job


class DeadLetterClient:
    """Requests to the management API at ``http_url`` as ``user``; every failure is a
    :class:`DLQError` with the API's reason."""

    def __init__(self, http_url: str, user: str, password: str) -> None:
        self.base = http_url.rstrip("/")
        self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        """The JSON answer of ``method path`` (``body`` sent as JSON)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data, method=method)
        request.add_header("Authorization", self.authorization)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("reason", exc.reason)
            except (ValueError, AttributeError):
                reason = exc.reason
            raise DLQError(f"{method} {path}: {exc.code} {reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DLQError(f"cannot reach {self.base}: {exc}") from None

    @staticmethod
    def queue_path(vhost: str, queue: str) -> str:
        quoted = urllib.parse.quote(vhost, safe=""), urllib.parse.quote(queue, safe="")
        return f"/api/leveret/dead-letters/{quoted[0]}/{quoted[1]}"

    def preview(self, vhost: str, queue: str, selection: dict) -> int:
        """How many messages ``selection`` (``{"seqs"}`` or ``{"filter"}``) chooses."""
        return int(self.request("POST", self.queue_path(vhost, queue) + "/preview", selection)["matching"])

    def start(self, vhost: str, queue: str, action: str, selection: dict, target: dict | None) -> dict:
        """Start ``action``; the job as the API shows it."""
        body = {"action": action, **selection, **({"target": target} if target else {})}
        return dict(self.request("POST", self.queue_path(vhost, queue) + "/actions", body))

    def job(self, job_id: str) -> dict:
        return dict(self.request("GET", f"/api/leveret/jobs/{urllib.parse.quote(job_id)}"))

    def wait(self, job: dict, progress: Callable[[dict], None] = lambda job: None) -> dict:
        """Follow ``job`` until it ends, calling ``progress`` with each reading."""
        while job["state"] == "running":
            progress(job)
            time.sleep(POLL_INTERVAL)
            job = self.job(job["id"])
        progress(job)
        return job

    def jobs(self) -> list[dict]:
        return list(self.request("GET", "/api/leveret/jobs"))

    def cancel(self, job_id: str) -> dict:
        return dict(self.request("DELETE", f"/api/leveret/jobs/{urllib.parse.quote(job_id)}"))

    def audit(self, limit: int) -> list[dict]:
        return list(self.request("GET", f"/api/leveret/audit?limit={limit}"))


def selection(
    seqs: tuple[int, ...],
    reason: str | None,
    source_queue: str | None,
    headers: tuple[str, ...],
    min_age: float | None,
    max_age: float | None,
    body: str | None,
) -> dict:
    """The API's selection: chosen ``seqs``, else a filter of the options given."""
    if seqs:
        return {"seqs": list(seqs)}
    where: dict[str, Any] = {
        "reason": reason,
        "source_queue": source_queue,
        "header": list(headers) or None,
        "min_age": min_age,
        "max_age": max_age,
        "body": body,
    }
    return {"filter": {k: v for k, v in where.items() if v is not None}}
