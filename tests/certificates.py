"""Certificates for the TLS tests, made by trustme: a CA, a server certificate for
``localhost``/127.0.0.1 and a client certificate whose subject is :data:`CLIENT_DN`."""

from __future__ import annotations

from pathlib import Path

import trustme

#: The client certificate's subject, as leveret names its user (RFC 4514 order).
CLIENT_DN = "CN=alice,OU=clients,O=example"


def pem_files(directory: Path) -> dict[str, str]:
    """PEM files in ``directory`` made by a new CA: ``ca``, the server's chain
    (``server``) and key (``server_key``), a client's chain-and-key (``client``)."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("alice@example", common_name="alice", organization_name="example",
                           organization_unit_name="clients")
    paths = {name: str(directory / f"{name}.pem") for name in ("ca", "server", "server_key", "client")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.private_key_pem.write_to_path(paths["server_key"])
    server.cert_chain_pems[0].write_to_path(paths["server"])
    client.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    return paths
