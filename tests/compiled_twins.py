"""The two twins of a hot-path module (:mod:`leveret.compiled`) as pytest parameters: its
pure-Python objects and the compiled module's objects of the same names, the compiled
one skipped, saying why, when it is not built. The compiled module is imported directly,
so both twins are tested under ``LEVERET_PURE_PYTHON=1`` too."""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


def compiled(name: str) -> tuple[ModuleType | None, str]:
    """The compiled module ``name`` (a dotted name) and "", or None and why it is missing."""
    try:
        return importlib.import_module(name), ""
    except ImportError as exc:
        return None, (
            f"{name} is not built ({exc}); pip install -e . with a C compiler builds it "
            f"(or cythonize -i -3 on its .pyx)"
        )


def twin_params(pure: dict[str, Any], name: str) -> list[Any]:
    """``[pure, compiled]`` pytest params, each a namespace of the names in ``pure``
    (name -> pure-Python object); the compiled one takes module ``name``'s objects."""
    params = [pytest.param(SimpleNamespace(**pure), id="pure")]
    module, why = compiled(name)
    if module is None:
        params.append(pytest.param(None, id="compiled", marks=pytest.mark.skip(reason=why)))
    else:
        params.append(pytest.param(SimpleNamespace(**{n: getattr(module, n) for n in pure}), id="compiled"))
    return params
