"""Connection worker processes (``leveret server --workers N``, docs/multicore.md §6).

- :mod:`.listener`: in the core, accepts AMQP clients and passes each socket to a worker;
  :class:`~.listener.WorkerListener` feeds the worker's frames to a ``RemoteConnection``.
- :mod:`.process`: the worker process (``python -m leveret.server.workers.process``),
  which reads, splits frames, parses publishes, encodes deliveries and writes.
- :mod:`.link`: the records the two send each other, one batch per loop turn.

A worker imports only the wire codecs, never the core.
"""
