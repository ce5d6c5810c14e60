"""The benchmark lab: the harnesses that only structspec's developers run, kept in the repository and out of the
wheel. Each is ``python -m lab.NAME`` from the repository root (``--help`` for its options): ``maskbench``
(compile and first masks against xgrammar and llguidance), ``batchfill`` (a batch's masks on 1 and 2 threads
against xgrammar's batch fill), ``coverage`` (JSONSchemaBench), ``vllmbench`` (against
vLLM's CPU build, from ``.venv-vllm``), ``gpucheck`` (a pass on a lent GPU), ``prefix_reuse``, ``contention``,
``barecalls`` and ``bench_sampling``. The benchmarks a user runs stay commands of the package (``structspec
bench``, ``compare``, ``throughput``, ``toolbench``, ``pass-cost``, ``calibrate``).

The lab reads structspec as a user's code would: its public API and the commands' shared pieces
(`structspec.tools`, `structspec.testing`), plus the internals a harness measures by name, each said where it
is read (the automaton's NFA and regex sizes in `coverage_worker`, the learned region shapes in
`maskbench_engines`, the packed pass in `gpucheck`). The package never imports the lab (an import contract).
"""
