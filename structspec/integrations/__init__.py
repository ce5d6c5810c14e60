"""structspec where users already are: adapters for pipelines that run their own decode loop.

* `structspec.integrations.transformers`: a ``LogitsProcessor`` and a ``StopWhenComplete``
  stopping criterion for transformers' ``model.generate``.
* `structspec.integrations.matcher`: a ``Matcher`` with the accept / validate / rollback /
  bitmask contract of serving engines (vLLM, SGLang, xgrammar), and how to plug it in.
* `structspec.integrations.vllm`: the ``structspec`` structured-output backend for vLLM 0.32
  (``structured_outputs_config={"backend": "structspec"}``), registered by a ``vllm.general_plugins`` entry point.

The Ray Data ``Extractor`` lives with the jobs it runs, in `structspec.jobs.ray`.

Every adapter drives the core's one cursor (`structspec.decoding.Cursor`); `structspec.integrations.proposal`
is what a proposer keeps of a request between an engine's steps. The core never imports this package; each adapter
imports only the core's public pieces, the names a wing's package exports (an import contract in pyproject.toml).
"""
