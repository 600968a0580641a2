"""The HTTP management API on aiohttp: RabbitMQ 3.10's paths, JSON shapes and status
codes, leveret's own API under ``/api/leveret/`` (dead letters and their jobs, the
audit trail, the console's login) and ``/api/scheduled-jobs``, the web console
(:mod:`.console`) and the Prometheus endpoint (:mod:`.metrics`, its own port).

The API has 113 routes (besides the console's page and static files): 77 GETs, which
read (``/api/aliveness-test/{vhost}`` also declares, publishes to and reads its queue,
as RabbitMQ's does), and 36 PUTs, POSTs and DELETEs, which change state, except the
dead-letter ``preview`` (a count) and the console's session login and logout, which
change no broker state. Route tables: :mod:`.api`, :mod:`.admin`, :mod:`.resources`,
:mod:`.messages`, :mod:`.runtime`, :mod:`.policies`, :mod:`.parameters`,
:mod:`.dead_letters`. docs/management.md describes them.
"""

from .api import ManagementAPI

__all__ = ["ManagementAPI"]
