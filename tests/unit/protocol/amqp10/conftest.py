"""Fixtures of the AMQP 1.0 adapter's unit tests: one fake loop, the broker's clock too."""

import pytest
from amqp10_sans_io import Client
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def core(loop: FakeLoop) -> BrokerCore:
    return BrokerCore(loop)


@pytest.fixture
def client(core: BrokerCore, loop: FakeLoop) -> Client:
    return Client(core, loop)
