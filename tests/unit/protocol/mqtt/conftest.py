"""Fixtures of the MQTT adapter's unit tests: one fake loop, the broker's clock too."""

import pytest
from sans_io import FakeLoop

from leveret.core.broker import BrokerCore


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def core(loop: FakeLoop) -> BrokerCore:
    return BrokerCore(loop)
