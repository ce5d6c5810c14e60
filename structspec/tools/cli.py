"""Command line: ``structspec demo``, ``extract``, ``compare``, ``bench``, ``toolbench``, ``throughput`` and
``pass-cost``.

Parsing imports neither torch nor transformers: a command's options are added only when that command is on the
command line (their defaults and choices live in modules that import torch), and what runs a model is imported
inside the command. So ``structspec --help`` and ``--version`` answer at once, and a bad option, spec or name
exits 2 before any model loads.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structspec

if TYPE_CHECKING:
    from structspec.models.transformers_lm import LM

EXIT_OK, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 2, 130
EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done (also when some records failed: they are in the output with their reason)
  1    an unexpected error (a bug: please report it with the traceback)
  {EXIT_CONFIG}    configuration error (bad option, schema, model or drafter name, unreadable input); nothing ran
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); rerun the same command to resume"""

DESCRIPTION = ("Constrained structured generation for Hugging Face causal LMs, with exact forward-pass "
               "accounting. Start with `structspec demo`, then `structspec extract`; `structspec COMMAND --help` "
               "for a command's options.")
DEFAULT_MAX_NEW_TOKENS = 256  # one token budget for every command, the demo's too


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, where it has one and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _positive(text: str) -> int:
    """An int ≥ 1 (argparse's ``type``: a bad value exits 2 with the option's name before anything runs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def drafter(text: str) -> str:
    """A drafter's name (`structspec.decoding.factory.DRAFT_NAMES` or ``none``), with a did-you-mean for a typo
    (argparse's ``type``)."""
    from structspec.decoding.factory import DRAFT_NAMES

    names = [*DRAFT_NAMES, "none"]
    if text in names:
        return text
    close = difflib.get_close_matches(text, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise argparse.ArgumentTypeError(f"unknown drafter {text!r}; {hint}(drafters: {', '.join(names)}; a draft "
                                     "model goes in --draft-model)")


# ---------------------------------------------------------------- options


def _model_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that loads a model (passed to `structspec.load`)."""
    from structspec.models.invariance import KERNELS
    from structspec.models.shipped import DEFAULT_MODEL, SHIPPED

    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"a shipped model ({', '.join(SHIPPED)}), a local Hugging Face model directory, or a "
                             "hub id in the local Hugging Face cache")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available, else the CPU), cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="the model's weights and activations (default: bfloat16 on CUDA and on CPUs with "
                             "AVX-512 BF16 or AMX, else float32)")
    parser.add_argument("--kernels", choices=KERNELS, default="auto",
                        help="auto: a float32 CPU model's linear layers prepacked for oneDNN; torch: torch's own")
    parser.add_argument("--threads", type=_positive, metavar="N",
                        help="torch CPU threads (default: torch's count, capped at the CPUs this process may use; "
                             "1 on a machine shared with other jobs)")


def _output_options(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--quiet``, spelled alike by every command that has them."""
    parser.add_argument("--verbose", action="store_true", help="show transformers' loading messages and warnings")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or status line")


def _budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=_positive, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                        help="output tokens per record before it stops as out of budget")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.demo import DEMO_NOTE

    p.description = f"One extraction on the shipped default model, shown token by token. {DEMO_NOTE}"
    _model_options(p)
    _output_options(p)
    p.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                   help="show the output tokens colored by how they were produced")
    p.add_argument("--html", metavar="PATH", help="also write that token view as a self-contained HTML file")


