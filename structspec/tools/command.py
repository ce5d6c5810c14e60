"""What every ``structspec`` command shares: exit codes, help formatting, the model and token-budget options,
loading the model they name, and running a command with its errors mapped to exit codes.

The commands import this module, never `structspec.tools.cli`: the CLI imports the commands (inside the
functions that parse or run one), so importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import structspec
from structspec.errors import ModelNotFoundError, OptionError
from structspec.jobs.errors import JobConfigError

if TYPE_CHECKING:
    from structspec.models.transformers_lm import LM

EXIT_OK, EXIT_CONFIG, EXIT_BUSY, EXIT_INTERRUPTED = 0, 2, 3, 130
EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done (also when some records failed: they are in the output with their reason)
  1    an unexpected error (a bug: please report it with the traceback)
  {EXIT_CONFIG}    configuration error (bad option, schema, model or drafter name, unreadable input); nothing ran
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); rerun the same command to resume"""

DEFAULT_MAX_NEW_TOKENS = 512  # every command's token budget, the demo's too: the API's (GenerateOptions.max_new_tokens)


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, where it has one and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def positive(text: str) -> int:
    """An int ≥ 1 (argparse's ``type``: a bad value exits 2 with the option's name before anything runs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def kernels(text: str) -> str:
    """A ``--kernels`` value, one of `structspec.models.invariance.KERNELS` (argparse's ``type``: read when the
    option is parsed, so ``--help`` imports no torch)."""
    from structspec.models.invariance import KERNELS

    if text not in KERNELS:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(KERNELS)})")
    return text


def model_options(parser: argparse.ArgumentParser, model: str | None = None, several_dtypes: bool = False) -> None:
    """Add the options of every command that loads a model (passed to `structspec.load`) to ``parser``:
    ``--model`` (default ``model``, else the shipped default), ``--device``, ``--dtype`` (with
    ``several_dtypes``: ``--dtypes``, a comma-separated list, each loaded in turn), ``--kernels`` and
    ``--threads``. Changes the parser; imports no torch."""
    from structspec.models.shipped import DEFAULT_MODEL, SHIPPED

    parser.add_argument("--model", default=model or DEFAULT_MODEL,
                        help=f"a shipped model ({', '.join(SHIPPED)}), a local Hugging Face model directory, or a "
                             "hub id in the local Hugging Face cache")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available, else the CPU), cpu, cuda or cuda:N")
    dtype_default = ("$STRUCTSPEC_DEFAULT_DTYPE where set, else bfloat16 on CUDA and on CPUs with AVX-512 BF16 or AMX, "
                     "else float32; float32 everywhere for smollm2-135m, which bfloat16 makes wrong")
    if several_dtypes:
        parser.add_argument("--dtypes", "--dtype", dest="dtypes", metavar="DTYPE,...",
                            help="comma-separated dtypes among float32, bfloat16, float16: the model loads in each in "
                                 f"turn and every row runs in it (default: one, {dtype_default})")
    else:
        parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                            help=f"the model's weights and activations (default: {dtype_default})")
    parser.add_argument("--kernels", type=kernels, default="auto", metavar="NAME",
                        help="auto: a float32 CPU model's linear layers prepacked for oneDNN; onednn: insist on it "
                             "(an error where it cannot); torch: torch's own")
    parser.add_argument("--threads", type=positive, metavar="N",
                        help="torch CPU threads (default: torch's count, capped at the CPUs this process may use; "
                             "1 on a machine shared with other jobs)")


def budget(parser: argparse.ArgumentParser) -> None:
    """Add ``--max-new-tokens`` to ``parser``."""
    parser.add_argument("--max-new-tokens", type=positive, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                        help="output tokens per record before it stops as out of budget")


def load_model(args: argparse.Namespace, name: str | None = None) -> LM:
    """`structspec.load` of ``name`` (default ``--model``) with the command's device, dtype, kernels, threads and
    verbosity; a bad name or option is a `JobConfigError` naming the option."""
    name = name or args.model
    try:
        return structspec.load(name, args.device, args.dtype, args.kernels, threads=args.threads,
                               verbose=args.verbose)
    except structspec.StructspecError as e:
        option = "--model" if name == args.model else "--draft-model"
        raise JobConfigError(f"{option} {name}: {e}") from None


def drafting_curve(lm: LM, calibrate: bool = False) -> None:
    """Say on stderr which pass-cost curve ``lm``'s runs draft by (`structspec.decoding.cost.curve_source`).
    A benchmark times what a new user gets, the stored curve or the prior; with ``calibrate`` (``--calibrate``),
    a model without a stored curve is first calibrated and the curve stored, as a user's ``structspec
    calibrate`` would (measured beside other busy work it is not stored, and the run keeps the prior). May run
    the model and write the cache."""
    from structspec.decoding.cost import curve_path, curve_source

    path = curve_path(lm)
    if calibrate and path is not None and lm.batchable and not path.exists():
        with warnings.catch_warnings():  # said below, in the benchmark's words
            warnings.simplefilter("ignore", RuntimeWarning)
            calibration = structspec.calibrate(lm)
        if not calibration.stored:
            print(f"{lm.name}: {calibration.busy} thread(s) of other work ran while calibrating, so the pass-cost "
                  "curve was not stored", file=sys.stderr)
    print(f"{lm.name}: {curve_source(lm)}", file=sys.stderr)


def calibrate_option(p: argparse.ArgumentParser) -> None:
    """``--calibrate`` on a benchmark's parser (changes the parser)."""
    p.add_argument("--calibrate", action="store_true",
                   help="calibrate a model without a stored pass-cost curve before timing (as structspec calibrate "
                        "does); by default a run drafts by what a new user gets: the stored curve, else the prior")


def run_command(name: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)`` for ``structspec NAME``; its exit code, or `EXIT_CONFIG` after printing a `JobConfigError`
    (or a model `structspec.load` cannot find, an option it refuses), or `EXIT_INTERRUPTED` after Ctrl-C."""
    try:
        return run(args)
    except (JobConfigError, ModelNotFoundError, OptionError) as e:  # a name or option the command cannot use
        from rich.console import Console

        Console(stderr=True).print(f"structspec {name}: {e}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        resume = "; rerun the same command to resume" if name == "extract" else ""
        print(f"structspec {name}: interrupted{resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
