"""`python -m lab.maskbench`: a new schema's cost in a serving engine, structspec against
xgrammar and llguidance on one tokenizer.

Each case is a JSON Schema and one valid output: the extraction schemas of ``examples/`` (with their tasks'
expected records and a few more written here) and up to ``--count`` schemas of each JSONSchemaBench split (with
a valid instance of each that structspec's automaton accepts). The output is the instance as compact JSON,
tokenized by the tokenizer, then EOS. Every engine replays the same tokens the way an engine's loop does:
compile the schema, fill the first bitmask (together: *compile + first mask*), then per token accept it and fill
the next bitmask (*per token*). A token position is a *first visit* when structspec's state after it was not met
before in this output (its mask is computed then), else *warm*; every engine is split by the same positions.

Each engine's tokenizer-side preparation (structspec's vocabulary, xgrammar's ``TokenizerInfo`` and
``GrammarCompiler``, llguidance's ``LLTokenizer``) is done once, before any timing; compiled schemas are not
cached between cases (structspec's compile cache is cleared, xgrammar's compiler caches nothing). structspec
keeps what it learns per tokenizer (the walks of its tokens through each region shape, see
docs/concepts/token-index.md); ``--cold`` forgets that too before each case. xgrammar and llguidance are optional:
an engine that is not installed is named and left out. Once everything is loaded, before any timing, the objects
alive are frozen out of the cyclic collector's passes (``gc.freeze``), as vLLM's engine core does after start-up
(`vllm.utils.gc_utils.freeze_gc_heap`): a full pass over the loaded libraries (~200k objects, a few hundred ms) is
a start-up cost a server does not pay per request; ``--no-freeze`` keeps them (every engine replays under either).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import structspec
from lab.coverage import DEFAULT_DATA, load_rows
from lab.maskbench_engines import ENGINES, Engine, StructspecEngine, make_engines
from structspec.errors import StructspecError
from structspec.tools.tasks import example_file, load_schemas, load_tasks

TOKENIZER = Path("tests/data/qwen2.5-tokenizer")
JSONSCHEMABENCH = DEFAULT_DATA  # the coverage benchmark's: the shared data beside the clone

# Extraction schemas beyond examples/schemas.py, with one valid output each: dates by pattern, optional fields,
# arrays of objects, nesting.
_STRING, _INTEGER = {"type": "string"}, {"type": "integer"}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


MORE_SCHEMAS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "person": (_object(["name", "birth_date"], name=_STRING,
                       birth_date={"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}, nickname=_STRING,
                       age=_INTEGER),
               {"name": "Ada Lovelace", "birth_date": "1815-12-10", "age": 36}),
    "order": (_object(["order_id", "customer", "lines", "paid"],
                      order_id={"type": "string", "pattern": r"^[A-Z]{3}-\d{6}$"},
                      customer=_object(["name", "email"], name=_STRING, email=_STRING),
                      lines={"type": "array", "items": _object(["sku", "qty", "price"], sku=_STRING, qty=_INTEGER,
                                                               price={"type": "number"})},
                      paid={"type": "boolean"}),
              {"order_id": "ORD-004217", "customer": {"name": "Jon Smith", "email": "jon@example.com"},
               "lines": [{"sku": "A-12", "qty": 2, "price": 9.5}, {"sku": "B-7", "qty": 1, "price": 120}],
               "paid": True}),
    "meeting": (_object(["title", "start", "kind", "attendees"], title=_STRING,
                        start={"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$"},
                        duration_minutes=_INTEGER, kind={"enum": ["call", "in_person", "video"]},
                        attendees={"type": "array", "items": _STRING}, notes={"type": ["string", "null"]}),
                {"title": "Quarterly review", "start": "2026-03-04T14:30", "duration_minutes": 45, "kind": "video",
                 "attendees": ["Maria", "Tom", "Yuki"], "notes": None}),
}


@dataclass(frozen=True)
class Case:
    """One schema (a JSON Schema object) and the tokens of one valid output, EOS last."""

    group: str
    name: str
    schema: dict[str, Any]
    token_ids: list[int]


@dataclass
class Timings:
    """One engine's seconds over one group of cases: compile + first mask per case, and per token by kind."""

    compile_first: list[float] = field(default_factory=list)
    first_visit: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    accepted: int = 0  # cases whose whole output the engine accepted (EOS included)
    failed: list[str] = field(default_factory=list)  # cases it could not compile or rejected, with why


