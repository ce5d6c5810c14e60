"""structspec against vLLM's CPU build, one model and the same prompts: the engine benchmark.

    python -m lab.vllmbench [--records N] [--batch-size 32] [--tasks both] [--configs NAME,...]
    python -m lab.vllmbench --prefix-job

Run it from vLLM's venv (``.ci/vllm-check`` builds ``.venv-vllm``), alone on the machine. The configurations
(`CONFIGS`, in table order; each ratio is against the first one run): vLLM + xgrammar, vLLM + xgrammar + n-gram
speculation, vLLM + the structspec backend, vLLM + structspec + its proposer (where
``structspec.integrations.vllm_proposer`` is installed), and structspec's own loop. On the extraction tasks
(``examples/tasks.jsonl``) and the tool-call set (``examples/toolcalls.jsonl``), each prints seconds per record
at B = 1 (a call per record, one after another), records/s at B = ``--batch-size`` (one call per batch), engine
steps per output token, the forced share, draft acceptance and the share of outputs that validate.

Every prompt is the own loop's token ids (the chat template, with the tools for a tool call), sent to vLLM as
they are; greedy. A tool call goes to vLLM as ``vllm serve`` sends it: ``tool_choice="required"`` and a named
function constrained by the JSON Schema vLLM builds for them (`get_json_schema_from_tools`), ``auto``
unconstrained and parsed as Qwen's template writes calls; the own loop decodes its `structspec.ToolCalls`.
Each configuration runs in a worker process of its own (`Worker`), all alive at once, their runs interleaved
record by record (`interleaved`), so a slow spell of a shared host falls on each alike. vLLM's steps
are counted exactly: its engine core runs in the worker's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its
scheduler's ``update_from_output`` is wrapped (`count_steps`); the own loop's come from its `Stats`.

``--prefix-job`` runs issue 53's peer instead: the extraction job of
`lab.prefix_reuse.job_prompts` through vLLM + xgrammar at B = 1, with vLLM's automatic prefix
caching on, then off (an engine each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from lab.vllmbench_engine import (PROPOSER_MODULE, count_steps, prefix_run, proposer_config,
                                                          run_vllm, start_engine, stop_engine, vllm_request, warm_up)
from lab.vllmbench_records import Item, own_tally, task_items
from lab.vllmbench_report import NOTES, Tally, add, markdown, seconds_per_record, share, speedup
from structspec.tools.command import DEFAULT_MAX_NEW_TOKENS, positive

JOB_MAX_NEW_TOKENS = 300  # the prefix job's budget, as `lab.prefix_reuse` runs it


@dataclass(frozen=True)
class Config:
    """One compared configuration: a vLLM engine (its structured-output backend and speculation) or, with
    ``backend`` None, structspec's own loop."""

    label: str
    backend: str | None = None
    speculation: str | None = None  # "ngram" or "proposer" (structspec's, `PROPOSER_MODULE`)


CONFIGS = {
    "xgrammar": Config("vLLM + xgrammar", "xgrammar"),
    "xgrammar-ngram": Config("vLLM + xgrammar + ngram", "xgrammar", "ngram"),
    "structspec": Config("vLLM + structspec", "structspec"),
    "structspec-proposer": Config("vLLM + structspec + proposer", "structspec", "proposer"),
    "own": Config("structspec own loop"),
}
TASK_SETS = ("extraction", "toolcalls")


