"""Command line: ``structspec demo``, ``structspec extract``, ``structspec compare`` and ``structspec bench``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import structspec
from structspec.decoding.drafters import SHORT_NAMES
from structspec.kernels import KERNELS
from structspec.lm import DEFAULT_MODEL, LM
from structspec.tools import bench, compare, jobs, pass_cost, throughput
from structspec.tools.explain import explain_html, legend_rich, stats_table, to_rich, token_views

EXIT_OK, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 2, 130
EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done (also when some records failed: they are in the output with their reason)
  1    an unexpected error (a bug: please report it with the traceback)
  {EXIT_CONFIG}    configuration error (unknown schema or model, unreadable input, bad option); nothing ran
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); rerun the same command to resume"""

DEMO_DOCUMENT = (
    "Hi team, please welcome Dr. Maria Okafor, our new Head of Research, who joins us from "
    "Lagos on Monday. She can be reached at maria.okafor@brightlabs.io or +234 801 555 0199."
)


class NewHire(BaseModel):
    """The demo's extraction schema."""

    name: str
    title: str
    city: str
    email: str
    phone: str
    seniority: Literal["junior", "mid", "senior", "executive"]


def demo(lm: LM, console: Console, explain: bool = True, html: str | None = None) -> int:
    """Extract one record; show the object, its stats and (``explain``) its tokens by how they were produced."""
    prompt = [{"role": "user", "content": f"Extract the new hire as JSON.\n\n{DEMO_DOCUMENT}"}]
    result = structspec.generate_result(lm, NewHire, prompt, max_new_tokens=200)
    console.print(f"[bold]document:[/bold] {DEMO_DOCUMENT}\n")
    console.print(result.value)
    console.print(stats_table(result.stats, title=f"{lm.name}, greedy, stop: {result.stop_reason}"))
    views = token_views(lm.vocab.token_bytes, result.token_ids, result.sources)
    if explain:
        console.print("\n[bold]output tokens by how they were produced:[/bold]")
        console.print(to_rich(views))
        console.print(legend_rich(views))
    if html:
        Path(html).write_text(explain_html(f"structspec demo: {lm.name}", views), encoding="utf-8")
        console.print(f"token view written to {html}")
    return EXIT_OK


