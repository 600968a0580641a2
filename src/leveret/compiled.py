"""Which hot-path modules run compiled, and the switch that forces pure Python.

Each compiled module is a twin of a pure-Python one: ``leveret/amqp/_cframes.pyx``
gives the same results as the functions of ``leveret/amqp/frames.py`` it replaces
(property tests compare them on any input). ``pip install -e .`` builds the twins with
Cython when a C compiler is there; without one the pure modules are used. Setting the
environment variable ``LEVERET_PURE_PYTHON=1`` forces pure Python (CI runs the suite
both ways).

Usage in a pure module::

    _c = twin("leveret.amqp._cframes")
    if _c is not None:
        FrameReader = _c.FrameReader
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

log = logging.getLogger("leveret.compiled")

#: The environment variable that forces the pure-Python twins ("1", "true", "yes").
PURE_PYTHON_ENV = "LEVERET_PURE_PYTHON"

_loaded: dict[str, bool] = {}  # module name -> whether its compiled twin is in use


def pure_python_forced() -> bool:
    """True if ``LEVERET_PURE_PYTHON`` asks for the pure-Python twins."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes")


def twin(name: str) -> ModuleType | None:
    """The compiled module ``name`` (a dotted name), or None when it is not built or
    :func:`pure_python_forced`. Records the outcome for :func:`status`."""
    module = None
    if not pure_python_forced():
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = None
    _loaded[name] = module is not None
    return module


def status() -> dict[str, bool]:
    """``{module name: compiled twin in use}`` for every twin asked for so far."""
    return dict(_loaded)


def log_status() -> None:
    """One log line saying whether the hot path runs compiled (at server start)."""
    modules = status()
    missing = sorted(name for name, compiled in modules.items() if not compiled)
    if not modules:
        return
    if not missing:
        log.info("hot path compiled: %s", ", ".join(sorted(modules)))
    elif pure_python_forced():
        log.warning("hot path in pure Python: %s=1 is set", PURE_PYTHON_ENV)
    else:
        log.warning(
            "hot path in pure Python for %s: not compiled (pip install -e . with a C compiler builds it)",
            ", ".join(missing),
        )
