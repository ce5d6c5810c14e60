"""What a batched verify pass costs: seconds per pass against rows and tokens fed, on any device.

    python -m structspec.tools.pass_cost --model qwen2.5-coder-0.5b --dtype bfloat16
    python -m structspec.tools.pass_cost --config qwen2.5-7b --device cuda --batch-sizes 1,8,16,32,64

``--config`` builds a random-weight model from a named architecture (no weights
needed: on a GPU machine without a model hub this is the way to measure), with
the tiny in-process byte-level tokenizer for the masks. Each cell times the
engine's own pass — `LM.forward_slots` over B rows' W-token windows packed into
one sequence (`structspec.models.packed_slots`), each row after ``--context``
kept slots of its own, one packed bitmask filled for every logits row and
applied, one argmax read back — as the batched loop runs it.
Tokens/s assumes ``--accepted`` output tokens per row and pass (acceptance
comes from a run on real weights: random weights rarely agree with a draft).

``--store`` measures and stores instead the one curve decoding reads (draft
lengths and the tokens a pass feeds, `structspec.decoding.cost`), as
``structspec calibrate`` does (`structspec.decoding.calibrate`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import structspec
from structspec.automaton import apply_token_bitmask_inplace
from structspec.decoding.calibrate import calibrate
from structspec.models.device import resolve_device
from structspec.models.invariance import pack_for_cpu, should_pack
from structspec.models.loading import load
from structspec.models.packed_slots import PackedSlots
from structspec.models.transformers_lm import LM
from structspec.tools.arguments import CONFIGS, pass_cost_arguments
from structspec.tools.command import EXIT_CODES, Formatter, run_command


def random_model(name: str, device: torch.device, dtype: torch.dtype) -> LM:
    """A random-weight model of architecture ``name`` (see `CONFIGS`), built directly on ``device``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from structspec.testing import byte_level_tokenizer

    config = Qwen2Config(**CONFIGS[name])
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return LM(model, byte_level_tokenizer(), name=f"random {name}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def pass_seconds(lm: LM, rows: int, window: int, context: int, repeats: int,
                 forced: bool = False) -> tuple[float, float]:
    """Median seconds of one engine pass (B=``rows`` windows of ``window`` tokens, each after ``context`` kept
    slots of its own row, packed into one sequence as the batched loop packs them: `PackedSlots`), and of its
    model forward alone. ``forced``: every row but a window's last allows one token, as in a verify pass over
    forced text (no LM head, no mask there: the verify-row savings at their most)."""
    device = lm.device
    fsm = structspec.compile(structspec.Regex(r"[a-z ]{1,4000}"), lm).fsm
    generator = torch.Generator().manual_seed(0)
    vocab = min(len(lm.vocab), lm.logits_width)
    one = torch.tensor([3])
    widths = [window] * rows
    if lm.batchable:
        prompt = lm.new_cache()
        lm.forward(torch.randint(3, vocab, (context,), generator=generator).tolist(), prompt)
        slots = PackedSlots(lm.new_cache(), rows)
        for row in range(rows):
            slots.place(row, context, prompt)
    elif rows != 1:  # sliding-window layers (Gemma 3): one sequence through the single-row path
        raise ValueError(f"{lm.name} runs one row per pass (sliding-window layers): use --batch-sizes 1")
    else:
        cache = lm.new_cache()
        lm.forward(torch.randint(3, vocab, (context,), generator=generator).tolist(), cache)
    times, forwards = [], []
    for step in range(repeats + 1):
        tokens = torch.randint(3, vocab, (rows * window,), generator=generator).tolist()
        wanted = list(range(rows * window))
        allowed = [None if j % window == window - 1 else one for j in wanted] if forced else None
        full = [r for r in wanted if allowed is None or allowed[r] is None]  # rows the mask covers
        if lm.batchable:
            positions = [context + step * window + j for _ in range(rows) for j in range(window)]
            attend = slots.window_mask(widths)
        _sync(device)
        t0 = time.perf_counter()
        if lm.batchable:
            logits = lm.forward_slots([tokens], [positions], attend, slots.kv, [(0, j) for j in wanted], allowed)
        else:
            logits = lm.forward(tokens, cache, logits_to_keep=window, allowed=allowed)
        _sync(device)
        forward = time.perf_counter() - t0
        bitmask = fsm.allocate_token_bitmask(len(full))
        for r in range(len(full)):
            fsm.fill_next_token_bitmask(bitmask, r, fsm.initial_state)
        apply_token_bitmask_inplace(logits[full], bitmask.to(device, non_blocking=True))
        logits.argmax(-1).tolist()
        _sync(device)
        if step:  # the first pass warms up kernels and allocators
            times.append(time.perf_counter() - t0)
            forwards.append(forward)
        if lm.batchable:
            slots.keep(widths, widths)
    return statistics.median(times), statistics.median(forwards)


def main(argv: list[str] | None = None) -> int:
    """``python -m structspec.tools.pass_cost``: parse ``argv`` and `run`, as ``structspec pass-cost`` does."""
    parser = argparse.ArgumentParser(prog="python -m structspec.tools.pass_cost", description=__doc__,
                                     epilog=EXIT_CODES, formatter_class=Formatter, allow_abbrev=False)
    pass_cost_arguments(parser)
    return run_command("pass-cost", run, parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Measure and print the pass-cost table for ``args`` (see `structspec.tools.arguments.pass_cost_arguments`)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = resolve_device(args.device, args.dtype)
    lm = (random_model(args.config, device, dtype) if args.config
          else load(args.model, device=args.device, dtype=args.dtype, kernels=args.kernels))
    if args.config and should_pack(args.kernels, device, dtype):
        pack_for_cpu(lm.model)  # as `load` does
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{lm.name} on {gpu}, {str(dtype).removeprefix('torch.')}, {lm.kernels} kernels, context {args.context}")
    if args.store:  # the one curve decoding reads, as `structspec calibrate` stores it
        calibration = calibrate(lm)
        print(" ".join(f"{fed}: {s * 1e3:.1f}" for fed, s in calibration.seconds.items()) + " ms a packed pass")
        print(f"stored in {calibration.path}" if calibration.stored else "not stored: the machine was busy")
        return 0
    cells = []
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    base = None
    # "forced": the same pass where every row but a window's last allows one token (verify-row savings)
    print(f"{'rows':>5} {'fed/row':>8} {'ms/pass':>9} {'forward ms':>11} {'× 1×1':>7} {'tokens/s':>10} "
          f"{'forced ms':>10} {'× 1×1':>7}")
    for rows in sizes:
        for window in windows:
            seconds, forward = pass_seconds(lm, rows, window, args.context, args.repeats)
            forced = pass_seconds(lm, rows, window, args.context, args.repeats, forced=True)[0]
            base = base or seconds
            accepted = min(args.accepted, window)
            cell = {"rows": rows, "window": window, "ms": seconds * 1e3, "forward_ms": forward * 1e3,
                    "relative": seconds / base, "tokens_per_s": rows * accepted / seconds,
                    "forced_ms": forced * 1e3, "forced_relative": forced / base}
            cells.append(cell)
            print(f"{rows:>5} {window:>8} {cell['ms']:>9.2f} {cell['forward_ms']:>11.2f} {cell['relative']:>7.2f} "
                  f"{cell['tokens_per_s']:>10.0f} {cell['forced_ms']:>10.2f} {cell['forced_relative']:>7.2f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": lm.name, "device": gpu, "dtype": str(dtype), "context": args.context,
                       "accepted": args.accepted, "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
