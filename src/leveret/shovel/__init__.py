"""Shovels: move messages from a queue on one broker to an exchange or queue on
another (leveret or RabbitMQ), with RabbitMQ's dynamic-shovel parameters.

:mod:`.spec` reads and checks a definition (no I/O); :mod:`.worker` runs one shovel on
the event loop (an AMQP client on each side, aiormq); :mod:`.manager` keeps one
running per ``shovel`` runtime parameter of the broker, and per ``[[shovels]]`` table
of the config file.
"""
