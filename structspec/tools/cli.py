"""Command line: ``structspec demo``, ``extract``, ``calibrate``, ``compare``, ``bench``, ``toolbench``,
``throughput`` and ``pass-cost``.

Parsing imports neither torch nor transformers: a command's options are added only when that command is on the
command line (their defaults and choices live in modules that import torch), and what runs a model is imported
inside the command. So ``structspec --help`` and ``--version`` answer at once, and a bad option, spec or name
exits 2 before any model loads.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structspec
from structspec.tools.command import (EXIT_BUSY, EXIT_CODES, EXIT_INTERRUPTED, EXIT_OK, Formatter, budget,
                                      calibrate_option, load_model, model_options, positive, run_command)

DESCRIPTION = ("Constrained structured generation for Hugging Face causal LMs, with exact forward-pass "
               "accounting. Start with `structspec demo`, then `structspec extract`; `structspec COMMAND --help` "
               "for a command's options.")


def drafter(text: str) -> str:
    """A drafter's name (`structspec.decoding.drafters.factory.DRAFT_NAMES` or ``none``), with a did-you-mean for a typo
    (argparse's ``type``)."""
    from structspec.decoding.drafters.factory import DRAFT_NAMES

    names = [*DRAFT_NAMES, "none"]
    if text in names:
        return text
    close = difflib.get_close_matches(text, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise argparse.ArgumentTypeError(f"unknown drafter {text!r}; {hint}(drafters: {', '.join(names)}; a draft "
                                     "model goes in --draft-model)")


# ---------------------------------------------------------------- options


def _output_options(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--quiet``, spelled alike by every command that has them."""
    parser.add_argument("--verbose", action="store_true", help="show transformers' loading messages and warnings")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or status line")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.demo import DEMO_NOTE

    p.description = f"One extraction on the shipped default model, shown token by token. {DEMO_NOTE}"
    model_options(p)
    _output_options(p)
    p.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                   help="show the output tokens colored by how they were produced")
    p.add_argument("--html", metavar="PATH", help="also write that token view as a self-contained HTML file")


def _extract_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.jobs.lines import ERROR_KINDS
    from structspec.jobs.runner import DEFAULT_BATCH_SIZE, VLLM_BATCH_SIZE
    from structspec.tools.arguments import repetition_options

    p.description = ("Extract a structured record from every document. Each output line holds the id, the input "
                     "position, the value or the error, and the stats. Rerun the same command to resume.")
    p.epilog = (EXIT_CODES + "\n\nerror kinds in the output:\n"
                + "\n".join(f"  {k:18} {v}" for k, v in ERROR_KINDS.items()))
    p.add_argument("--schema", required=True,
                   help="package.module:Model, path/to/file.py:Model, schema.json or grammar:NAME")
    p.add_argument("--input", required=True, help="a JSONL file, a CSV file with a header, or a folder of .txt")
    p.add_argument("--output", required=True, help="the JSONL file to append to (and resume from)")
    p.add_argument("--engine", choices=["structspec", "vllm"], default="structspec",
                   help="what decodes the records: structspec's own loop, or a vllm.LLM under structspec's "
                        "structured-output backend, --batch-size records per generate call (the vllm extra; "
                        "--model a shipped name or a model directory)")
    model_options(p)
    _output_options(p)
    p.add_argument("--draft", type=drafter, default="prompt_lookup", metavar="DRAFTER",
                   help="how tokens are drafted for one target pass to verify: prompt_lookup, lookahead, auto "
                        "or none")
    p.add_argument("--draft-model", metavar="MODEL",
                   help="a draft model (named as --model), drafting instead of --draft")
    p.add_argument("--batch-size", type=positive, metavar="N",
                   help="documents decoded together, one target pass for all; each line is written as its "
                        f"document finishes (default: {DEFAULT_BATCH_SIZE['cpu']} on the CPU, "
                        f"{DEFAULT_BATCH_SIZE['cuda']} on CUDA; with --engine vllm, records per generate call, "
                        f"default {VLLM_BATCH_SIZE})")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV column of the document")
    p.add_argument("--id-field", default="id", help="JSONL field / CSV column of the record id")
    p.add_argument("--prompt-template", metavar="FILE", help="a file with a {document} placeholder")
    budget(p)
    p.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                   help="refuse a schema keyword structspec cannot enforce (if, uniqueItems, ...); --no-strict drops "
                        "it instead and lists it in each output line's stats.not_enforced")
    p.add_argument("--fast-forward", choices=["off", "exact"], default="exact",
                   help="exact: append the tokens the schema forces without a forward pass (the output is the same); "
                        "off: one pass per token, as plain masked decoding")
    p.add_argument("--temperature", type=float, help="sample at this temperature (default: greedy)")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="sample among the K likeliest tokens the schema allows (sampling, at --temperature or 1)")
    p.add_argument("--top-p", type=float, metavar="P",
                   help="sample among the likeliest allowed tokens whose probabilities sum to P, 0 < P ≤ 1 "
                        "(sampling, at --temperature or 1)")
    p.add_argument("--seed", type=int, help="when sampling: seed each record's sampler, so that a rerun draws the "
                                            "same tokens (default: torch's global generator)")
    repetition_options(p)
    p.add_argument("--retry-errors", action="store_true", help="run again the records whose line is an error")
    p_ray = p.add_argument_group("on Ray (the ray extra)")
    p_ray.add_argument("--ray", metavar="ADDRESS|local",
                       help="run the job on the Ray cluster at ADDRESS (as ray.init takes it: auto, host:6379, "
                            "ray://host:10001), or on a local Ray instance started for the job; same output, "
                            "same resume")
    p_ray.add_argument("--actors", type=positive, metavar="N",
                       help="actors decoding in parallel, each loading the model (default: 1)")
    p_ray.add_argument("--num-cpus", type=float, metavar="C", help="CPUs per actor (default: 1)")
    p_ray.add_argument("--num-gpus", type=float, metavar="G",
                       help="GPUs per actor (default: 0); the model goes on it with --device auto")


def _calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Measure the model's packed pass cost (seconds of one pass against the tokens it feeds, a few "
                     "seconds of passes) and store it for its name, dtype, device, kernels and threads: decoding "
                     "with that model then drafts by it (structspec.calibrate(lm) in Python). Decoding never "
                     "measures; a model never calibrated drafts by the prior for its device and dtype. Run it on an idle "
                     "machine, with the --threads your runs use.")
    p.epilog = EXIT_CODES.replace(f"\n  {EXIT_INTERRUPTED} ", f"\n  {EXIT_BUSY}    measured beside other busy work: "
                                  "nothing stored (calibrate again when the machine is idle, or --store-busy)"
                                  f"\n  {EXIT_INTERRUPTED} ")
    model_options(p)
    p.add_argument("--verbose", action="store_true", help="show transformers' loading messages and warnings")
    p.add_argument("--store-busy", action="store_true",
                   help="store the curve even when other work ran beside the measurement (it is then that "
                        "moment's curve, not the model's)")


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", help="JSONL of {id, schema, text, expected}, the schema named in --schemas "
                                   "(default: the shipped example tasks, examples/tasks.jsonl in a clone)")
    p.add_argument("--schemas", help="a Python file with a SCHEMAS dict (default: the shipped examples/schemas.py)")
    p.add_argument("--schema", help="instead of --tasks: one Pydantic model for every --input record, as "
                                    "extract names it (package.module:Model or path/to/file.py:Model)")
    p.add_argument("--input", help="with --schema: the documents, as extract reads them (JSONL, CSV, a folder of "
                                   ".txt)")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV column of the document")
    p.add_argument("--id-field", default="id", help="JSONL field / CSV column of the record id")
    p.add_argument("--expected-field", metavar="NAME",
                   help="with --input: the JSONL field (a JSON object) / CSV column (its JSON text) of each record's "
                        "expected values, scored as field accuracy (records without it are not scored)")
    p.add_argument("--prompt-template", metavar="FILE",
                   help="a file with a {document} placeholder, the prompt of every method (default: one that names "
                        "the schema's fields and asks for JSON)")
    model_options(p)
    _output_options(p)
    p.add_argument("--draft-model", metavar="MODEL", help="add '+ draft model' rows drafting with this model")
    p.add_argument("--batch-size", type=positive, default=1, metavar="B",
                   help="also run structspec's methods B records per target pass (generate_batch), as rows "
                        "labelled ', batch B' with their records/s (1: no batched rows)")
    p.add_argument("--limit", type=positive, metavar="N",
                   help="run N records, taken in turn from each schema (default: all)")
    budget(p)
    calibrate_option(p)
    p.add_argument("--out", default="compare-report", help="folder for compare.png, compare.html, compare.json")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.arguments import bench_arguments

    bench_arguments(p)


def _throughput_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.arguments import throughput_arguments

    p.description = ("Batched records/s of structspec's modes against outlines' and transformers' batched "
                     "generation on the shipped example tasks (also python -m structspec.tools.benchmarks.throughput).")
    throughput_arguments(p)


def _pass_cost_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.arguments import pass_cost_arguments

    p.description = ("Seconds per batched verify pass against rows and tokens fed; --store calibrates: keeps the "
                     "curve decoding reads (also python -m structspec.tools.pass_cost).")
    pass_cost_arguments(p)


# ---------------------------------------------------------------- commands


def _run_demo(args: argparse.Namespace) -> int:
    from structspec.tools import demo

    return demo.run(args)


def _run_extract(args: argparse.Namespace) -> int:
    from structspec.tools import extract

    return extract.run(args)


def _run_calibrate(args: argparse.Namespace) -> int:
    import warnings

    lm = load_model(args)
    with warnings.catch_warnings():  # the busy machine is said below, with the exit code
        warnings.simplefilter("ignore", RuntimeWarning)
        calibration = structspec.calibrate(lm, store_busy=args.store_busy)
    one = calibration.seconds[1]
    print(f"{lm.name}, {str(lm.dtype).removeprefix('torch.')} on {lm.device}, {lm.kernels} kernels")
    print(f"{'tokens fed':>10} {'ms/pass':>9} {'× 1 token':>10}")
    for fed, seconds in sorted(calibration.seconds.items()):
        print(f"{fed:>10} {seconds * 1e3:>9.2f} {calibration.cost(fed):>10.2f}")
    if calibration.stored:
        print(f"stored in {calibration.path}")
        return EXIT_OK
    print(f"not stored: {calibration.busy} thread(s) of other work ran beside the measurement ({one * 1e3:.1f} ms "
          "a one-token pass); calibrate again when the machine is idle, or pass --store-busy", file=sys.stderr)
    return EXIT_BUSY


def _run_compare(args: argparse.Namespace) -> int:
    from structspec.tools.benchmarks import compare

    return compare.main(args)


def _run_bench(args: argparse.Namespace) -> int:
    from structspec.tools.benchmarks import bench

    return bench.main(args)


def _toolbench_arguments(p: argparse.ArgumentParser) -> None:
    from structspec.tools.arguments import toolbench_arguments

    toolbench_arguments(p)


def _run_toolbench(args: argparse.Namespace) -> int:
    from structspec.tools.benchmarks import toolbench

    return toolbench.main(args)


def _run_throughput(args: argparse.Namespace) -> int:
    from structspec.tools.benchmarks import throughput

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
                    _demo_arguments, _run_demo),
    "extract": Command("extract one record per document into a JSONL file (resumable; --ray for a cluster)",
                       _extract_arguments, _run_extract),
    "calibrate": Command("measure and store the model's pass cost, which decoding drafts by",
                         _calibrate_arguments, _run_calibrate),
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
    with warnings.catch_warnings():
        # structspec's warnings (a misspelled keyword, ...) once each, as one line: a job compiles its spec
        # more than once, and a user of the command has no use for structspec's source line. (Deduplicated
        # here: the "once" filter forgets what it showed when a nested catch_warnings sets a filter.)
        warnings.filterwarnings("always", category=structspec.StructspecWarning)
        warnings.showwarning = _one_line(args.command, warnings.showwarning)
        return run_command(args.command, COMMANDS[args.command].run, args)


def _one_line(command: str, show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that writes each distinct `structspec.StructspecWarning` once, as ``structspec
    COMMAND: warning: …`` on stderr, and any other warning as ``show`` does."""
    shown: set[str] = set()

    def showwarning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not issubclass(category, structspec.StructspecWarning):
            show(message, category, *args, **kwargs)
        elif str(message) not in shown:
            shown.add(str(message))
            print(f"structspec {command}: warning: {message}", file=sys.stderr)

    return showwarning


if __name__ == "__main__":
    sys.exit(main())
