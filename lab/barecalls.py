"""``python -m lab.barecalls``: `ToolCalls(choice="auto")` on a chat model with bare calls
off (before: a call the model writes as JSON without the ``<tool_call>`` markers is text) and on (after: a turn that
opens with one is a call), on agent turns written by others.

The default turns (``tests/data/bfcl_multiple.jsonl`` in a clone) are the first 16 of the Berkeley Function Calling
Leaderboard's "multiple" set (a user's question and 2–4 tools; one call expected), converted to toolbench's
conversation format (`toolbench.load_conversations`). Each turn is decoded greedily in both modes with the
default decoding (fast-forward and prompt lookup), the tools in the chat template. The report reads the results'
own stats: calls made (valid calls of a given tool), calls to the expected tool, exact arguments, turns answered
in text, calls left in ``unmarked_calls``, forced tokens, target passes, and seconds per turn and per call made.
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import structspec
from structspec.models.transformers_lm import LM
from structspec.tools.arguments import THROUGHPUT_MODEL
from structspec.tools.benchmarks.toolbench import Conversation, load_conversations, same_call, value_calls
from structspec.tools.command import budget, calibrate_option, drafting_curve, model_options, positive

MODES = {"bare calls off (before)": False, "bare calls on (after)": True}
BFCL = Path(__file__).resolve().parents[1] / "tests" / "data" / "bfcl_multiple.jsonl"


@dataclass
class Counts:
    """One mode's totals over the turns."""

    turns: int = 0
    calls: int = 0  # valid calls of a given tool, in `ToolCallsValue.calls`
    right_tool: int = 0  # of them, calls to the expected tool, in the expected place
    exact: int = 0  # of them, calls whose name and arguments equal the expected ones
    text_turns: int = 0  # complete turns without a call
    unmarked: int = 0  # calls left in `ToolCallsValue.unmarked_calls` (written as text, not run)
    incomplete: int = 0  # turns that stopped before their end (the token budget)
    output_tokens: int = 0
    forced: int = 0
    passes: int = 0
    seconds: float = 0.0

    def add(self, conversation: Conversation, r: structspec.Result, seconds: float) -> None:
        """Count one turn's result."""
        self.turns += 1
        self.seconds += seconds
        self.output_tokens += r.stats.output_tokens
        self.forced += r.stats.forced_tokens
        self.passes += r.stats.target_forward_passes
        if not r.complete or r.value is None:
            self.incomplete += 1
            return
        calls = value_calls(r.value)
        self.calls += len(calls)
        self.right_tool += sum(a["name"] == b["name"] for a, b in zip(calls, conversation.expected))
        self.exact += sum(same_call(a, b) for a, b in zip(calls, conversation.expected))
        self.text_turns += not calls
        self.unmarked += len(r.value.unmarked_calls)


def run(lm: LM, conversations: list[Conversation], max_new_tokens: int,
        calibrate: bool = False) -> tuple[dict[str, Counts], list[str]]:
    """Both modes over ``conversations`` (greedy), after saying the model's pass-cost curve (`drafting_curve`) and a warm-up
    of each mode; the counts by mode, and a line per turn and mode (what it wrote). Runs the model; changes
    nothing else but the curve's cache."""
    drafting_curve(lm, calibrate)
    counts = {mode: Counts() for mode in MODES}
    lines = []
    with warnings.catch_warnings():  # (the unmarked calls' warning: counted instead)
        warnings.simplefilter("ignore", UserWarning)
        for bare in MODES.values():
            warm = conversations[0]
            structspec.generate_result(lm, structspec.ToolCalls(warm.tools, bare_calls=bare), warm.messages,
                                       max_new_tokens=2)
        for conversation in conversations:
            for mode, bare in MODES.items():
                spec = structspec.ToolCalls(conversation.tools, choice="auto", parallel=conversation.parallel,
                                            bare_calls=bare)
                start = time.perf_counter()
                r = structspec.generate_result(lm, spec, conversation.messages, max_new_tokens=max_new_tokens)
                counts[mode].add(conversation, r, time.perf_counter() - start)
                made = [c.name for c in r.value.calls] if r.complete and r.value is not None else r.stop_reason
                lines.append(f"{conversation.id} | {mode} | {made} | {r.stats.forced_tokens} forced | {r.text[:60]!r}")
    return counts, lines


HEADER = ["mode", "calls made", "expected tool", "exact arguments", "turns in text", "unmarked calls", "incomplete",
          "output tokens", "forced tokens", "target passes", "s / turn", "s / call made"]


def markdown(counts: dict[str, Counts]) -> str:
    """The report as a Markdown table."""
    rows = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for mode, c in counts.items():
        per = [f"{c.seconds / n:.3f}" if n else "–" for n in (c.turns, c.calls)]
        rows.append("| " + " | ".join([mode, *(str(getattr(c, f.name)) for f in fields(Counts)
                                                  if f.name not in ("turns", "seconds")), *per]) + " |")
    return "\n".join(rows)


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages (Linux), beside the seconds they bear on."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(args: argparse.Namespace) -> int:
    """Run both modes over the turns ``args`` names on the model it names and print the Markdown table."""
    if not args.data.exists():
        print(f"no turns at {args.data}: pass --data PATH (toolbench's conversation format, one a line)")
        return 2
    lm = structspec.load(args.model, args.device, args.dtype, args.kernels, threads=args.threads)
    conversations = load_conversations(args.data, args.limit)
    print(f"{lm.name} ({str(lm.dtype).removeprefix('torch.')} on {lm.device}), {len(conversations)} turns of "
          f"{args.data.name}, choice='auto', greedy, load average before: {_loadavg()}\n")
    counts, lines = run(lm, conversations, args.max_new_tokens, args.calibrate)
    print(markdown(counts))
    print(f"\nSeconds in all: {', '.join(f'{m} {c.seconds:.1f}' for m, c in counts.items())}; load average after: "
          f"{_loadavg()}\n")
    print("\n".join(lines))
    return 0


def arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options on ``p`` (changes the parser)."""
    p.description = __doc__.split("\n\n")[0] if __doc__ else None
    model_options(p, THROUGHPUT_MODEL)
    p.add_argument("--data", type=Path, default=BFCL, metavar="PATH",
                   help="turns in toolbench's conversation format, one a line (default: the 16 BFCL turns)")
    p.add_argument("--limit", type=positive, metavar="N", help="only the first N turns (a smoke run)")
    budget(p)
    calibrate_option(p)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    arguments(parser)
    raise SystemExit(main(parser.parse_args()))
