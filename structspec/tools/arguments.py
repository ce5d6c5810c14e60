"""The options of ``structspec bench``, ``toolbench``, ``throughput`` and ``pass-cost``, apart from the modules
that run them (which import torch), so that ``structspec COMMAND --help`` and a bad option answer at once. Spelled as
every command spells them: the model options and the token budget of `structspec.tools.command`, a metavar and a
help line for each."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from structspec.tools.command import budget, calibrate_option, model_options, positive

THROUGHPUT_MODEL = "qwen2.5-coder-0.5b"  # the model the throughput pages were measured on
# Architectures for the random-weight models of pass-cost and gpucheck (the published configs' shapes).
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                       tie_word_embeddings=False),
}


def bench_arguments(p: argparse.ArgumentParser) -> None:
    """The extraction benchmark's description and options on ``p`` (changes the parser)."""
    p.description = ("The benchmark (also python -m structspec.tools.benchmarks.bench): every structspec mode, "
                     "outlines and transformers' own decoding on the shipped example tasks, same model, same prompts.")
    model_options(p)
    p.add_argument("--draft-model", metavar="MODEL",
                   help="a shipped model or local dir as draft model (another tokenizer is translated through text)")
    p.add_argument("--limit", type=positive, metavar="N", help="run N tasks, taken in turn from each schema")
    p.add_argument("--only", metavar="WORD,...", help="run only methods whose name contains one of these "
                   "comma-separated words (plus plain masked decoding and outlines, the oracle pair)")
    budget(p)
    calibrate_option(p)


def toolbench_arguments(p: argparse.ArgumentParser) -> None:
    """The tool-call benchmark's description and options on ``p`` (changes the parser)."""
    from structspec.tools.tasks import example_file

    p.description = ("Tool calls on a chat model (also python -m structspec.tools.benchmarks.toolbench): transformers' "
                     "greedy and prompt lookup against structspec's modes and a batch, on the shipped conversations.")
    model_options(p, THROUGHPUT_MODEL)
    p.add_argument("--data", type=Path, default=example_file("toolcalls.jsonl"), metavar="PATH",
                   help="conversations, one JSON object a line")
    p.add_argument("--limit", type=positive, metavar="N", help="only the first N conversations (a smoke run)")
    budget(p)
    p.add_argument("--batch-size", type=positive, default=8, metavar="B", help="rows of the batched structspec row")
    calibrate_option(p)


def throughput_arguments(p: argparse.ArgumentParser) -> None:
    """The throughput benchmark's options on ``p`` (changes the parser)."""
    model_options(p, THROUGHPUT_MODEL, several_dtypes=True)
    p.add_argument("--records", type=positive, default=16, metavar="N",
                   help="records of the shipped example tasks, their schemas in turn")
    p.add_argument("--b1-records", type=positive, metavar="N",
                   help="B=1 rows decode only the first N records (default: all); identity is checked on them")
    p.add_argument("--batch-sizes", default="1,8,16", metavar="B,...",
                   help="batch sizes of structspec's rows (B=1 always runs: the reference)")
    p.add_argument("--peer-batch-sizes", "--peer-batch-size", dest="peer_batch_sizes", default="8", metavar="B,...",
                   help="batch sizes of the outlines and transformers rows")
    budget(p)
    p.add_argument("--json", metavar="PATH",
                   help="also write the raw numbers as JSON (with several --dtypes: {\"reports\": [one per dtype]})")
    calibrate_option(p)
    p.add_argument("--bf16-agreement", action="store_true",
                   help="instead: float32 single-row plain masked against bfloat16 batched exact + prompt lookup "
                        "(B = the largest --batch-sizes), token identity and margins at divergences")


def repetition_options(p: argparse.ArgumentParser) -> None:
    """``--repetition-penalty`` and ``--no-repeat-ngram-size`` on ``p`` (changes the parser): transformers'
    repetition controls, as `structspec.GenerateOptions` takes them."""
    p.add_argument("--repetition-penalty", type=float, metavar="P",
                   help="divide the logit of every token already in the prompt or output by P (multiply a negative "
                        "one), as transformers' repetition_penalty does, e.g. 1.2 "
                        "(default: 1.0, none)")
    p.add_argument("--no-repeat-ngram-size", type=int, metavar="N",
                   help="never repeat an N-token sequence of the prompt or output, as transformers' "
                        "no_repeat_ngram_size does, unless the schema allows nothing else (default: 0, none)")


def config_name(text: str) -> str:
    """A ``--config`` architecture name, with a did-you-mean for a typo (argparse's ``type``)."""
    if text in CONFIGS:
        return text
    close = difflib.get_close_matches(text, list(CONFIGS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise argparse.ArgumentTypeError(f"unknown architecture {text!r}; {hint}(known: {', '.join(CONFIGS)})")


def pass_cost_arguments(p: argparse.ArgumentParser) -> None:
    """The pass-cost measurement's options on ``p`` (changes the parser)."""
    model_options(p)
    p.add_argument("--config", type=config_name, metavar="NAME",
                   help=f"instead of --model: a random-weight model of this architecture ({', '.join(CONFIGS)})")
    p.add_argument("--batch-sizes", default="1,8,16", metavar="B,...", help="rows per pass")
    p.add_argument("--windows", default="1,4,8,16", metavar="W,...", help="tokens fed per row and pass")
    p.add_argument("--context", type=positive, default=512, metavar="N",
                   help="kept KV slots per row before the timed passes")
    p.add_argument("--repeats", type=positive, default=5, metavar="N", help="timed passes per cell (the median)")
    p.add_argument("--accepted", type=float, default=3.0, metavar="T",
                   help="output tokens per row and pass, for tokens/s")
    p.add_argument("--json", metavar="PATH", help="also write the cells as JSON")
    p.add_argument("--store", action="store_true",
                   help="measure and store the pass-cost curve decoding reads, as structspec calibrate does")
