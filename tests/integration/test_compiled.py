"""The switch between the compiled and the pure-Python twins of the hot path
(leveret.compiled, docs/compiled.md): ``LEVERET_PURE_PYTHON=1`` makes ``twin()`` return
None and the modules keep their pure functions, and the server's start-up log says which
twin runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from servers import ServerProcess

from leveret import compiled

_PROBE = (
    "from leveret import compiled; import leveret.amqp.frames as f, leveret.amqp.handoff as h;"
    "print(compiled.twin('leveret.amqp._cframes'), f.FrameReader.__module__,"
    " h.whole_publish.__module__, compiled.status()['leveret.amqp._cframes'])"
)


def _probe(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != compiled.PURE_PYTHON_ENV}
    done = subprocess.run([sys.executable, "-c", _PROBE], env={**environ, **env}, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_pure_python_switch_makes_twin_none(value):
    assert _probe(LEVERET_PURE_PYTHON=value) == (
        "None leveret.amqp.frames leveret.amqp.handoff False"
    )


def _built() -> bool:
    """Whether the compiled twin imports (this process may have the switch on)."""
    probe = "import importlib.util as u; print(u.find_spec('leveret.amqp._cframes') is not None)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "True"


BUILT = _built()
NOT_BUILT = "leveret.amqp._cframes is not built (pip install -e . with a C compiler builds it)"


@pytest.mark.skipif(not BUILT, reason=NOT_BUILT)
def test_without_the_switch_the_compiled_twin_is_used():
    out = _probe(LEVERET_PURE_PYTHON="0")
    assert out.startswith("<module 'leveret.amqp._cframes'")
    assert out.endswith("leveret.amqp._cframes leveret.amqp._cframes True")


def _start_log(tmp_path, monkeypatch, value: str | None) -> str:
    if value is None:
        monkeypatch.delenv(compiled.PURE_PYTHON_ENV, raising=False)
    else:
        monkeypatch.setenv(compiled.PURE_PYTHON_ENV, value)
    server = ServerProcess(tmp_path / "data")
    try:
        deadline = time.monotonic() + 10
        while "hot path" not in server.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        return server.log_path.read_text()
    finally:
        server.terminate()


def test_server_logs_pure_python_when_forced(tmp_path, monkeypatch):
    log = _start_log(tmp_path, monkeypatch, "1")
    assert "WARNING leveret.compiled: hot path in pure Python: LEVERET_PURE_PYTHON=1 is set" in log


def test_server_logs_which_twin_runs(tmp_path, monkeypatch):
    log = _start_log(tmp_path, monkeypatch, None)
    if BUILT:
        assert "INFO leveret.compiled: hot path compiled: " in log
        assert "leveret.amqp._cframes" in log.split("hot path compiled: ")[1].splitlines()[0]
    else:
        assert "WARNING leveret.compiled: hot path in pure Python for " in log
        assert "not compiled (pip install -e . with a C compiler builds it)" in log



@pytest.mark.skipif(not os.environ.get("LEVERET_REQUIRE_COMPILED") or compiled.pure_python_forced(),
                    reason="LEVERET_REQUIRE_COMPILED is not set (.ci/run sets it), or pure Python is forced")
def test_every_twin_is_built_where_ci_requires_it():
    # setup.py only warns when a twin does not compile: CI, which has a compiler, makes
    # that a failure, so a broken build cannot pass as a second pure-Python run.
    from pathlib import Path

    import leveret
    import leveret.amqp.client  # the client's delivery decoding
    import leveret.server.broker  # every protocol's codecs

    src = Path(leveret.__file__).parent
    twins = sorted(".".join(p.relative_to(src.parent).with_suffix("").parts) for p in src.glob("**/_c*.pyx"))
    assert twins
    # every twin is asked for by its pure module, and imports
    assert {name: compiled.status().get(name) for name in twins} == dict.fromkeys(twins, True)
