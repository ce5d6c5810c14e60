"""The benchmark tools: structspec measured against its peers (outlines, transformers, xgrammar, llguidance,
vLLM) and against itself, each a ``python -m structspec.tools.benchmarks.NAME`` command; ``structspec bench``,
``compare``, ``toolbench`` and ``throughput`` run theirs. In the library only the CLI imports this folder."""
