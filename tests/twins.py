"""Both twins of a hot-path module side by side (docs/compiled.md): the module as the
process imported it (compiled where built) and a private copy imported with
``LEVERET_PURE_PYTHON=1``, so property tests can run the same input through each.

``TWINS`` parametrizes a test over ``leveret.amqp.frames`` and ``leveret.amqp.handoff``
as each twin gives them; the compiled parameter skips, saying why, when
``leveret.amqp._cframes`` is not built or pure Python is forced.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType, SimpleNamespace

import pytest

import leveret.amqp.handoff  # noqa: F401  (and frames): the process's own twins first
from leveret import compiled

#: The pure modules that select a compiled twin at import, in import order.
SELECTING = ("leveret.amqp.frames", "leveret.amqp.handoff")


def pure_copies(names: tuple[str, ...] = SELECTING) -> dict[str, ModuleType]:
    """Fresh imports of ``names`` with the compiled twins switched off; the process's own
    modules (and :func:`leveret.compiled.status`) are left as they were."""
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    status = dict(compiled._loaded)
    previous = os.environ.get(compiled.PURE_PYTHON_ENV)
    os.environ[compiled.PURE_PYTHON_ENV] = "1"
    try:
        return {name: importlib.import_module(name) for name in names}
    finally:
        if previous is None:
            del os.environ[compiled.PURE_PYTHON_ENV]
        else:
            os.environ[compiled.PURE_PYTHON_ENV] = previous
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
        for name, module in saved.items():  # the package attribute the import rebound
            package, _, leaf = name.rpartition(".")
            setattr(sys.modules[package], leaf, module)
        compiled._loaded.clear()
        compiled._loaded.update(status)


_PURE = pure_copies()
PURE = SimpleNamespace(frames=_PURE["leveret.amqp.frames"], handoff=_PURE["leveret.amqp.handoff"])
COMPILED_MODULE = compiled.twin("leveret.amqp._cframes")
COMPILED = SimpleNamespace(
    frames=sys.modules["leveret.amqp.frames"], handoff=sys.modules["leveret.amqp.handoff"]
)
NOT_BUILT = (
    f"{compiled.PURE_PYTHON_ENV}=1 is set"
    if compiled.pure_python_forced()
    else "leveret.amqp._cframes is not built (pip install -e . with a C compiler builds it)"
)
#: ``pytest.mark.parametrize("twin", TWINS)``: a namespace with ``frames`` and ``handoff``.
TWINS = [
    pytest.param(PURE, id="pure"),
    pytest.param(
        COMPILED, id="compiled", marks=pytest.mark.skipif(COMPILED_MODULE is None, reason=NOT_BUILT)
    ),
]
#: Skip marker for tests that compare the compiled twin with the pure one.
needs_compiled = pytest.mark.skipif(COMPILED_MODULE is None, reason=NOT_BUILT)


def outcome(fn, *args):
    """``("ok", value)`` or ``("raised", type, str, reply_code)``: what a call gave."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:
        return ("raised", type(exc), str(exc), getattr(exc, "reply_code", None))