def config_names(text: str) -> list[str]:
    """A ``--configs`` value: comma-separated names of `CONFIGS`, in the order given (argparse's ``type``)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if unknown := [name for name in names if name not in CONFIGS]:
        raise argparse.ArgumentTypeError(f"unknown configuration {', '.join(unknown)}; choose among "
                                         f"{', '.join(CONFIGS)}, comma-separated")
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"name each configuration once, comma-separated, got {text!r}")
    return names


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options; a bad one exits 2 naming it, before anything loads."""
    parser = argparse.ArgumentParser(prog="python -m lab.vllmbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a shipped model name or a model directory")
    parser.add_argument("--records", type=positive, metavar="N",
                        help="N records of each task set (extraction: the first, its schemas in turn; tool calls: "
                             "spread over the file, so each choice is in; default all)")
    parser.add_argument("--batch-size", type=positive, default=32, metavar="B",
                        help="records per call in the batched run (default 32)")
    parser.add_argument("--tasks", choices=[*TASK_SETS, "both"], default="both")
    parser.add_argument("--configs", type=config_names, default=list(CONFIGS), metavar="NAME,...",
                        help=f"the configurations, in table order (default all: {','.join(CONFIGS)})")
    parser.add_argument("--max-new-tokens", type=positive, metavar="N",
                        help=f"output tokens per record (default {DEFAULT_MAX_NEW_TOKENS}; --prefix-job: "
                             f"{JOB_MAX_NEW_TOKENS}, as prefix_reuse's job)")
    parser.add_argument("--draft-tokens", type=positive, default=5, metavar="K",
                        help="vLLM's num_speculative_tokens for n-gram and the proposer (default 5)")
    parser.add_argument("--compact", action="store_true",
                        help="vLLM's disable_any_whitespace=True (the own loop's layout) instead of its default")
    parser.add_argument("--max-model-len", type=positive, default=2048, metavar="N")
    parser.add_argument("--preload", choices=["auto", "none"], default="auto",
                        help="auto: vLLM's engines get the LD_PRELOAD vLLM's CPU guide asks for (tcmalloc where "
                             "installed, the venv's libiomp5); none: the environment's as it is")
    parser.add_argument("--save", metavar="FILE",
                        help="also write every tally (with each output's token-id digest) to FILE as JSON, to "
                             "compare outputs across runs")
    parser.add_argument("--prefix-job", action="store_true",
                        help="issue 53's peer instead: prefix_reuse.job_prompts() on vLLM + xgrammar at B = 1, "
                             "prefix caching on, then off")
    # a worker process's options (`Worker`): one configuration, its job file and the pipe it answers on
    for option in ("--worker", "--job", "--reply-fd"):
        parser.add_argument(option, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a worker process is started with
    if args.prefix_job and (args.records or args.tasks != "both" or args.configs != list(CONFIGS)):
        parser.error("--prefix-job runs its own job: drop --records, --tasks and --configs")
    if args.max_new_tokens is None:
        args.max_new_tokens = JOB_MAX_NEW_TOKENS if args.prefix_job else DEFAULT_MAX_NEW_TOKENS
    return args


def speculative(config: Config, k: int) -> dict[str, Any] | None:
    if config.speculation == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": k, "prompt_lookup_min": 2}
    if config.speculation == "proposer":
        return proposer_config(k)
    return None


def machine() -> str:
    """The CPU's model name and core count, from /proc/cpuinfo where there is one."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def load_average() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def header(args: argparse.Namespace, dtype: str, model_dir: str) -> str:
    """The run's date, command, machine, dtype and versions, and the load average now."""
    import torch
    import vllm

    waits = ", ".join(f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LD_PRELOAD")
                      if k in os.environ) or "none set"
    return "\n".join([
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "command: " + shlex.join([os.path.basename(sys.executable), "-m", "lab.vllmbench",
                                  *sys.argv[1:]]),
        f"machine: {machine()}",
        f"model: {args.model} ({model_dir}), dtype {dtype} (structspec.load's default here; vLLM gets it too)",
        f"vLLM {vllm.__version__}, torch {torch.__version__}, python {platform.python_version()}; OpenMP: {waits}; "
        f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')}, max_model_len={args.max_model_len}, "
        f"enforce_eager, greedy, max_new_tokens={args.max_new_tokens}, JSON layout in vLLM: "
        + ("compact (disable_any_whitespace)" if args.compact else "any whitespace (vLLM's default)"),
        "LD_PRELOAD of vLLM's engines: " + ((vllm_preload(dict(os.environ)) or "none found") if args.preload == "auto"
                                           else os.environ.get("LD_PRELOAD", "none")),
        f"load average before: {load_average()}",
    ])


def prepare_environment() -> None:
    """vLLM's settings for this benchmark, before vLLM is imported (its worker processes inherit them): the
    engine core in the worker's process (its steps are counted there), a 1 GiB KV cache unless set, vLLM's log
    on stderr (stdout is the report). Changes ``os.environ``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def vllm_preload(environ: dict[str, str]) -> str:
    """The ``LD_PRELOAD`` vLLM's CPU build asks for (its warning "libtcmalloc / libiomp is not found in
    LD_PRELOAD"): tcmalloc where the system has it, this venv's Intel OpenMP where it has one, then ``environ``'s
    own. Changes nothing."""
    import ctypes.util

    found = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc"),
             next((p for p in [os.path.join(sys.prefix, "lib", "libiomp5.so")] if os.path.exists(p)), None),
             environ.get("LD_PRELOAD")]
    return ":".join(p for p in found if p)


SETTLE_SECONDS = 0.3
"""The pause before each call to a worker: longer than an idle engine's OpenMP threads spin (Intel OpenMP's
200 ms block time), so the last worker's threads are asleep before the next one's step starts."""


class Worker:
    """One configuration's worker process (`worker`), alive until `stop`: vLLM's engine (or the own loop's model)
    in a process of its own, since vLLM 0.32 fails to start an engine in a process that started one with n-gram
    speculation (numba's import leaves a module its kernel scan cannot read) and an engine binds the process's
    OpenMP threads. Its calls come as JSON lines on its stdin, its replies as JSON lines on a pipe of their own
    (vLLM logs on its stdout and stderr). ``started``: its first reply (the engine's start, or a prefix job's
    tally)."""

    def __init__(self, name: str, args: argparse.Namespace, job: dict[str, Any]) -> None:
        import subprocess
        import tempfile

        self.name = name
        self._folder = tempfile.TemporaryDirectory(prefix="vllmbench-")
        job_file = os.path.join(self._folder.name, "job.json")
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump(job, f)
        env = dict(os.environ)
        if name != "own" and args.preload == "auto":
            env["LD_PRELOAD"] = vllm_preload(env)
        read, write = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "lab.vllmbench", *args.argv, "--worker", name, "--job", job_file,
             "--reply-fd", str(write)], stdin=subprocess.PIPE, text=True, env=env, pass_fds=(write,))
        os.close(write)
        self._replies = os.fdopen(read, encoding="utf-8")
        self.started: dict[str, Any] = self._reply()

    def _reply(self) -> dict[str, Any]:
        line = self._replies.readline()
        if not line:  # (the process ended without answering)
            raise RuntimeError(f"the {self.name} worker failed (exit code {self._process.wait()}; its log is above "
                               "on stderr)")
        return json.loads(line)

    def run(self, task_set: str, records: list[int], batch_size: int, fresh: bool) -> Tally:
        """The tally of ``records`` (indices into ``task_set``) decoded ``batch_size`` per call; ``fresh``:
        empty the prefix caches first."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"set": task_set, "records": records, "batch_size": batch_size,
                                              "fresh": fresh}) + "\n")
        self._process.stdin.flush()
        return Tally(**self._reply())

    def memory(self) -> int:
        """The bytes its process holds (resident set, from Linux's /proc; 0 where that cannot be read)."""
        return proc_bytes(f"/proc/{self._process.pid}/status", "VmRSS:") or 0

    def stop(self) -> None:
        """Close its stdin (it stops its engine and exits) and wait for it."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        code = self._process.wait()
        self._replies.close()
        self._folder.cleanup()
        if code != 0:
            raise RuntimeError(f"the {self.name} worker failed (exit code {code}; its log is above on stderr)")


def worker(args: argparse.Namespace) -> int:
    """A worker process's run (`Worker`): one configuration, started, then each call on stdin answered on
    ``--reply-fd`` until stdin ends; a prefix-job engine answers its one tally."""
    with open(args.job, encoding="utf-8") as f:
        job = json.load(f)
    replies = os.fdopen(int(args.reply_fd), "w", encoding="utf-8")

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    if args.worker in ("prefix-on", "prefix-off"):
        reply({"tally": asdict(prefix_run(args, job, args.worker == "prefix-on"))})
        return 0
    sets = {name: task_items(name, args.records) for name in job["sets"]}
    if args.worker == "own":
        import structspec

        lm = structspec.load(args.model)
        for items in sets.values():
            warm_own(lm, items)
        reply({})
        for line in sys.stdin:
            call = json.loads(line)
            items = [sets[call["set"]][i] for i in call["records"]]
            reply(asdict(run_own(lm, items, call["batch_size"], args.max_new_tokens, call["fresh"])))
        return 0
    config = CONFIGS[args.worker]
    spec = speculative(config, args.draft_tokens)
    start = time.perf_counter()
    llm = start_engine(job["model_dir"], job["dtype"], config.backend, args, spec)
    counts = count_steps(llm)
    requests = {name: [vllm_request(item, job["prompt_ids"][name][item.id]) for item in items]
                for name, items in sets.items()}
    for chosen in requests.values():
        warm_up(llm, chosen)
    reply({"startup": time.perf_counter() - start, "speculative_config": spec})
    for line in sys.stdin:
        call = json.loads(line)
        chosen = [requests[call["set"]][i] for i in call["records"]]
        reply(asdict(run_vllm(llm, counts, chosen, call["batch_size"], args.max_new_tokens, call["fresh"])))
    stop_engine(llm)
    return 0


def interleaved(workers: dict[str, Worker], sets: dict[str, list[Item]], batch_size: int
                ) -> dict[str, dict[str, tuple[Tally, Tally]]]:
    """Every worker's tallies at B = 1 and at ``batch_size`` on each task set, their calls interleaved so that a
    slow spell of a shared host falls on every configuration alike: at B = 1 record by record, the workers in
    turn, in the opposite order on every other record; the batched run twice, in opposite orders, its seconds
    the mean of the two (its counts, identical under greedy decoding, the first run's)."""
    names = list(workers)
    results: dict[str, dict[str, tuple[Tally, Tally]]] = {}
    for set_name, items in sets.items():
        one = {name: Tally() for name in names}
        for i in range(len(items)):
            for name in names if i % 2 == 0 else names[::-1]:
                time.sleep(SETTLE_SECONDS)
                add(one[name], workers[name].run(set_name, [i], 1, fresh=i == 0))
        many: dict[str, list[Tally]] = {name: [] for name in names}
        for order in (names, names[::-1]):
            for name in order:
                time.sleep(SETTLE_SECONDS)
                many[name].append(workers[name].run(set_name, list(range(len(items))), batch_size, fresh=True))
        for name in names:
            first = many[name][0]
            first.seconds = sum(t.seconds for t in many[name]) / len(many[name])
            results.setdefault(set_name, {})[name] = (one[name], first)
    return results


def prompt_job(model: str, records: int | None, set_names: list[str]) -> dict[str, Any]:
    """What every worker gets: the model's directory and default dtype, and each record's prompt token ids (the
    own loop's: `chat_prompt_ids`). Loads the model."""
    import structspec
    from structspec.events import chat_prompt_ids
    from structspec.models.shipped import model_path

    lm = structspec.load(model)
    sets = {name: task_items(name, records) for name in set_names}
    return {"dtype": str(lm.dtype).removeprefix("torch."), "model_dir": model_path(model), "sets": set_names,
            "prompt_ids": {name: {item.id: chat_prompt_ids(lm, item.messages,
                                                           item.conversation and item.spec.chat_tools())
                                  for item in items} for name, items in sets.items()}}


def check_memory(workers: dict[str, Worker], still: int) -> None:
    """Stop the run (`SystemExit` naming the fix) where the ``still`` workers to start would not fit beside
    those up: each as large as the largest one up, against the memory the system has available (Linux's
    /proc; elsewhere nothing is checked). Every worker holds its engine for the whole run."""
    available = memory_available()
    largest = max((w.memory() for w in workers.values()), default=0)
    if still and available is not None and largest * still > available:
        raise SystemExit(f"vllmbench: the {still} configuration(s) still to start need about "
                         f"{largest * still / 2**30:.1f} GiB at once beside the {len(workers)} up "
                         f"({largest / 2**30:.1f} GiB each), and {available / 2**30:.1f} GiB is available: run "
                         "fewer at a time with --configs (each run's ratios are against its first configuration)")


def memory_available() -> int | None:
    """Bytes the system can give without swapping (``MemAvailable``), None where /proc/meminfo does not say."""
    return proc_bytes("/proc/meminfo", "MemAvailable:")


def proc_bytes(path: str, key: str) -> int | None:
    """The kB figure on the line of Linux's ``path`` that starts with ``key``, in bytes; None where there is none."""
    try:
        with open(path, encoding="utf-8") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(key))
    except (OSError, StopIteration, ValueError):
        return None


