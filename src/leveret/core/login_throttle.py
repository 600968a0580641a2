"""Online password guessing slowed down per source address *and* per user name, without
slowing the users who know their password.

What is limited, and how (all times in seconds, on the injected clock):

- **Failures, not logins.** A password is checked as soon as the login arrives. A right
  one is answered at once and leaves every record as it is (so logging in correctly
  now and then resets nothing). A wrong one is answered no earlier than the next free
  slot of two *leaky buckets of failures* (the generic cell rate algorithm): one for
  the source address, one for the user name tried. Each lets a burst of
  :attr:`ThrottleSettings.address_burst` (:attr:`~ThrottleSettings.user_burst`)
  failures through unslowed, then one failure per
  :attr:`~ThrottleSettings.address_interval` (:attr:`~ThrottleSettings.user_interval`);
  a refusal waits for the later of its two slots. Concurrent failures take successive
  slots, so 200 parallel guesses are answered no faster than 200 sequential ones.
- **Unauthenticated connections per address.** At most
  :attr:`~ThrottleSettings.max_unauthenticated` connections from one address may be
  accepted and not yet logged in, counting each refusal that is not yet due as one
  (a guesser who hangs up rather than wait for the refusal keeps its place until the
  refusal would have been sent). Beyond it a new connection is refused at once,
  before its password is read.

The timing difference this leaves (a right password answered at once, a wrong one
possibly later) tells a guesser nothing the answer itself does not: the throttle limits
the *rate* of guesses, it does not hide their outcome. A guesser who stops waiting
for slow refusals still spends a slot of its address's budget and of the user's on
each guess. Nothing is ever locked: a user under attack from elsewhere still logs in
at once with the right password (OWASP's advice against account lockout), and an
address only runs out of connections while it keeps
:attr:`~ThrottleSettings.max_unauthenticated` attempts unanswered.

RabbitMQ has no equivalent. Memory is bounded: at most
:attr:`~ThrottleSettings.max_keys` addresses and as many user names are remembered,
the least recently seen forgotten first (a forgotten key starts with a full burst).
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass

from ..config_table import numbers
from .clock import Clock

IPV6_PREFIX = 64  # bits of an IPv6 address that name one source (a host's usual share)
USER_KEY_LENGTH = 255  # characters of a user name kept as its key (AMQP's shortstr)
REPORT_INTERVAL = 60.0  # seconds between log lines about one address's refused connections


@dataclass(frozen=True, slots=True)
class ThrottleSettings:
    """The throttle's limits (seconds and counts): the config file's
    ``[login_throttle]`` table."""

    address_burst: int = 10  # failures from one address answered without delay
    address_interval: float = 0.5  # seconds between answered failures from one address after that
    user_burst: int = 20  # failures for one user name (from anywhere) answered without delay
    user_interval: float = 1.0  # seconds between answered failures for one user name after that
    max_unauthenticated: int = 1024  # connections per address not yet logged in (refusals due count)
    max_keys: int = 100_000  # addresses, and user names, remembered at most

    @classmethod
    def from_table(cls, table: object) -> ThrottleSettings:
        """The settings of a config file's ``[login_throttle]`` table (ValueError naming
        the key when one is unknown, ill-typed or out of range)."""
        kinds = {name: type(getattr(cls(), name)) for name in cls.__dataclass_fields__}
        settings = cls(**numbers("login_throttle", table, kinds))  # type: ignore[arg-type]
        if settings.address_burst < 0 or settings.user_burst < 0:
            raise ValueError("login_throttle.address_burst and user_burst must be 0 or more")
        if settings.address_interval <= 0 or settings.user_interval <= 0:
            raise ValueError("login_throttle.address_interval and user_interval must be above 0 seconds")
        if settings.max_unauthenticated < 1 or settings.max_keys < 1:
            raise ValueError("login_throttle.max_unauthenticated and max_keys must be 1 or more")
        return settings


def source_of(address: str) -> str:
    """The source an address counts for: an IPv4 address itself (also written as
    IPv4-mapped IPv6), an IPv6 address's /64 network (one host is usually given a whole
    /64, so counting single IPv6 addresses would give it 2**64 budgets), anything
    else (a name, "") as it is."""
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.strip("[]").partition("%")[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))


class _Buckets:
    """Leaky buckets of failures per key (GCRA): ``_tat[key]`` is the time the key's
    bucket is empty again. Least recently used first, at most ``limit`` keys."""

    def __init__(self, limit: int) -> None:
        self._tat: dict[str, float] = {}
        self.limit = limit

    def charge(self, key: str, now: float, burst: int, interval: float) -> float:
        """One more failure for ``key`` at ``now``: the time its answer is due."""
        tat = max(self._tat.pop(key, now), now) + interval
        self._tat[key] = tat  # re-inserted: dict order is least recently used first
        if len(self._tat) > self.limit:
            del self._tat[next(iter(self._tat))]
        return max(now, tat - burst * interval)

    def level(self, key: str, now: float, interval: float) -> float:
        """How many failures ``key``'s bucket holds at ``now`` (0.0 when empty)."""
        return max(0.0, self._tat.get(key, now) - now) / interval

    def __len__(self) -> int:
        return len(self._tat)


