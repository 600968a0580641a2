"""AMQP 0-9-1 on the wire: the one codec, shared by the broker and every client in this repo.

A leaf package: it imports nothing of the broker, so the Spark connector, the DLQ tools,
the benchmarks and the tests load only this.

- :mod:`.errors`: reply codes (AMQP 0-9-1 §1.1) and exceptions carrying them;
- :mod:`.frames`: framing (§2.3.5, §4.2.3), a sans-I/O frame reader, method codecs
  (pamqp, with hand-written fast paths for publish/deliver/ack checked against pamqp);
- :mod:`.properties`: the 14 basic content properties (§4.2.6.1) read and checked
  without a full decode;
- :mod:`.field_table`: field tables that keep their wire types, and header splicing;
  plain tables with :class:`~.field_table.Long` values for publishing;
- :mod:`.delivery`: deliveries decoded by hand straight from a receive buffer (checked
  against pamqp);
- :mod:`.client`: the one client, asyncio, with a blocking façade (``BlockingClient``).
"""
