"""The benchmarks a user runs: structspec measured against its peers (outlines, transformers) and against itself,
as ``structspec bench``, ``compare``, ``toolbench`` and ``throughput`` (each also ``python -m
structspec.tools.benchmarks.NAME``). In the library only the CLI imports this folder; the harnesses only
developers run are the repository's ``lab/``, outside the wheel."""
