"""The ``[http]`` settings and the HTTP ports' share of RLIMIT_NOFILE (server/http_limits.py)."""

from __future__ import annotations

import pytest

from leveret.config import ConfigError, load
from leveret.server.http_limits import HttpLimits


def test_each_http_port_gets_an_even_share_of_the_descriptor_budget():
    limits = HttpLimits()  # 1024 per port, a quarter of the descriptors for all HTTP ports
    assert limits.port_cap(3, nofile=1024) == 85  # 256 // 3: AMQP/STOMP keep 768
    assert limits.port_cap(4, nofile=256) == 16
    assert limits.port_cap(3, nofile=1_048_576) == 1024  # max_connections wins
    assert limits.port_cap(1, nofile=2) == 1  # never 0: the port stays usable
    assert HttpLimits(fd_fraction=0.5, max_connections=100).port_cap(2, nofile=100) == 25


def test_the_http_table_of_a_config_file(tmp_path):
    path = tmp_path / "leveret.toml"
    path.write_text(
        "[http]\nheader_timeout = 5\nkeepalive_timeout = 7.5\nmax_connections = 10\nfd_fraction = 0.1\n"
    )
    assert load(path).http == HttpLimits(5.0, 7.5, 10, 0.1)
    path.write_text("")
    assert load(path).http == HttpLimits()


@pytest.mark.parametrize(
    "table, message",
    [
        ("header_timout = 5", "unknown key http.header_timout"),
        ("max_connections = 1.5", "http.max_connections must be int"),
        ("header_timeout = true", "http.header_timeout must be float"),
        ("header_timeout = 0", "must be above 0 seconds"),
        ("max_connections = 0", "http.max_connections must be 1 or more"),
        ("fd_fraction = 1.5", "http.fd_fraction must be above 0 and at most 1"),
    ],
)
def test_a_bad_http_setting_is_refused_with_its_name(tmp_path, table, message):
    path = tmp_path / "leveret.toml"
    path.write_text(f"[http]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        load(path)
