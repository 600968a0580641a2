"""Builds the compiled twins of the hot path (docs/compiled.md): every
``src/leveret/**/_c*.pyx`` becomes one C extension named by its path
(``src/leveret/amqp/_cframes.pyx`` -> ``leveret.amqp._cframes``).

Without Cython or a C compiler the install still succeeds with a warning, and leveret
runs its pure-Python twins (:mod:`leveret.compiled`). Everything else is in pyproject.toml.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = Path(__file__).resolve().parent / "src"

# What a missing or failing compiler raises (setuptools' vendored distutils or the old one).
try:
    from setuptools.errors import CCompilerError, ExecError, PlatformError
except ImportError:  # setuptools < 59
    from distutils.errors import (  # type: ignore[no-redef]
        CCompilerError,
        DistutilsExecError as ExecError,
        DistutilsPlatformError as PlatformError,
    )
COMPILE_FAILURES = (CCompilerError, ExecError, PlatformError, OSError)


def twin_sources() -> list[Path]:
    """The ``.pyx`` twins, relative to the project (setuptools wants relative paths)."""
    return sorted(p.relative_to(SRC.parent) for p in SRC.glob("leveret/**/_c*.pyx"))


def extensions() -> list[Extension]:
    """One extension per twin, named by its dotted path; cythonized when Cython is
    there (it is in [build-system] requires), else none."""
    sources = twin_sources()
    modules = [Extension(".".join(p.relative_to("src").with_suffix("").parts), [str(p)]) for p in sources]
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("warning: Cython is not installed: leveret's pure-Python twins will be used", file=sys.stderr)
        return []
    return cythonize(modules, language_level=3, quiet=True)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when a twin does not compile (no C
    compiler, a broken one): leveret then runs the pure-Python twin."""

    def run(self) -> None:
        self._failed: set[str] = set()
        try:
            super().run()
        except COMPILE_FAILURES as exc:
            self._warn("the compiled twins", exc)
            self.extensions = []  # nothing for an editable install to copy into src/

    def build_extensions(self) -> None:
        super().build_extensions()
        # what did not build is not an output: an editable install would fail copying it
        self.extensions = [ext for ext in self.extensions if ext.name not in self._failed]

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except COMPILE_FAILURES as exc:
            self._warn(ext.name, exc)
            self._failed.add(ext.name)

    @staticmethod
    def _warn(what: str, exc: BaseException) -> None:
        print(
            f"warning: could not compile {what} ({exc}): leveret will use its pure-Python twins",
            file=sys.stderr,
        )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