def _extract_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.jobs.lines import ERROR_KINDS
    from structspec.jobs.runner import DEFAULT_BATCH_SIZE

    p.description = ("Extract a structured record from every document. Each output line holds the id, the input "
                     "position, the value or the error, and the stats. Rerun the same command to resume.")
    p.epilog = (EXIT_CODES + "\n\nerror kinds in the output:\n"
                + "\n".join(f"  {k:18} {v}" for k, v in ERROR_KINDS.items()))
    p.add_argument("--schema", required=True,
                   help="package.module:Model, path/to/file.py:Model, schema.json or grammar:NAME")
    p.add_argument("--input", required=True, help="a JSONL file, a CSV file with a header, or a folder of .txt")
    p.add_argument("--output", required=True, help="the JSONL file to append to (and resume from)")
    _model_options(p)
    _output_options(p)
    p.add_argument("--draft", type=drafter, default="prompt_lookup", metavar="DRAFTER",
                   help="how tokens are drafted for one target pass to verify: prompt_lookup, lookahead, auto "
                        "or none")
    p.add_argument("--draft-model", metavar="MODEL",
                   help="a draft model (named as --model), drafting instead of --draft")
    p.add_argument("--batch-size", type=_positive, metavar="N",
                   help="documents decoded together, one target pass for all; each line is written as its "
                        f"document finishes (default: {DEFAULT_BATCH_SIZE['cpu']} on the CPU, "
                        f"{DEFAULT_BATCH_SIZE['cuda']} on CUDA)")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV column of the document")
    p.add_argument("--id-field", default="id", help="JSONL field / CSV column of the record id")
    p.add_argument("--prompt-template", metavar="FILE", help="a file with a {document} placeholder")
    _budget(p)
    p.add_argument("--fast-forward", choices=["off", "exact"], default="exact")
    p.add_argument("--temperature", type=float, help="sample at this temperature (default: greedy)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--retry-errors", action="store_true", help="run again the records whose line is an error")
    p_ray = p.add_argument_group("on Ray (the ray extra)")
    p_ray.add_argument("--ray", metavar="ADDRESS|local",
                       help="run the job on the Ray cluster at ADDRESS (as ray.init takes it: auto, host:6379, "
                            "ray://host:10001), or on a local Ray instance started for the job; same output, "
                            "same resume")
    p_ray.add_argument("--actors", type=_positive, metavar="N",
                       help="actors decoding in parallel, each loading the model (default: 1)")
    p_ray.add_argument("--num-cpus", type=float, metavar="C", help="CPUs per actor (default: 1)")
    p_ray.add_argument("--num-gpus", type=float, metavar="G",
                       help="GPUs per actor (default: 0); the model goes on it with --device auto")


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools import compare

    p.description = compare.__doc__.split("\n\n")[0]
    p.add_argument("--tasks", default="examples/tasks.jsonl",
                   help="JSONL of {id, schema, text, expected}, the schema named in --schemas")
    p.add_argument("--schemas", default="examples/schemas.py", help="a Python file with a SCHEMAS dict")
    p.add_argument("--schema", help="instead of --tasks: one Pydantic model for every --input record, as "
                                    "extract names it (package.module:Model or path/to/file.py:Model)")
    p.add_argument("--input", help="with --schema: the documents, as extract reads them (JSONL, CSV, a folder of "
                                   ".txt)")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV column of the document")
    p.add_argument("--id-field", default="id", help="JSONL field / CSV column of the record id")
    _model_options(p)
    _output_options(p)
    p.add_argument("--draft-model", metavar="MODEL", help="add '+ draft model' rows drafting with this model")
    p.add_argument("--batch-size", type=_positive, default=1, metavar="B",
                   help="also run structspec's methods B records per target pass (generate_batch), as rows "
                        "labelled ', batch B' with their records/s (1: no batched rows)")
    p.add_argument("--limit", type=_positive, metavar="N",
                   help="run N records, taken in turn from each schema (default: all)")
    _budget(p)
    p.add_argument("--out", default="compare-report", help="folder for compare.png, compare.html, compare.json")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.bench import PEER, PLAIN

    p.description = ("The benchmark (also python -m structspec.tools.bench): every structspec mode, outlines and "
                     "transformers' own decoding on examples/tasks.jsonl, same model, same prompts.")
    _model_options(p)
    p.add_argument("--draft-model", metavar="MODEL",
                   help="a shipped model or local dir as draft model (another tokenizer is translated through text)")
    p.add_argument("--limit", type=_positive, metavar="N", help="run N tasks, taken in turn from each schema")
    p.add_argument("--only", help="run only methods whose name contains one of these comma-separated words "
                                  f"(plus {PLAIN!r} and {PEER!r})")
    _budget(p)


