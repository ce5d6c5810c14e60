"""The examples and the data the CLI's benchmarks default to, installed as ``structspec.example_data``; read by
`structspec.tools.tasks` and `structspec.tools.benchmarks.toolbench`."""
