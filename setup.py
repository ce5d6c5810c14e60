"""The compiled core of the automaton (structspec/automaton/_core.c and the files it names); everything else is in
pyproject.toml.

Optional: where it cannot be built (no C compiler), the build warns and the package runs on the Python
automaton, which gives the same answers (docs/concepts/token-index.md).
"""

from setuptools import Extension, setup

CORE_SOURCES = [f"structspec/automaton/{name}.c"
                for name in ("_core", "_levels", "_walk", "_region", "_classes", "_closure", "_subset")]

CORE_HEADERS = [f"structspec/automaton/{name}.h" for name in ("_core", "_builder")]

setup(ext_modules=[Extension("structspec.automaton._core", CORE_SOURCES, depends=CORE_HEADERS, optional=True)])
