"""The engine benchmark's vLLM side: an engine started and stopped in this process, its steps, drafts and accepted
tokens counted at its scheduler (`count_steps`), the records sent to it as token ids (`Request`) and decoded in
calls of B (`run_vllm`), and the prefix job's records on one engine (`prefix_run`). Imports vLLM inside the
functions that need it."""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.vllmbench_records import (Item, Verdict, judge_calls, score, valid_json, vllm_calls,
                                                           vllm_tool_schema)
from lab.vllmbench_report import Tally

PROPOSER_MODULE, PROPOSER_CLASS = "structspec.integrations.vllm_proposer", "GrammarProposer"


@dataclass
class StepCounts:
    """What an engine's scheduler saw, counted as vLLM's own spec-decoding stats count it."""

    engine_steps: int = 0  # steps that ran the model
    request_steps: int = 0  # (request, step) pairs: the steps each request took part in, summed
    drafted: int = 0  # draft tokens scheduled for verification (grammar-invalid ones excluded)
    accepted: int = 0
    per_request: dict[str, int] = field(default_factory=dict)  # request id → its steps


def observe(counts: StepCounts, scheduler_output: Any, model_output: Any, sampled_per_step: int) -> None:
    """Count one step's ``scheduler_output`` and ``model_output`` (vLLM's ``SchedulerOutput`` and
    ``ModelRunnerOutput``) into ``counts``: as ``Scheduler.update_from_output`` counts drafts and accepted
    tokens. Changes ``counts``."""
    scheduled = scheduler_output.num_scheduled_tokens
    if not scheduler_output.total_num_scheduled_tokens:
        return
    counts.engine_steps += 1
    refused = scheduler_output.num_invalid_spec_tokens or {}  # drafts the grammar refused (async scheduling)
    for request_id in scheduled:
        counts.request_steps += 1
        counts.per_request[request_id] = counts.per_request.get(request_id, 0) + 1
        drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id)
        index = model_output.req_id_to_index.get(request_id)
        sampled = model_output.sampled_token_ids[index] if index is not None and model_output.sampled_token_ids \
            else []
        if drafts and sampled:
            counts.drafted += len(drafts) - refused.get(request_id, 0)
            counts.accepted += max(len(sampled) - sampled_per_step, 0)


def count_steps(llm: Any) -> StepCounts:
    """Counts that every later step of ``llm`` (a ``vllm.LLM`` whose engine core runs in this process) adds to.
    Wraps its scheduler's ``update_from_output`` (an instance attribute: the class is unchanged)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("vllmbench counts steps in the engine core, which runs apart: set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts")
    scheduler = core.scheduler
    counts = StepCounts()
    update = scheduler.update_from_output

    def counted(scheduler_output: Any, model_output: Any) -> Any:
        observe(counts, scheduler_output, model_output, scheduler.num_sampled_tokens_per_step)
        return update(scheduler_output, model_output)

    scheduler.update_from_output = counted
    return counts


def proposer(llm: Any) -> Any:
    """The engine's structspec proposer (its ``stats`` count the forced text drafted), None where it has none."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    drafter = getattr(runner, "drafter", None)
    return drafter if type(drafter).__module__ == PROPOSER_MODULE else None


def proposer_config(k: int) -> dict[str, Any] | None:
    """structspec's proposer as vLLM's ``speculative_config`` (drafting up to ``k`` tokens), as a user writes it
    (tools do not import the integrations: vLLM loads the class by its path); None where `PROPOSER_MODULE` is
    not installed. Imports nothing of it."""
    if importlib.util.find_spec(PROPOSER_MODULE) is None:
        return None
    return {"method": "custom_class", "model": f"{PROPOSER_MODULE}.{PROPOSER_CLASS}", "num_speculative_tokens": k}


def start_engine(model_dir: str, dtype: str, backend: str, args: argparse.Namespace,
                 speculative_config: dict[str, Any] | None, prefix_caching: bool = True) -> Any:
    """A ``vllm.LLM`` over ``model_dir`` in this process: ``backend`` for structured outputs, greedy-ready,
    eager, ``--max-model-len``. Registers structspec's backend first, through vLLM's plugin loader (vLLM checks
    the name before it loads its plugins in this process)."""
    from vllm import LLM

    if backend == "structspec":
        from structspec.jobs.vllm import register_backend

        register_backend()
    return LLM(model_dir, dtype=dtype, enforce_eager=True, max_model_len=args.max_model_len, seed=0,
               enable_prefix_caching=prefix_caching, speculative_config=speculative_config,
               structured_outputs_config={"backend": backend, "disable_any_whitespace": args.compact})


