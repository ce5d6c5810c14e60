"""The walk of one row's turn through the decoding wing: which of its files call which, and how much code runs.

    python -m lab.rowwalk [--turn K]

docs/architecture.md's figures come from here. A greedy prompt-lookup row on the tiny byte-level model
(`structspec.testing.tiny_lm`; a prompt that repeats the JSON its schema asks for, so prompt lookup drafts) is
streamed (`structspec.stream`); the ``K``-th turn that yields text is traced with `sys.setprofile`, from the
event before it to its own. Printed: the distinct calls from a function in one of the decoding wing's files to
a function in another (caller and callee named), the files whose code ran, and the lines of the functions that
ran, each counted whole (a nested function again), by file: the core of a turn (driver, pass, row, cursor, window,
masks, verdict, chain and candidate) and with what it calls (forced text, prompt lookup, cost model).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Any

import structspec
from structspec.testing import tiny_lm

WING = os.path.join(os.path.dirname(structspec.__file__), "decoding")
# the files of a turn's core, then those it calls (docs/architecture.md names both counts)
CORE = ("loop.py", "passes.py", "row.py", "cursor.py", "window.py", "masks.py", "verify.py", "chain.py",
        "candidate.py")
CALLED = ("fastforward.py", "drafters/lookup.py", "cost.py")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "city", "tags"]}
PROMPT = ('Records: {"name": "Ada Lovelace", "city": "London", "tags": ["math", "engines"]} and '
          '{"name": "Alan Turing", "city": "Wilmslow", "tags": ["math", "codes"]}. The first again as JSON:')


def in_wing(code: CodeType) -> str | None:
    """``code``'s file relative to the decoding wing, None where it lies outside it."""
    path = os.path.abspath(code.co_filename)
    return os.path.relpath(path, WING) if path.startswith(WING + os.sep) else None


def lines(code: CodeType) -> int:
    """A function's lines, counted whole: from its ``def`` to its last line."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return last - code.co_firstlineno + 1


class Trace:
    """The calls a `sys.setprofile` hook saw: functions that ran in the wing, and calls across its files."""

    def __init__(self) -> None:
        self.ran: set[CodeType] = set()
        self.calls: set[tuple[str, str]] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (callee := in_wing(frame.f_code)) is None:
            return
        self.ran.add(frame.f_code)
        caller = frame.f_back
        if caller is not None and (source := in_wing(caller.f_code)) is not None and source != callee:
            self.calls.add((f"{source}:{caller.f_code.co_qualname}", f"{callee}:{frame.f_code.co_qualname}"))


def traced_turn(turn: int) -> Trace:
    """The ``turn``-th turn that yields text (from 2) of the row above, traced from the text before it."""
    lm = tiny_lm("byte_level")
    events = iter(structspec.stream(lm, SCHEMA, PROMPT, draft="prompt_lookup", max_new_tokens=96))
    trace = Trace()
    for _ in range(turn - 1):
        next(e for e in events if isinstance(e, structspec.TextChunk))
    sys.setprofile(trace)
    try:
        next(e for e in events if isinstance(e, structspec.TextChunk))
    finally:
        sys.setprofile(None)
    for _ in events:  # the rest of the row, untraced
        pass
    return trace


def summary(trace: Trace) -> str:
    by_file: dict[str, list[CodeType]] = {}
    for code in trace.ran:
        by_file.setdefault(in_wing(code) or "", []).append(code)
    out = [f"{len(trace.calls)} distinct calls between the decoding wing's files, in {len(by_file)} files:"]
    out += [f"  {a} -> {b}" for a, b in sorted(trace.calls)]
    out.append("functions that ran, by file (lines counted whole):")
    out += [f"  {name}: {len(codes)} functions, {sum(map(lines, codes))} lines"
            for name, codes in sorted(by_file.items())]
    for title, files in (("core of a turn", CORE), ("with forced text, prompt lookup and the cost model",
                                                    CORE + CALLED)):
        codes = [c for name in files for c in by_file.get(name, [])]
        out.append(f"{title} ({', '.join(files)}): {sum(map(lines, codes))} lines in {len(codes)} functions")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.rowwalk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turn", type=int, default=3, help="which turn that yields text to trace (from 2; default 3)")
    args = parser.parse_args(argv)
    if args.turn < 2:
        parser.error("--turn counts from 2: the turn before it is where the trace starts")
    print(summary(traced_turn(args.turn)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