def extract(args: argparse.Namespace) -> int:
    """Run an extraction job (see `structspec.tools.jobs`), here or on Ray (``--ray``), with a progress bar and a
    summary on stderr."""
    err = Console(stderr=True)
    ray_options = {"--actors": args.actors, "--num-cpus": args.num_cpus, "--num-gpus": args.num_gpus}
    if args.ray is None and any(value is not None for value in ray_options.values()):
        raise jobs.JobConfigError(f"{', '.join(k for k, v in ray_options.items() if v is not None)} need --ray")
    spec = jobs.load_spec(args.schema)
    records = jobs.read_inputs(args.input, args.text_field, args.id_field)
    template = jobs.read_template(args.prompt_template) if args.prompt_template else jobs.default_template(spec)
    generate: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "fast_forward": args.fast_forward}
    generate |= {k: v for k, v in [("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                                   ("seed", args.seed)] if v is not None}

    progress = Progress(TextColumn("extract"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rates]}"),
                        TimeElapsedColumn(), console=err, disable=args.quiet)
    task = progress.add_task("extract", total=len(records), rates="")

    def show(s: jobs.JobSummary) -> None:
        rates = (f"{s.written / s.seconds:.3g} rec/s · {s.output_tokens / s.seconds:.3g} tok/s · "
                 f"{s.no_pass_tokens / max(s.output_tokens, 1):.0%} tokens without a pass")
        progress.update(task, completed=s.skipped + s.written, rates=rates)

    if args.ray is None:
        generate["draft"] = jobs.resolve_draft(args.draft, args.device, args.dtype)
        lm = jobs.load_model(args.model, args.device, args.dtype, args.kernels)
        with progress:
            summary = jobs.run_job(lm, spec, records, args.output, jobs.JobOptions(template, generate, args.batch_size),
                                   show, retry_errors=args.retry_errors)
    else:
        try:
            from structspec.integrations import ray as ray_jobs  # an optional extra: imported only when asked for
        except ImportError as e:
            raise jobs.JobConfigError(str(e)) from None
        actors, num_cpus = args.actors or 1, args.num_cpus or 1
        # each actor loads the model itself: the names travel, a local directory as an absolute path
        model, draft = (str(Path(name).resolve()) if Path(name).exists() else name for name in (args.model, args.draft))
        options = jobs.JobOptions(template, generate | {"draft": draft}, args.batch_size)
        with ray_jobs.connect(args.ray, local_cpus=math.ceil(actors * num_cpus)) as where:
            if not args.quiet:
                err.print(f"running on {where}", highlight=False, soft_wrap=True)
            with progress:
                summary = ray_jobs.run_job(model, spec, records, args.output, options, show, args.retry_errors, actors,
                                           num_cpus, args.num_gpus or 0, args.device, args.dtype)
    err.print(summary.describe() + f" → {args.output}", highlight=False, soft_wrap=True)
    return EXIT_OK


def _model_options(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--kernels``, for every command that loads a model (passed to
    `structspec.load`)."""
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available, else the CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="the model's weights and activations (default: bfloat16 on CUDA and on CPUs with "
                             "AVX-512 BF16 or AMX, else float32)")
    parser.add_argument("--kernels", choices=KERNELS, default="auto",
                        help="auto: a float32 CPU model's linear layers prepacked for oneDNN; torch: torch's own "
                             "(default: auto)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="structspec", description=__doc__, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p_demo = sub.add_parser("demo", help="one extraction on the shipped default model", epilog=EXIT_CODES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p_demo.add_argument("--model", default=DEFAULT_MODEL)
    _model_options(p_demo)
    p_demo.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                        help="show the output tokens colored by how they were produced (default: on)")
    p_demo.add_argument("--html", metavar="PATH", help="also write that token view as a self-contained HTML file")

    p_ext = sub.add_parser(
        "extract", help="extract one record per document into a JSONL file (resumable)",
        description="Extract a structured record from every document. Each output line holds the id, the input "
                    "position, the value or the error, and the stats. Rerun the same command to resume.",
        epilog=EXIT_CODES + "\n\nerror kinds in the output:\n"
               + "\n".join(f"  {k:18} {v}" for k, v in jobs.ERROR_KINDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p_ext.add_argument("--schema", required=True,
                       help="package.module:Model, path/to/file.py:Model, schema.json or grammar:NAME")
    p_ext.add_argument("--input", required=True, help="a JSONL file, a CSV file with a header, or a folder of .txt")
    p_ext.add_argument("--output", required=True, help="the JSONL file to append to (and resume from)")
    p_ext.add_argument("--model", default=DEFAULT_MODEL, help="a shipped model name or a local HF model directory")
    _model_options(p_ext)
    p_ext.add_argument("--draft", default="prompt_lookup",
                       help=f"a drafter ({', '.join(SHORT_NAMES)}; default prompt_lookup), a draft model "
                            "name/directory (loaded like --model), or none")
    p_ext.add_argument("--batch-size", type=int, metavar="N",
                       help="documents decoded together, one target pass for all; each line is written as its "
                            f"document finishes (default: {jobs.DEFAULT_BATCH_SIZE['cpu']} on the CPU, "
                            f"{jobs.DEFAULT_BATCH_SIZE['cuda']} on CUDA)")
    p_ext.add_argument("--text-field", default="text", help="JSONL field / CSV column of the document (text)")
    p_ext.add_argument("--id-field", default="id", help="JSONL field / CSV column of the record id (id)")
    p_ext.add_argument("--prompt-template", metavar="FILE", help="a file with a {document} placeholder")
    p_ext.add_argument("--max-new-tokens", type=int, default=256)
    p_ext.add_argument("--fast-forward", choices=["off", "exact"], default="exact")
    p_ext.add_argument("--temperature", type=float, help="sample at this temperature (default: greedy)")
    p_ext.add_argument("--top-k", type=int)
    p_ext.add_argument("--top-p", type=float)
    p_ext.add_argument("--seed", type=int)
    p_ext.add_argument("--retry-errors", action="store_true", help="run again the records whose line is an error")
    p_ext.add_argument("--quiet", action="store_true", help="no progress bar")
    p_ray = p_ext.add_argument_group("on Ray (pip install 'structspec[ray]')")
    p_ray.add_argument("--ray", metavar="ADDRESS|local",
                       help="run the job on the Ray cluster at ADDRESS (as ray.init takes it: auto, host:6379, "
                            "ray://host:10001), or on a local Ray instance started for the job; same output, "
                            "same resume")
    p_ray.add_argument("--actors", type=int, metavar="N", help="actors decoding in parallel, each loading the model "
                                                                 "(default: 1)")
    p_ray.add_argument("--num-cpus", type=float, metavar="C", help="CPUs per actor (default: 1)")
    p_ray.add_argument("--num-gpus", type=float, metavar="G",
                       help="GPUs per actor (default: 0); the model goes on it with --device auto")

    p_cmp = sub.add_parser(
        "compare", help="forward passes saved against unconstrained decoding: table, PNG chart, HTML report",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_cmp.add_argument("--tasks", default="examples/tasks.jsonl", help="JSONL of {id, schema, text, expected}")
    p_cmp.add_argument("--schemas", default="examples/schemas.py", help="a Python file with a SCHEMAS dict")
    p_cmp.add_argument("--model", default=DEFAULT_MODEL)
    _model_options(p_cmp)
    p_cmp.add_argument("--draft", help="a draft model (name or directory) for a '+ draft model' row")
    p_cmp.add_argument("--batch-size", type=int, default=1, metavar="B",
                       help="also run structspec's methods B records per target pass (generate_batch), as rows "
                            "labelled ', batch B' with their records/s (default: 1, no batched rows)")
    p_cmp.add_argument("--limit", type=int, help="run N tasks, taken in turn from each schema")
    p_cmp.add_argument("--max-new-tokens", type=int, default=200)
    p_cmp.add_argument("--out", default="compare-report", help="folder for compare.png, compare.html, compare.json")
    p_cmp.add_argument("--threads", type=int, help="torch CPU threads")

    p_bench = sub.add_parser(
        "bench", help="structspec against outlines and transformers on the example tasks: speed, passes, compile",
        description="The benchmark (also python -m structspec.tools.bench): every structspec mode, outlines and "
                    "transformers' own decoding on examples/tasks.jsonl, same model, same prompts.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_bench.add_argument("--model", default=DEFAULT_MODEL)
    _model_options(p_bench)
    p_bench.add_argument("--draft-model", default=None,
                         help="a shipped model or local dir as draft model (another tokenizer is translated through "
                              "text)")
    p_bench.add_argument("--limit", type=int, default=None, help="run N tasks, taken in turn from each schema")
    p_bench.add_argument("--only", default=None,
                         help="run only methods whose name contains one of these comma-separated words "
                              f"(plus {bench.PLAIN!r} and {bench.PEER!r})")
    p_bench.add_argument("--max-new-tokens", type=int, default=200)
    p_bench.add_argument("--threads", type=int, default=None,
                         help="torch CPU threads (1 keeps timings sane when other processes share the cores)")

    p_thr = sub.add_parser(
        "throughput", help="batched records/s against outlines' and transformers' batched generation",
        description="The batched throughput benchmark (also python -m structspec.tools.throughput).",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    throughput.add_arguments(p_thr)

    p_cost = sub.add_parser(
        "pass-cost", help="seconds per batched verify pass against rows and tokens fed",
        description="The pass-cost curve (also python -m structspec.tools.pass_cost).")
    pass_cost.add_arguments(p_cost)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            console = Console()
            with console.status(f"loading {args.model} (the first run converts its GGUF, ~20 s)"):
                lm = jobs.load_model(args.model, args.device, args.dtype, args.kernels)
            return demo(lm, console, args.explain, args.html)
        commands = {"extract": extract, "compare": compare.main, "bench": bench.main, "throughput": throughput.run,
                    "pass-cost": pass_cost.run}
        return commands[args.command](args)
    except jobs.JobConfigError as e:
        Console(stderr=True).print(f"structspec {args.command}: {e}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        resume = "; rerun the same command to resume" if args.command == "extract" else ""
        Console(stderr=True).print(f"structspec {args.command}: interrupted{resume}", highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
