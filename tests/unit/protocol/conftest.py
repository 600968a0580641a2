"""Fixtures of the sans-I/O adapters' unit tests (MQTT, AMQP 1.0): one fake loop, the
broker's clock too, and a broker core on it."""

import pytest
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def core(loop: FakeLoop) -> BrokerCore:
    return BrokerCore(loop)