def _throughput_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools import throughput

    p.description = "The batched throughput benchmark (also python -m structspec.tools.throughput)."
    throughput.add_arguments(p)


def _pass_cost_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools import pass_cost

    p.description = "The pass-cost curve (also python -m structspec.tools.pass_cost)."
    pass_cost.add_arguments(p)


# ---------------------------------------------------------------- commands


def _config_error() -> type[Exception]:
    from structspec.jobs.errors import JobConfigError

    return JobConfigError


def load_model(args: argparse.Namespace, name: str | None = None) -> LM:
    """`structspec.load` of ``name`` (default ``--model``) with the command's device, dtype, kernels, threads and
    verbosity; a bad name or option is a `JobConfigError` naming the option."""
    name = name or args.model
    try:
        return structspec.load(name, args.device, args.dtype, args.kernels, threads=args.threads,
                               verbose=args.verbose)
    except structspec.StructspecError as e:
        option = "--model" if name == args.model else "--draft-model"
        raise _config_error()(f"{option} {name}: {e}") from None


def check_spec(spec: Any, option: str) -> None:
    """Raise `JobConfigError` when ``spec`` is not a usable spec: checked as `structspec.compile` checks it, but
    without a tokenizer, so before any model loads. Changes nothing."""
    try:
        structspec.to_regex(spec)
    except structspec.StructspecError as e:
        raise _config_error()(f"{option}: {e}") from None


def run_demo(args: argparse.Namespace) -> int:
    """``structspec demo``: load the model (a status line unless ``--quiet``), then `structspec.tools.demo.demo`."""
    from rich.console import Console

    from structspec.tools.demo import demo

    console = Console()
    if args.quiet:
        lm = load_model(args)
    else:
        with console.status(f"loading {args.model} (the first run converts its GGUF, ~20 s)"):
            lm = load_model(args)
    return demo(lm, console, args.explain, args.html)