def engine_benchmark(args: argparse.Namespace) -> int:
    """Every configuration of ``args`` on every task set, each in a worker process of its own (`Worker`), all
    alive at once and their runs interleaved (`interleaved`), as many as the memory holds (`check_memory`);
    prints the header, a line as each worker is up, and the tables."""
    import concurrent.futures
    import multiprocessing

    sets = {name: task_items(name, args.records) for name in TASK_SETS if args.tasks in (name, "both")}
    # (in a process of its own: the model it loads would stay in this one's memory beside every worker's engine)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        job = pool.submit(prompt_job, args.model, args.records, list(sets)).result()
    print(header(args, job["dtype"], job["model_dir"]), flush=True)
    if too_long := [f"{key} ({len(ids)} tokens)" for by_id in job["prompt_ids"].values() for key, ids in by_id.items()
                    if len(ids) + args.max_new_tokens > args.max_model_len]:
        print(f"note: prompt + max_new_tokens exceed max_model_len={args.max_model_len} for {', '.join(too_long)}")
    skipped: dict[str, str] = {}
    workers: dict[str, Worker] = {}
    try:
        for name in args.configs:  # (started one at a time: each engine's start has the machine alone)
            config = CONFIGS[name]
            if config.speculation == "proposer" and proposer_config(args.draft_tokens) is None:
                skipped[config.label] = f"{PROPOSER_MODULE} is not installed here"
                continue
            start = time.perf_counter()
            workers[name] = Worker(name, args, job)
            up = workers[name].started
            engine = (f"engine up in {up['startup']:.0f} s, speculative_config={up['speculative_config']}"
                      if "startup" in up else "model loaded")
            print(f"{config.label}: {engine}, warmed up in {time.perf_counter() - start:.0f} s, "
                  f"{workers[name].memory() / 2**30:.1f} GiB (load {load_average()})", flush=True)
            check_memory(workers, len(args.configs) - len(workers) - len(skipped))
        start = time.perf_counter()
        tallies = interleaved(workers, sets, args.batch_size)
        print(f"the runs, interleaved: {time.perf_counter() - start:.0f} s (load {load_average()})", flush=True)
    finally:
        for running in workers.values():
            running.stop()
    results = {set_name: {CONFIGS[name].label: pair for name, pair in by_name.items()}
               for set_name, by_name in tallies.items()}
    labels = [CONFIGS[name].label for name in args.configs]
    print()
    for set_name, by_label in results.items():
        title = (f"{set_name}: {len(sets[set_name])} records, {args.model}, {job['dtype']}, ratios against "
                 f"{next((label for label in labels if label not in skipped), '–')}")
        print(markdown(title, {label: by_label.get(label, (None, None)) for label in labels}, skipped,
                       args.batch_size), "\n")
    print(NOTES)
    print(f"load average after: {load_average()}")
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump({name: {label: [asdict(t) if t else None for t in pair] for label, pair in by_label.items()}
                       for name, by_label in results.items()}, f, indent=1)
    return 0


