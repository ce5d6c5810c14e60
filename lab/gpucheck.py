"""What a pass costs on a lent GPU: the engine's packed pass, the share of a decode turn spent outside the model,
and transformers' one-token step beside them, with random weights in the shapes of Qwen2.5-0.5B and 7B.

    python -m lab.gpucheck                       # CUDA, bfloat16, both shapes (< 8 min)
    python -m lab.gpucheck --device cpu --quick  # a tiny model, seconds: checks that it runs

Nothing is downloaded: the models are built from their published shapes (`structspec.tools.arguments.CONFIGS`,
transformers' ``Qwen2Config`` and ``AutoModelForCausalLM.from_config``) with random weights, and the tokenizer
is Qwen2.5's own, read from the repository's ``tests/data/qwen2.5-tokenizer`` (``--quick``: the tiny byte-level
one), so the masks cover a real 151,665-token vocabulary. Three measurements per shape:

- the packed pass (`structspec.decoding.calibrate.packed_seconds`: ``LanguageModel.forward_slots`` over rows
  of ``--context`` kept slots, each row fed 1 to 16 tokens), in ms and relative to one row fed one token: what
  `structspec calibrate` stores, over more rows;
- a decode turn against its forward: plain masked decoding (no drafts, no fast-forward) of one row and of a
  batch, every forward timed where it runs (synchronised before and after), the rest of the wall time (masks,
  token choice, bookkeeping, synchronisations) as the share outside the model; per pass of the difference
  between a long and a half-as-long decode, so the prefill does not count;
- transformers' own greedy step (one token fed, its cache, the argmax read back), the floor a decode turn is
  compared with.

Random weights choose random tokens, so no drafting figure is measured here (acceptance needs real weights).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import inspect
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import structspec
from structspec.decoding.calibrate import packed_seconds
from structspec.models.transformers_lm import LM
from structspec.tools.arguments import CONFIGS

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "qwen2.5-tokenizer"
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096, tie_word_embeddings=True)  # a tiny Qwen2 (its vocabulary: the tokenizer's)


def qwen_tokenizer() -> Any:
    """Qwen2.5's tokenizer from the repository's test data (no download); `FileNotFoundError` naming the folder
    outside a clone."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if not (TOKENIZER / "tokenizer.json.gz").exists():
        raise FileNotFoundError(f"{TOKENIZER} is missing: run the check from a clone of the repository")
    config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    spec = gzip.decompress((TOKENIZER / "tokenizer.json.gz").read_bytes()).decode()
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec), bos_token=config["bos_token"],
                                   eos_token=config["eos_token"], pad_token=config["pad_token"])


