"""Federation: exchanges and queues that span brokers, as RabbitMQ's
``rabbitmq_federation`` plugin links them (and ActiveMQ's network of brokers, see
docs/federation.md).

:mod:`.upstream` reads and checks the ``federation-upstream`` and
``federation-upstream-set`` runtime parameters (no I/O); :mod:`.links` is what every
link shares (the reconnect loop, its status); :mod:`.exchange_link` and
:mod:`.queue_link` move messages; :mod:`.manager` keeps one link running per upstream
of every exchange and queue a policy federates.
"""
