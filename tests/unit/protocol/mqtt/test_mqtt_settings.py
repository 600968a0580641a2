"""The ``[mqtt]`` table: known keys, right types, and values the wire can carry."""

import pytest

from leveret.protocol.mqtt.settings import mqtt_settings


def test_a_table_sets_the_settings():
    settings = mqtt_settings({"prefetch": 20, "allow_anonymous": False, "port_vhosts": {"1884": "devices"}})
    assert settings.prefetch == 20 and not settings.allow_anonymous
    assert settings.port_vhosts == {1884: "devices"}


@pytest.mark.parametrize(
    "table",
    [
        {"prefetch": 0},
        {"receive_maximum": 65536},
        {"topic_alias_maximum": -1},
        {"max_packet_size": 2**28 + 5},
        {"max_keep_alive": 70000},
        {"allow_anonymous": "yes"},
        {"prefetch": "10"},
        {"no_such_key": 1},
    ],
)
def test_what_cannot_work_is_refused(table):
    with pytest.raises(ValueError):
        mqtt_settings(table)
