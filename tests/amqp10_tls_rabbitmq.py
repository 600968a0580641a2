"""A private RabbitMQ 3.10 node with AMQP 1.0 over TLS (``rabbitmq_amqp1_0`` and
``rabbitmq_auth_mechanism_ssl``), for the tests that compare leveret's AMQPS port with
RabbitMQ's; its other isolation as :class:`brokers.RabbitMQ`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from brokers import RabbitMQ, free_port, rabbitmq_installed


def password_hash(password: str) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class TlsRabbitMQ(RabbitMQ):
    """RabbitMQ with a TLS listener on a free loopback port (``amqps_port``) using
    ``files`` (PEM: ``ca``, ``server``, ``server_key``), ``verify_peer``, the mechanisms
    PLAIN, AMQPLAIN and EXTERNAL (``ssl_cert_login_from = distinguished_name``), the AMQP
    1.0 plugin, and the users ``guest`` and ``users`` (no usable password) with full
    permissions on ``/``, loaded as definitions at boot."""

    def __init__(self, files: dict[str, str], users: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.files = files
        self.users = users
        self.amqps_port = 0

    def prepare(self) -> None:
        super().prepare()
        self.amqps_port = free_port()

    def _env(self) -> dict:
        env = super()._env()
        w = self.workdir
        Path(w, "enabled_plugins").write_text("[rabbitmq_amqp1_0,rabbitmq_auth_mechanism_ssl].\n")
        names = ("guest", *self.users)
        definitions = {
            "users": [
                {
                    "name": name,
                    "password_hash": password_hash("guest" if name == "guest" else os.urandom(8).hex()),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": "administrator" if name == "guest" else "",
                }
                for name in names
            ],
            "vhosts": [{"name": "/"}],
            "permissions": [
                {"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} for name in names
            ],
        }
        Path(w, "definitions.json").write_text(json.dumps(definitions))
        files = self.files
        with open(os.path.join(w, "rabbitmq.conf"), "a") as conf:
            conf.write(
                f"listeners.ssl.1 = 127.0.0.1:{self.amqps_port}\n"
                f"ssl_options.cacertfile = {files['ca']}\n"
                f"ssl_options.certfile = {files['server']}\n"
                f"ssl_options.keyfile = {files['server_key']}\n"
                "ssl_options.verify = verify_peer\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
                "auth_mechanisms.1 = PLAIN\nauth_mechanisms.2 = AMQPLAIN\nauth_mechanisms.3 = EXTERNAL\n"
                "ssl_cert_login_from = distinguished_name\n"
                f"load_definitions = {os.path.join(w, 'definitions.json')}\n"
            )
        return env

    def wait_tls(self, timeout: float = 60.0) -> None:
        """Until the TLS listener completes a handshake."""
        context = ssl.create_default_context(cafile=self.files["ca"])
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("localhost", self.amqps_port), timeout=2) as raw:
                    context.wrap_socket(raw, server_hostname="localhost").close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


__all__ = ["TlsRabbitMQ", "rabbitmq_installed"]
