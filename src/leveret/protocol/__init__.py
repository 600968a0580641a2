"""Wire protocols: bytes in, calls on :mod:`leveret.core` out.

Every adapter's connection is an :class:`.adapter.AdapterConnection` given a
:class:`.transport.Transport` and :class:`.transport.Loop` by the server; its life in
the broker (registry, alarms, vhost deletion, limits, advisories, failed logins) is
:mod:`leveret.core.lifecycle`'s.
"""