def extract(args: argparse.Namespace) -> int:
    """Run an extraction job (see `structspec.jobs`), here or on Ray (``--ray``), with a progress bar and a
    summary on stderr. The spec, input and options are checked before the model loads."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from structspec.jobs.errors import JobConfigError
    from structspec.jobs.manifest import check_output
    from structspec.jobs.output import JobSummary
    from structspec.jobs.prompts import default_template, read_template
    from structspec.jobs.records import read_inputs
    from structspec.jobs.runner import JobOptions, run_job
    from structspec.tools.tasks import load_spec

    err = Console(stderr=True)
    ray_options = {"--actors": args.actors, "--num-cpus": args.num_cpus, "--num-gpus": args.num_gpus}
    if args.ray is None and any(value is not None for value in ray_options.values()):
        raise JobConfigError(f"{', '.join(k for k, v in ray_options.items() if v is not None)} need --ray; "
                             "add --ray local or --ray ADDRESS")
    spec = load_spec(args.schema)
    check_spec(spec, f"--schema {args.schema}")
    records = read_inputs(args.input, args.text_field, args.id_field)
    check_output(args.output, args.input)
    template = read_template(args.prompt_template) if args.prompt_template else default_template(spec)
    generate: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "fast_forward": args.fast_forward}
    generate |= {k: v for k, v in [("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                                   ("seed", args.seed)] if v is not None}

    progress = Progress(TextColumn("extract"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rates]}"),
                        TimeElapsedColumn(), console=err, disable=args.quiet)
    task = progress.add_task("extract", total=len(records), rates="")

    def show(s: JobSummary) -> None:
        rates = (f"{s.written / s.seconds:.3g} rec/s · {s.output_tokens / s.seconds:.3g} tok/s · "
                 f"{s.no_pass_tokens / max(s.output_tokens, 1):.0%} tokens without a pass")
        progress.update(task, completed=s.skipped + s.written, rates=rates)

    if args.ray is None:
        lm = load_model(args)
        generate["draft"] = None if args.draft == "none" else args.draft
        if args.draft_model:
            generate["draft"] = load_model(args, args.draft_model)
        with progress:
            summary = run_job(lm, spec, records, args.output, JobOptions(template, generate, args.batch_size), show,
                              retry_errors=args.retry_errors)
    else:
        try:
            from structspec.jobs import ray as ray_jobs  # an optional extra: imported only when asked for
        except ImportError as e:
            raise JobConfigError(str(e)) from None
        actors, num_cpus = args.actors or 1, args.num_cpus or 1
        # each actor loads the model itself: the names travel, a local directory as an absolute path
        model, draft = (str(Path(name).resolve()) if Path(name).exists() else name
                        for name in (args.model, args.draft_model or args.draft))
        options = JobOptions(template, generate | {"draft": draft}, args.batch_size)
        with ray_jobs.connect(args.ray, local_cpus=math.ceil(actors * num_cpus)) as where:
            if not args.quiet:
                err.print(f"running on {where}", highlight=False, soft_wrap=True)
            with progress:
                summary = ray_jobs.run_job(model, spec, records, args.output, options, show, args.retry_errors, actors,
                                           num_cpus, args.num_gpus or 0, args.device, args.dtype)
    err.print(summary.describe() + f" → {args.output}", highlight=False, soft_wrap=True)
    return EXIT_OK


def _run_compare(args: argparse.Namespace) -> int:
    from structspec.tools import compare

    return compare.main(args)


def _run_bench(args: argparse.Namespace) -> int:
    from structspec.tools import bench

    return bench.main(args)


def _toolbench_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools import toolbench

    toolbench.add_arguments(p)


def _run_toolbench(args: argparse.Namespace) -> int:
    from structspec.tools import toolbench

    return toolbench.main(args)


def _run_throughput(args: argparse.Namespace) -> int:
    from structspec.tools import throughput

    return throughput.run(args)


def _run_pass_cost(args: argparse.Namespace) -> int:
    from structspec.tools import pass_cost

    return pass_cost.run(args)


@dataclass(frozen=True)
class Command:
    """A subcommand: its line in ``structspec --help``, what adds its options, and what runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS = {
    "demo": Command("one extraction on the shipped default model, its tokens colored by how they were produced",
                    _demo_arguments, run_demo),
    "extract": Command("extract one record per document into a JSONL file (resumable; --ray for a cluster)",
                       _extract_arguments, extract),
    "compare": Command("forward passes and seconds per valid record against unconstrained decoding: table, "
                       "chart, HTML report", _compare_arguments, _run_compare),
    "bench": Command("structspec against outlines and transformers on the example tasks: speed, passes, compile",
                     _bench_arguments, _run_bench),
    "toolbench": Command("tool calls on a chat model: structspec's modes against transformers' greedy and prompt "
                         "lookup", _toolbench_arguments, _run_toolbench),
    "throughput": Command("batched records/s against outlines' and transformers' batched generation",
                          _throughput_arguments, _run_throughput),
    "pass-cost": Command("seconds per batched verify pass against rows and tokens fed",
                         _pass_cost_arguments, _run_pass_cost),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; only ``command``'s options are added (the others' need torch to describe). Changes
    nothing."""
    top = argparse.ArgumentParser(prog="structspec", description=DESCRIPTION, epilog=EXIT_CODES,
                                  formatter_class=Formatter, allow_abbrev=False)
    top.add_argument("--version", action="version", version=f"structspec {structspec.__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        # no abbreviations: --draft must not silently mean --draft-model where a command has only the latter
        p = sub.add_parser(name, help=cmd.help, description=cmd.help, epilog=EXIT_CODES, formatter_class=Formatter,
                           allow_abbrev=False)
        if name == command:
            cmd.add_arguments(p)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # no top-level option takes a value
    args = parser(command).parse_args(argv)
    error = _config_error()
    try:
        return COMMANDS[args.command].run(args)
    except error as e:
        from rich.console import Console

        Console(stderr=True).print(f"structspec {args.command}: {e}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        resume = "; rerun the same command to resume" if args.command == "extract" else ""
        print(f"structspec {args.command}: interrupted{resume}", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
