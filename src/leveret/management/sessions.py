"""Login sessions of the web console: a cookie instead of HTTP basic authentication,
with a CSRF token for every change.

``POST /api/leveret/session`` ``{"username", "password"}`` checks the user exactly as
basic authentication does (the login throttle, the audit record of a refusal, the
management tags) and answers ``{"user", "tags", "csrf_token"}`` with the cookie
``leveret_session`` (HttpOnly, SameSite=Strict, path ``/``); ``GET`` gives the same
answer for the session's cookie (the console reloaded), ``DELETE`` logs out. A session
ends after :data:`IDLE_TIMEOUT` seconds without a request (RabbitMQ's
``login_session_timeout``: 8 hours) or at a restart; its user is read anew at each
request, so a deleted user or one without a management tag any more is refused.

A request that the cookie authenticates and that changes something (any method but
GET, HEAD, OPTIONS) must carry the session's token in ``X-CSRF-Token``: else 403
``CSRF token missing or wrong``. A page on another site can make a browser send the
cookie (SameSite stops most such requests already) but cannot read the token. Tools
keep using basic authentication, which needs no token: a browser never adds basic
credentials the console did not send, and the console sends none.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

COOKIE = "leveret_session"
CSRF_HEADER = "X-CSRF-Token"
IDLE_TIMEOUT = 8 * 3600.0  # seconds (RabbitMQ's login_session_timeout: 480 minutes)
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
MAX_SESSIONS = 10_000  # the oldest are dropped past this many


@dataclass
class Session:
    """One logged-in browser: its user's name, CSRF token, last use (monotonic s)."""

    user: str
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """The console's sessions, in memory, by cookie value."""

    def __init__(self, idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        self._sessions: dict[str, Session] = {}

    def create(self, user: str) -> tuple[str, Session]:
        """A new session for ``user``: (cookie value, session)."""
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda key: self._sessions[key].last_used)
            del self._sessions[oldest]
        key = secrets.token_urlsafe(32)
        session = self._sessions[key] = Session(user)
        return key, session

    def find(self, key: str | None) -> Session | None:
        """The live session of cookie value ``key`` (touched), or None."""
        session = self._sessions.get(key) if key else None
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_used > self.idle_timeout:
            del self._sessions[key]  # type: ignore[arg-type]
            return None
        session.last_used = now
        return session

    def end(self, key: str | None) -> None:
        if key:
            self._sessions.pop(key, None)


def csrf_ok(request: web.Request, session: Session) -> bool:
    """Whether a cookie-authenticated ``request`` may go on: a safe method, or the
    session's token in :data:`CSRF_HEADER`."""
    if request.method in SAFE_METHODS:
        return True
    sent = request.headers.get(CSRF_HEADER, "")
    return hmac.compare_digest(sent.encode(), session.csrf_token.encode())


def set_cookie(response: web.StreamResponse, key: str, secure: bool) -> None:
    response.set_cookie(COOKIE, key, httponly=True, samesite="Strict", path="/", secure=secure)