def stop_engine(llm: Any) -> None:
    """Shut ``llm``'s engine core down and collect it, so its memory is back before the next engine starts."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@dataclass(frozen=True)
class Request:
    """One record as vLLM gets it: the prompt's token ids, the structured-output keywords (None:
    unconstrained) and how its text is judged."""

    id: str
    prompt_ids: list[int]
    structured: dict[str, Any] | None
    judge: Callable[[str], Verdict]


def vllm_request(item: Item, prompt_ids: list[int]) -> Request:
    """``item`` as vLLM gets it (imports vLLM for a tool call's schema)."""
    if item.conversation is None:
        schema = item.schema
        return Request(item.id, prompt_ids, {"json": schema}, lambda text: (valid_json(text, schema), None))
    conversation = item.conversation
    tool_schema = vllm_tool_schema(conversation)
    return Request(item.id, prompt_ids, None if tool_schema is None else {"json": tool_schema},
                   lambda text: judge_calls(conversation, vllm_calls(conversation, text, tool_schema)))


def output_tokens(output: Any) -> int:
    """A vLLM output's tokens without the EOS that ended it (the own loop does not count it either): vLLM keeps
    EOS in ``token_ids`` and says it stopped there by ``finish_reason="stop"`` with no ``stop_reason``."""
    return len(output.token_ids) - (output.finish_reason == "stop" and output.stop_reason is None
                                    and len(output.token_ids) > 0)


def run_vllm(llm: Any, counts: StepCounts, requests: list[Request], batch_size: int, max_new_tokens: int,
             fresh: bool = True) -> Tally:
    """Decode ``requests`` greedily, ``batch_size`` per ``llm.generate`` call, one call after another; their
    tally. ``fresh``: reset vLLM's prefix cache first, so only this run's own prompts are reused (structspec's
    proposer's stats, where it drafts, are reset at every run)."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    params = [SamplingParams(temperature=0, max_tokens=max_new_tokens, structured_outputs=None
                             if r.structured is None else StructuredOutputsParams(**r.structured)) for r in requests]
    if fresh:
        llm.reset_prefix_cache()
    drafter = proposer(llm)
    if drafter is not None:
        drafter.reset_stats()
    before = StepCounts(counts.engine_steps, counts.request_steps, counts.drafted, counts.accepted)
    tally = Tally()
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(requests), batch_size):
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests[i:i + batch_size]]
        outputs += llm.generate(prompts, params[i:i + batch_size], use_tqdm=False)
    tally.seconds = time.perf_counter() - start
    tally.records = len(requests)
    tally.output_tokens = sum(output_tokens(o.outputs[0]) for o in outputs)
    tally.cached_prompt_tokens = sum(o.num_cached_tokens or 0 for o in outputs)
    if drafter is not None:  # structspec's proposer: the forced text it drafted
        tally.forced = drafter.stats.forced_drafted
    for r, o in zip(requests, outputs):
        out = o.outputs[0]
        valid, expected = r.judge(out.text)
        if out.finish_reason != "stop":  # cut by the budget: not valid, whatever the text so far reads as
            valid, expected = False, expected and False
        score(tally, r.id, (valid, expected), out.finish_reason, len(out.token_ids), out.text)
        tally.digests.append(hashlib.sha1(repr(list(out.token_ids)).encode()).hexdigest()[:16])
    tally.steps = counts.request_steps - before.request_steps
    tally.engine_steps = counts.engine_steps - before.engine_steps
    tally.drafted = counts.drafted - before.drafted
    tally.accepted = counts.accepted - before.accepted
    return tally


def warm_up(llm: Any, requests: list[Request]) -> None:
    """Two tokens of each distinct structured request, so grammars compile before the clock runs."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    seen: dict[str, Request] = {}
    for r in requests:
        seen.setdefault(json.dumps(r.structured, sort_keys=True), r)
    llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in seen.values()],
                 [SamplingParams(temperature=0, max_tokens=2, structured_outputs=None if r.structured is None
                                 else StructuredOutputsParams(**r.structured)) for r in seen.values()],
                 use_tqdm=False)


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of chat ``messages`` through ``tokenizer``'s template, as `LM.encode_prompt` makes them."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prefix_run(args: argparse.Namespace, job: dict[str, Any], caching: bool) -> Tally:
    """The prefix job's records through vLLM + xgrammar, one after another, prefix caching on or off: their
    tally (``cached_prompt_tokens``: what vLLM's cache supplied). Starts an engine and stops it."""
    from lab.prefix_reuse import job_prompts

    schema, prompts = job_prompts()
    llm = start_engine(job["model_dir"], job["dtype"], "xgrammar", args, None, prefix_caching=caching)
    counts = count_steps(llm)
    tokenizer = llm.get_tokenizer()
    requests = [Request(f"record {i}", chat_ids(tokenizer, p), {"json": schema},
                        lambda text: (valid_json(text, schema), None)) for i, p in enumerate(prompts)]
    warm = chat_ids(tokenizer, [{"role": "user", "content": "warm-up"}])  # compiles the grammar, caches no job text
    warm_up(llm, [Request("warm-up", warm, {"json": schema}, lambda text: (True, None))])
    tally = run_vllm(llm, counts, requests, 1, args.max_new_tokens)
    tally.prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    stop_engine(llm)
    return tally