def load_tokenizer(path: Path = TOKENIZER) -> Any:
    """A Hugging Face fast tokenizer from ``tokenizer.json`` (or ``tokenizer.json.gz``) and
    ``tokenizer_config.json`` in ``path`` (no model needed)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    config = json.loads((path / "tokenizer_config.json").read_text())
    plain = path / "tokenizer.json"
    spec = plain.read_text() if plain.exists() else gzip.decompress((path / "tokenizer.json.gz").read_bytes()).decode()
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec), bos_token=config.get("bos_token"),
                                   eos_token=config["eos_token"], pad_token=config.get("pad_token"))


def compact(instance: Any) -> str:
    """The output structspec's default whitespace writes: compact JSON, non-ASCII kept."""
    return json.dumps(instance, separators=(",", ":"), ensure_ascii=False)


def extraction_cases(tokenizer: Any) -> list[Case]:
    """The extraction schemas with one valid output each: examples/schemas.py's with their first task's expected
    record, examples/invoice.schema.json with a task's invoice, and `MORE_SCHEMAS`."""
    tasks = load_tasks()
    pairs: list[tuple[str, dict[str, Any], Any]] = []
    for name, model in load_schemas().items():
        expected = next(t.expected for t in tasks if t.schema_name == name)
        pairs.append((name, model.model_json_schema(), model.model_validate(expected).model_dump(mode="json")))
    invoice = json.loads(example_file("invoice.schema.json").read_text())
    pairs.append(("invoice.schema.json", invoice, next(t.expected for t in tasks if t.schema_name == "invoice")))
    pairs += [(name, schema, instance) for name, (schema, instance) in MORE_SCHEMAS.items()]
    return [Case("extraction", name, schema, _tokens(tokenizer, instance)) for name, schema, instance in pairs]


def jsonschemabench_cases(tokenizer: Any, data: Path, splits: list[str], count: int,
                          fits: Callable[[Case], bool]) -> Iterator[Case]:
    """Up to ``count`` schemas of each split (spread over the file) with a valid instance whose output ``fits``
    (structspec compiles the schema and accepts it)."""
    for split in splits:
        found = 0
        for row in load_rows(data, split):
            if found >= count:
                break
            for test in row.get("tests") or []:
                if test.get("valid") and isinstance(row["schema"], dict):
                    case = Case(split, row["id"], row["schema"], _tokens(tokenizer, test["data"]))
                    if fits(case):
                        found += 1
                        yield case
                        break


def _tokens(tokenizer: Any, instance: Any) -> list[int]:
    return list(tokenizer.encode(compact(instance), add_special_tokens=False)) + [tokenizer.eos_token_id]


def replay(engine: Engine, case: Case, first_visits: list[bool], timings: Timings) -> None:
    """Compile ``case`` on ``engine`` and accept its tokens, timing each part into ``timings``."""
    if isinstance(engine, StructspecEngine):
        engine.forget()  # (its tokenizer side stays)
    start = time.perf_counter()
    try:
        engine.start(case.schema)
    except Exception as error:  # a peer's own refusal of a schema is a result to count, of any type
        timings.failed.append(f"{case.name}: compile: {type(error).__name__}: {str(error)[:120]}")
        return
    timings.compile_first.append(time.perf_counter() - start)
    spent = []
    for position, token in enumerate(case.token_ids):
        start = time.perf_counter()
        ok = engine.step(token)
        spent.append(time.perf_counter() - start)
        if not ok:
            timings.failed.append(f"{case.name}: rejected token {position} ({token})")
            return
    timings.accepted += 1
    for seconds, first in zip(spent, first_visits):
        (timings.first_visit if first else timings.warm).append(seconds)


def first_visits(engine: StructspecEngine, case: Case) -> list[bool]:
    """Per token of ``case``: whether structspec's state after it is met for the first time in this output."""
    seen = {engine.fsm.initial_state}
    marks = []
    for state in engine.states(case.token_ids):
        marks.append(state is not None and state not in seen)  # (EOS: no mask to compute)
        seen.add(state)
    return marks


