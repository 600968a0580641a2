"""The AMQP 1.0 modules import whichever comes first, with the compiled twin built
(``_ctransfer`` reads names of ``sections`` as it loads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import leveret
from leveret.compiled import twin

MODULES = ("sections", "message", "frames", "links", "transfer_frames", "connection")


@pytest.mark.skipif(twin("leveret.protocol.amqp10._ctransfer") is None, reason="compiled twin not built")
@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_first(module):
    code = f"import leveret.protocol.amqp10.{module}; from leveret import compiled; print(compiled.status())"
    src = os.path.dirname(os.path.dirname(os.path.abspath(leveret.__file__)))  # this leveret
    env = {**os.environ, "LEVERET_PURE_PYTHON": "", "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'leveret.protocol.amqp10._ctransfer': True" in done.stdout
