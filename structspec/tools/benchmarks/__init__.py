"""The benchmark tools: structspec measured against its peers (outlines, transformers, xgrammar, llguidance,
vLLM) and against itself, each a ``python -m structspec.tools.benchmarks.NAME`` command; ``structspec bench``,
``compare``, ``toolbench`` and ``throughput`` run theirs. Nothing outside this folder imports it except the CLI,
which dispatches to it."""