def warm_own(lm: Any, items: list[Item]) -> None:
    """Two tokens of each distinct spec of ``items`` through the own loop, so they compile before the clock runs."""
    import structspec

    distinct = {json.dumps(i.conversation.tools if i.conversation else i.schema, sort_keys=True): i for i in items}
    for item in distinct.values():
        structspec.generate_result(lm, item.spec, item.messages, max_new_tokens=2)


def run_own(lm: Any, items: list[Item], batch_size: int, max_new_tokens: int, fresh: bool = True) -> Tally:
    """The own loop over ``items`` with default options: each alone (``batch_size`` 1) or `generate_batch`.
    ``fresh``: clear the held prompt chunks first, so only this run's own prompts are reused."""
    import structspec
    from structspec.models.prefix_cache import clear_prefix_caches

    if fresh:
        clear_prefix_caches()
    start = time.perf_counter()
    if batch_size == 1:
        results = [structspec.generate_result(lm, item.spec, item.messages, max_new_tokens=max_new_tokens)
                   for item in items]
    else:
        results = structspec.generate_batch(lm, [item.spec for item in items], [item.messages for item in items],
                                            batch_size=batch_size, max_new_tokens=max_new_tokens)
    return own_tally(items, results, time.perf_counter() - start)


def prefix_job(args: argparse.Namespace) -> int:
    """Issue 53's peer: `job_prompts`' extraction job through vLLM + xgrammar, the records one after another
    (B = 1), with vLLM's automatic prefix caching on (its default), then off, an engine each in a worker
    process; prints seconds per record and the prompt tokens vLLM took from its cache."""
    import torch

    from structspec.models.device import default_dtype
    from structspec.models.shipped import model_path
    from lab.prefix_reuse import job_prompts

    job = {"dtype": str(default_dtype(torch.device("cpu"))).removeprefix("torch."),
           "model_dir": model_path(args.model), "sets": []}
    print(header(args, job["dtype"], job["model_dir"]), flush=True)
    print(f"job: lab.prefix_reuse.job_prompts(), {len(job_prompts()[1])} records under one "
          "schema, vLLM + xgrammar, one record per call\n", flush=True)
    seconds = {}
    for caching in (True, False):
        prefix = Worker("prefix-on" if caching else "prefix-off", args, job)
        prefix.stop()
        t = Tally(**prefix.started["tally"])
        seconds[caching] = seconds_per_record(t)
        print(f"prefix caching {'on' if caching else 'off'}: {seconds[caching]:.3f} s / record, "
              f"{t.cached_prompt_tokens:,} of {t.prompt_tokens:,} prompt tokens from vLLM's cache, "
              f"{t.output_tokens:,} output tokens, {share(t.steps, t.output_tokens) or 0:.3f} steps / output token, "
              f"valid {t.valid}/{t.records} (load {load_average()})", flush=True)
    print(f"prefix caching on: ×{speedup(seconds[True], seconds[False], True):.2f} against off, per record")
    print(f"load average after: {load_average()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command: the engine benchmark, or ``--prefix-job``; a worker process's run under ``--worker``."""
    args = arguments(argv)
    prepare_environment()
    if args.worker:
        return worker(args)
    return prefix_job(args) if args.prefix_job else engine_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
