"""The compiled core of the automaton (structspec/automaton/_core.c); everything else is in pyproject.toml.

Optional: where it cannot be built (no C compiler), the build warns and the package runs on the Python
automaton, which gives the same answers (docs/concepts/token-index.md).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("structspec.automaton._core", ["structspec/automaton/_core.c"], optional=True)])