def fits_structspec(engine: StructspecEngine) -> Callable[[Case], bool]:
    """Whether structspec compiles a case's schema and accepts its whole output (EOS included)."""
    def fits(case: Case) -> bool:
        try:
            engine.start(case.schema)
        except (StructspecError, RecursionError):
            return False
        ok = engine.accepts(case.token_ids)
        structspec.clear_cache()
        return ok
    return fits


def run(cases: list[Case], engines: list[Engine]) -> dict[tuple[str, str], Timings]:
    """(group, engine name) → `Timings`, every engine replaying every case in turn."""
    reference = engines[0]
    assert isinstance(reference, StructspecEngine)
    results: dict[tuple[str, str], Timings] = {}
    for case in cases:
        reference.start(case.schema)
        marks = first_visits(reference, case)
        for engine in engines:
            replay(engine, case, marks, results.setdefault((case.group, engine.name), Timings()))
    return results


def _stat(seconds: list[float], q: float | None = None) -> str:
    if not seconds:
        return "–"
    value = float(np.mean(seconds)) if q is None else float(np.quantile(seconds, q))
    return f"{value * 1e3:.1f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} µs"


HEADER = ("| group | engine | cases accepted | compile + first mask p50 / p99 | first visit p50 / p99 / mean "
          "(tokens) | warm p50 / p99 / mean (tokens) |")


def markdown(results: dict[tuple[str, str], Timings], cases: dict[str, int]) -> str:
    """The results as a Markdown table, one row per group and engine."""
    lines = [HEADER, "|---|---|---|---|---|---|"]
    for (group, name), t in results.items():
        lines.append(
            f"| {group} | {name} | {t.accepted}/{cases[group]} | {_stat(t.compile_first, 0.5)} / "
            f"{_stat(t.compile_first, 0.99)} | {_stat(t.first_visit, 0.5)} / {_stat(t.first_visit, 0.99)} / "
            f"{_stat(t.first_visit)} ({len(t.first_visit)}) | {_stat(t.warm, 0.5)} / {_stat(t.warm, 0.99)} / "
            f"{_stat(t.warm)} ({len(t.warm)}) |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER,
                   help="a directory with tokenizer.json(.gz) and tokenizer_config.json (default: Qwen2.5's)")
    p.add_argument("--logits-width", type=int, default=151936, help="the model's logits size (Qwen2.5: 151936)")
    p.add_argument("--data", type=Path, default=JSONSCHEMABENCH, help="JSONSchemaBench's <split>.jsonl.gz files")
    p.add_argument("--splits", nargs="*", default=None, help="JSONSchemaBench splits (default: every file)")
    p.add_argument("--count", type=int, default=50, help="schemas per JSONSchemaBench split (0: extraction only)")
    p.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--cold", action="store_true", help="structspec forgets its region shapes before each case")
    p.add_argument("--no-freeze", action="store_true",
                   help="leave the objects loaded before the replays in the cyclic collector's passes")


def main(args: argparse.Namespace) -> int:
    """Prepare each engine's tokenizer side, replay every case on every engine, print the table."""
    tokenizer = load_tokenizer(args.tokenizer)
    names = ["structspec"] + [n for n in args.engines if n != "structspec"]
    engines, missing = make_engines(tokenizer, args.logits_width, names, args.cold)
    cases = extraction_cases(tokenizer)
    splits = args.splits if args.splits is not None else sorted(
        p.name.removesuffix(".jsonl.gz") for p in args.data.glob("*.jsonl.gz"))
    if args.count > 0:
        cases += jsonschemabench_cases(tokenizer, args.data, splits, args.count, fits_structspec(engines[0]))
    if not args.no_freeze:  # (collected first, so that no garbage is frozen with them)
        gc.collect()
        gc.freeze()
    results = run(cases, engines)
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.group] = counts.get(case.group, 0) + 1
    print(f"{args.tokenizer} ({args.logits_width} logits), {len(cases)} cases, "
          f"{sum(len(c.token_ids) for c in cases)} output tokens\n")
    print(markdown(results, counts))
    for note in missing:
        print(f"\n{note}")
    for (group, name), t in results.items():
        for failure in t.failed:
            print(f"\n{name} on {group}/{failure}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
