"""Fixtures of the AMQP 1.0 adapter's unit tests (``loop`` and ``core``: the parent
conftest's), and a client on the adapter."""

import pytest
from amqp10_sans_io import Client
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore


@pytest.fixture
def client(core: BrokerCore, loop: FakeLoop) -> Client:
    return Client(core, loop)