def random_lm(shape: dict[str, Any], tokenizer: Any, device: torch.device, dtype: torch.dtype, name: str) -> LM:
    """A random-weight Qwen2 of ``shape`` built directly on ``device`` in ``dtype``, with ``tokenizer``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    vocab = shape.get("vocab_size") or -(-len(tokenizer) // 64) * 64
    torch.manual_seed(0)
    config = Qwen2Config(**{**shape, "vocab_size": vocab})
    with device:
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:  # a transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    return LM(model, tokenizer, name=f"random {name}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextmanager
def timed_forwards(lm: LM) -> Iterator[list[float]]:
    """Within the block, each of ``lm``'s forward calls (one row or packed) timed where it runs, synchronised
    before and after: the seconds of each, in a list. Changes ``lm``'s methods for the block only."""
    seconds: list[float] = []
    names = [name for name in ("forward", "forward_slots") if callable(getattr(lm, name, None))]
    originals = {name: getattr(lm, name) for name in names}

    def timing(call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            _sync(lm.device)
            t0 = time.perf_counter()
            out = call(*args, **kwargs)
            _sync(lm.device)
            seconds.append(time.perf_counter() - t0)
            return out
        return timed

    for name, call in originals.items():
        setattr(lm, name, timing(call))
    try:
        yield seconds
    finally:
        for name in names:
            delattr(lm, name)  # the class's own methods again


def decode_turns(lm: LM, rows: int, chars: int, prompt_words: int, repeats: int) -> dict[str, Any]:
    """Plain masked decoding (no drafts, no fast-forward) of ``rows`` rows of ``chars`` letters, and of half as
    many, after a prompt of ``prompt_words`` words, after one untimed run, each the fastest of ``repeats``: the
    difference of the two, per pass (so the prefill and a call's fixed costs cancel out), in wall ms, forward ms
    and the share outside the model; and the first row's prompt and output tokens. Runs the model."""
    prompts = [f"Row {i}: " + " ".join(["letters"] * prompt_words) for i in range(rows)]

    def run(length: int) -> tuple[float, list[float], structspec.Result]:
        """Wall seconds, each forward's seconds, and the first row's result, of a decode of ``length`` letters."""
        spec = structspec.Regex(f"[a-z ]{{{length}}}")
        options = dict(draft=None, fast_forward="off", max_new_tokens=length + 8)
        with timed_forwards(lm) as forwards:
            _sync(lm.device)
            t0 = time.perf_counter()
            if rows == 1:
                first = structspec.generate_result(lm, spec, prompts[0], **options)
            else:
                first = structspec.generate_batch(lm, spec, prompts, batch_size=rows, **options)[0]
            _sync(lm.device)
        return time.perf_counter() - t0, forwards, first

    run(chars)  # compile, first kernels
    (wall, forwards, first), (short_wall, short_forwards, _) = (
        min((run(length) for _ in range(repeats)), key=lambda timed: timed[0]) for length in (chars, chars // 2))
    passes = len(forwards) - len(short_forwards)
    if passes <= 0:  # (tokens of random lengths): the long run alone, prefill included
        passes, short_wall, short_forwards = len(forwards), 0.0, []
    wall, forward = wall - short_wall, sum(forwards) - sum(short_forwards)
    return {"rows": rows, "passes": passes, "ms_per_pass": wall / passes * 1e3,
            "forward_ms_per_pass": forward / passes * 1e3, "outside_share": 1 - forward / wall,
            "prompt_tokens": first.stats.prompt_tokens, "output_tokens": first.stats.output_tokens}


@torch.no_grad()
def transformers_step_ms(lm: LM, context: int, steps: int) -> float:
    """Median ms of transformers' own greedy step on ``lm.model``: one token fed after ``context`` cached ones,
    its argmax read back. Runs the model."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(lm.tokenizer), (1, context), generator=generator).to(lm.device)
    # the cache passed in is filled in place; its keyword is "cache" where transformers deprecates the older one
    keyword = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
    cache = DynamicCache()
    token = lm.model(input_ids=ids, use_cache=True, **{keyword: cache}).logits[:, -1:].argmax(-1)
    times = []
    for step in range(steps + 1):
        _sync(lm.device)
        t0 = time.perf_counter()
        token = lm.model(input_ids=token, use_cache=True, **{keyword: cache}).logits[:, -1:].argmax(-1)
        token.item()  # the read-back every step of a generate loop waits for
        if step:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def check(lm: LM, quick: bool, context: int, repeats: int, rows_grid: list[int], fed_grid: list[int]) -> dict[str, Any]:
    """The three measurements of one model (module doc), the packed pass at each of ``rows_grid`` × ``fed_grid``
    (tokens per row), printed as they come; their numbers."""
    print(f"\n{lm.name}: {sum(p.numel() for p in lm.model.parameters()) / 1e9:.2f} B parameters, "
          f"{str(lm.dtype).removeprefix('torch.')} on {_device_name(lm.device)}, context {context}", flush=True)
    print(f"{'rows':>5} {'fed/row':>8} {'ms/pass':>9} {'× 1×1':>7}")
    passes, base = [], None
    for rows in rows_grid:
        seconds = packed_seconds(lm, rows, [rows * fed for fed in fed_grid], context, repeats)
        for fed in fed_grid:
            ms = seconds[rows * fed] * 1e3
            base = base or ms
            passes.append({"rows": rows, "fed_per_row": fed, "ms": ms, "relative": ms / base})
            print(f"{rows:>5} {fed:>8} {ms:>9.2f} {ms / base:>7.2f}", flush=True)
    chars, words = (24, 8) if quick else (160, 200)
    turns = [decode_turns(lm, rows, chars, words, repeats) for rows in ((1, 2) if quick else (1, 8))]
    print(f"{'decode':>7} {'rows':>5} {'passes':>7} {'ms/pass':>9} {'forward ms':>11} {'outside':>8}")
    for turn in turns:
        print(f"{'':>7} {turn['rows']:>5} {turn['passes']:>7} {turn['ms_per_pass']:>9.2f} "
              f"{turn['forward_ms_per_pass']:>11.2f} {turn['outside_share']:>8.0%}", flush=True)
    alone = turns[0]  # transformers' step at the context of its turns' middle
    step = transformers_step_ms(lm, alone["prompt_tokens"] + alone["output_tokens"] // 2, 2 if quick else 32)
    print(f"transformers one-token step: {step:.2f} ms (structspec's one-row turn: "
          f"{turns[0]['ms_per_pass'] / step:.2f}×)", flush=True)
    return {"model": lm.name, "dtype": str(lm.dtype).removeprefix("torch."), "device": _device_name(lm.device),
            "context": context, "passes": passes, "decode": turns, "transformers_step_ms": step}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.gpucheck``: build each shape, measure it, print the tables (and
    ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m lab.gpucheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                        help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--shapes", default=",".join(CONFIGS), help=f"among {', '.join(CONFIGS)}")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model and the byte-level tokenizer, small grids: seconds, to check it runs")
    parser.add_argument("--context", type=int, default=512, help="kept KV slots per row before the timed passes")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per cell (the median)")
    parser.add_argument("--rows", default="1,8,32,64", metavar="B,...", help="rows of the packed passes")
    parser.add_argument("--fed", default="1,4,16", metavar="W,...", help="tokens fed per row in the packed passes")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.quick:
        from structspec.testing import byte_level_tokenizer

        models = [("tiny", QUICK, byte_level_tokenizer())]
        context, repeats, rows, fed = min(args.context, 32), 1, [1, 2], [1, 2]
    else:
        tokenizer = qwen_tokenizer()
        models = [(name, CONFIGS[name], tokenizer) for name in args.shapes.split(",")]
        context, repeats = args.context, args.repeats
        rows, fed = [int(b) for b in args.rows.split(",")], [int(w) for w in args.fed.split(",")]
    print(f"torch {torch.__version__}, structspec {structspec.__version__}")
    reports = []
    for name, shape, tokenizer in models:
        lm = random_lm(shape, tokenizer, device, dtype, name)
        reports.append(check(lm, args.quick, context, repeats, rows, fed))
        del lm  # freed before the next shape is built
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "reports": reports}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
