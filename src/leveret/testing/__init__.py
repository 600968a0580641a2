"""Test helpers for projects that use leveret as their test broker.

:mod:`leveret.testing.rabbitmq` is a drop-in for pytest-rabbitmq's fixtures
(``rabbitmq_proc``, ``rabbitmq`` and their factories), backed by leveret; see
docs/testing.md.
"""
