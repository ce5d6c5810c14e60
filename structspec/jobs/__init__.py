"""Extraction jobs: one spec, many documents, one JSONL line per document.

    structspec extract --schema examples/schemas.py:Invoice --input docs.jsonl --output out.jsonl

A job is resumable and crash-safe: rerunning the same command after Ctrl-C or
``kill -9`` writes each record exactly once. The output keeps a manifest beside
it, locked while a job writes: a second job on the same output, a rerun with
other settings (a token budget may change where no line written would read
otherwise), and an output that is not a job's are refused before anything is
written. ``extract --ray`` runs the same job, with the same lines and resume, on
a Ray cluster; ``extract --engine vllm`` runs it with vLLM decoding, here or (with ``--ray``) on Ray.

Bad input never stops a job: a malformed line, an empty document, a prompt
that fills the model's context, a token budget or context that runs out and a
row that cannot run are each written as that record's error
(`structspec.jobs.lines.ERROR_KINDS`) and counted in the summary. Only
configuration errors (`JobConfigError`: a spec, option, input or output that
cannot be used, a file that cannot be read or written) stop it, before any
record runs.

The modules, each over the ones before it:

* `structspec.jobs.errors`: `JobConfigError`.
* `structspec.jobs.spec`: the spec ``--schema`` names.
* `structspec.jobs.prompts`: the prompt template and one document's prompt.
* `structspec.jobs.records`: input records from JSONL, CSV or a folder of ``.txt`` files.
* `structspec.jobs.lines`: the output line, written and read back; the error kinds.
* `structspec.jobs.manifest`: whose an output is: its manifest and lock.
* `structspec.jobs.output`: resume, lines appended with one write each, the run's summary.
* `structspec.jobs.runner`: the local job loop.
* `structspec.jobs.vllm`: the same job decoded by a ``vllm.LLM`` under structspec's backend (the ``vllm``
  extra; ``extract --engine vllm``).
* `structspec.jobs.ray`: the same job on Ray, and `Extractor` for ``ray.data`` (the ``ray`` extra), its keywords
  checked on the driver by `Extractor.constructor_kwargs`.
* `structspec.jobs.vllm_ray`: the vLLM job on Ray, `VLLMExtractor` holding a ``vllm.LLM`` per actor (both
  extras; ``extract --engine vllm --ray``).

The wing stands on the core (`structspec.api` and below); `structspec.tools` (the CLI) stands on it, and the
core never imports it.
"""