class LoginThrottle:
    """Counts failed logins per source address and per user name, and unauthenticated
    connections per address, on ``clock``'s monotonic seconds (a wall-clock step never
    stretches a delay). Addresses are text without the port; IPv6 ones count per /64
    (:func:`source_of`)."""

    def __init__(self, clock: Clock, settings: ThrottleSettings | None = None) -> None:
        self.clock = clock
        self._settings = settings or ThrottleSettings()
        self._addresses = _Buckets(self._settings.max_keys)
        self._users = _Buckets(self._settings.max_keys)
        self._open: dict[str, int] = {}  # address -> connections accepted, not logged in
        self._due: dict[str, deque[float]] = {}  # address -> times its pending refusals are due
        self._reported: dict[str, float] = {}  # address -> when its refusals were last logged

    @property
    def settings(self) -> ThrottleSettings:
        """The limits in force (may be replaced while running; what was counted stays)."""
        return self._settings

    @settings.setter
    def settings(self, settings: ThrottleSettings) -> None:
        self._settings = settings
        self._addresses.limit = self._users.limit = settings.max_keys

    # -- unauthenticated connections -----------------------------------------------------
    def unauthenticated(self, address: str) -> int:
        """Connections from ``address`` not yet logged in, plus its refusals not yet due."""
        address = source_of(address)
        return self._open.get(address, 0) + self._pending(address)

    def connection_opened(self, address: str) -> bool:
        """A connection from ``address`` was accepted. True: it counts as unauthenticated
        until :meth:`connection_settled`; False: ``address`` already has
        ``max_unauthenticated``, refuse it (it is not counted)."""
        address = source_of(address)
        if self.unauthenticated(address) >= self.settings.max_unauthenticated:
            return False
        self._open[address] = self._open.get(address, 0) + 1
        return True

    def connection_settled(self, address: str) -> None:
        """A counted connection from ``address`` logged in, was refused, or closed before
        either: it no longer counts (a refusal counts through :meth:`failed` instead)."""
        address = source_of(address)
        count = self._open.get(address, 0) - 1
        if count > 0:
            self._open[address] = count
        else:
            self._open.pop(address, None)

    def report(self, address: str) -> bool:
        """Whether to log that a connection from ``address`` was refused for the cap: at
        most once per :data:`REPORT_INTERVAL` seconds per address (a flood of refused
        connections must not become a flood of log lines)."""
        address = source_of(address)
        now = self.clock.monotonic()
        last = self._reported.get(address)
        if last is not None and now - last < REPORT_INTERVAL:
            return False
        self._reported.pop(address, None)
        self._reported[address] = now
        if len(self._reported) > self.settings.max_keys:
            del self._reported[next(iter(self._reported))]
        return True

    def may_check(self, address: str, most: int | None = None) -> bool:
        """Whether a login from ``address`` outside a counted connection (an HTTP request)
        may be checked now: its refusals not yet due are fewer than
        ``max_unauthenticated``, and fewer than ``most`` when given (an HTTP port passes
        half its connection cap, so that one guessing address cannot hold all of the
        port's connections with refusals that wait for their slot)."""
        address = source_of(address)
        limit = self.settings.max_unauthenticated
        if most is not None:
            limit = min(limit, most)
        return self._pending(address) < limit

    def room_in(self, address: str) -> float:
        """Seconds until ``address``'s next refusal falls due (0.0 if none is pending):
        when :meth:`may_check` can next become true."""
        address = source_of(address)
        due = self._due.get(address)
        return max(0.0, due[0] - self.clock.monotonic()) if due else 0.0

    def _pending(self, address: str) -> int:
        due = self._due.get(address)
        if due is None:
            return 0
        now = self.clock.monotonic()
        while due and due[0] <= now:
            due.popleft()
        if not due:
            del self._due[address]
        return len(due)

    # -- failures ------------------------------------------------------------------------
    def failed(self, address: str, user: str | None) -> float:
        """A login from ``address`` for ``user`` (None: no name could be read) was
        refused: seconds to wait before answering it (0.0 within both bursts). Until
        then the refusal counts as an unauthenticated connection of ``address``."""
        address = source_of(address)
        now = self.clock.monotonic()
        s = self.settings
        due = self._addresses.charge(address, now, s.address_burst, s.address_interval)
        if user is not None:
            due = max(due, self._users.charge(user[:USER_KEY_LENGTH], now, s.user_burst, s.user_interval))
        if due <= now:
            return 0.0
        pending = self._due.pop(address, None) or deque()
        pending.append(due)
        if len(pending) > 1 and pending[-2] > due:  # (the user's slot came later before)
            pending = deque(sorted(pending))
        self._due[address] = pending  # re-inserted: least recently refused first
        if len(self._due) > s.max_keys:
            del self._due[next(iter(self._due))]
        return due - now

    def failures(self, address: str | None = None, user: str | None = None) -> float:
        """How full ``address``'s (or ``user``'s) bucket of failures is now, in failures
        (burst + 1 or more: its failures are being slowed down)."""
        now = self.clock.monotonic()
        if address is not None:
            return self._addresses.level(source_of(address), now, self.settings.address_interval)
        assert user is not None
        return self._users.level(user[:USER_KEY_LENGTH], now, self.settings.user_interval)

    def throttled(self, address: str) -> bool:
        """Whether a failure from ``address`` would be answered late now."""
        address = source_of(address)
        return self.failures(address) + 1 > self.settings.address_burst
