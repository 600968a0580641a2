"""leveret's protocol-neutral core.

The layers (dependencies point down only; nothing here imports a protocol, the server,
sockets or asyncio)::

    server/          event loop, listeners (TCP, TLS, WebSocket), connection workers,
       │             the clock it gives core (server/clock.py)
       │
    protocol/amqp    sans-I/O adapters: AMQP 0-9-1 frames (codec: leveret.amqp) and
    protocol/stomp   STOMP 1.0-1.2 frames ⇄ calls on a core Session;
       │             management/: HTTP ⇄ core
       │
    core/            this package
       │
    store/           durable definitions, messages and jobs: SQLite (embedded, the
                     default) or PostgreSQL (shared by a master and its standbys)

docs/architecture.md draws the whole picture and follows a publish, a delivery, a
page-in and a connection through it.

Where each concept lives in core:

===================  ===============================================================
concept              module
===================  ===============================================================
broker state         :mod:`.broker` (vhosts, users, limits, alarms, the clock)
virtual host         :mod:`.vhost` (declare/delete/bind, routing across exchanges;
                     its queues' host, :mod:`.queues.host`), :mod:`.router`
exchange types       :mod:`.exchange`; topic matching :mod:`.topic`
message container    :mod:`.message` (neutral facts, encoded form, death annotations)
publish path         :mod:`.publish` (route, enqueue, confirm, return, transactions)
queue types          :mod:`.queues` (the interface, classic, quorum, stream, paging,
                     timers; :mod:`.queues.host`: what a queue hands back to its vhost)
dead-lettering       :mod:`.dead_letter` (every death, one path)
redelivery policy    :mod:`.redelivery` (ActiveMQ's back-off)
message selectors    :mod:`.selector` (JMS's SQL subset, as ActiveMQ; values
                     :mod:`.selector_values`, on messages :mod:`.selector_lookup`)
queue arguments      :mod:`.queue_config`, each feature's in :mod:`.queues.features`;
                     policies :mod:`.policy`
deduplication        :mod:`.deduplication`
leases               :mod:`.queues.features.leases`; the broker's API requests :mod:`.api`
users, permissions   :mod:`.auth` (the database), :mod:`.passwords` (RabbitMQ's hashes)
permission checks    :mod:`.access` (one user in one vhost, RabbitMQ's texts)
checked operations   :mod:`.session` (what each protocol calls: declare, bind, ...)
connection life      :mod:`.lifecycle` (open, close, a refused login: every adapter's)
failed logins        :mod:`.login_throttle` (slowed per address and user name)
open connections     :mod:`.connections` (every protocol's, as facts; closing them)
errors               :mod:`.errors` (neutral conditions; adapters map them)
time                 :mod:`.clock` (injected; tests use ManualClock)
durable definitions  :mod:`.definitions` (what is saved), :mod:`.recovery` (at start-up)
===================  ===============================================================
"""

from .broker import BrokerCore, Limits
from .message import Message
from .queues import Queue
from .vhost import VirtualHost

__all__ = ["BrokerCore", "Limits", "Message", "Queue", "VirtualHost"]
