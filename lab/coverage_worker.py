"""The coverage benchmark's worker: one process, limited in memory, that compiles one JSONSchemaBench row with
an engine and checks the row's known instances against the FSM (in any member order: `OrderSearch`); the
parent (`Worker`) limits its time per row and replaces a worker that runs over or dies."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

_WORKER: dict[str, Any] = {}


def _worker_setup(memory_gb: float, model: str, generate: int, open_objects: bool | None) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (int(memory_gb * 2**30),) * 2)
    from outlines_core import Vocabulary

    from structspec.automaton.fsm import TokenFSM
    from structspec.schema import constraint_of
    from structspec.testing import tiny_lm
    from structspec.jobs.runner import load_model

    lm = load_model(model)  # from the user's cache; FSMs go to a fresh one, so cold means cold
    os.environ["STRUCTSPEC_CACHE"] = tempfile.mkdtemp(prefix="structspec-coverage-")
    _WORKER["lm"] = lm
    _WORKER["outlines_vocab"] = Vocabulary(lm.vocab.eos_token_id, lm.vocab.outlines_map())
    _WORKER["tiny"] = tiny_lm("byte_level") if generate else None
    _WORKER["generate"] = generate
    _WORKER["open_objects"] = open_objects
    # warm: a fresh worker (also one replacing a killed one) pays its first compile's one-time costs here,
    # not in the next row's time
    fsm = TokenFSM.from_regex(constraint_of({"type": "object", "properties": {"a": {"type": "string"}}}).pattern,
                              lm.vocab, lm.logits_width)
    fsm.allowed_token_ids(fsm.initial_state)


class _OutlinesIndex:
    """outlines-core's `Index` under `TokenFSM`'s names, so one walk serves both engines. Reads only."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @property
    def initial_state(self) -> int:
        return self.index.get_initial_state()

    def next_state(self, state: int, token_id: int) -> int | None:
        return self.index.get_next_state(state, token_id)

    def is_final(self, state: int) -> bool:
        return self.index.is_final_state(state)


def _byte_states(fsm: Any, text: str) -> Iterator[int | None]:
    """The states ``text`` leads through, one single-byte token at a time, from the initial one; None on rejection."""
    byte_token = _WORKER["lm"].vocab.single_byte_tokens
    state = fsm.initial_state
    yield state
    for byte in text.encode():
        token = byte_token.get(byte)
        state = None if token is None else fsm.next_state(state, token)
        yield state
        if state is None:
            return


SEARCH_BUDGET = 20_000
"""Steps the member-order search of one instance may take (most need one: their own order)."""


class _OutOfBudget(Exception):
    """The search for an accepted member order ran past its budget of steps."""


class OrderSearch:
    """Spells a JSON value compactly in each member order, walking an automaton as it goes: object members
    may come in any order (JSON does not order them; structspec writes them in one fixed order), so an
    instance counts as accepted when some order is. Exact: for each object, the states each subset of its
    members leads to (the automaton's state is all that the rest depends on); at most ``budget`` steps.

    ``next_byte(state, byte)`` is the automaton's next state (None when it rejects); it is only read.
    """

    def __init__(self, initial: int, next_byte: Callable[[int, int], int | None], is_final: Callable[[int], bool],
                 budget: int = SEARCH_BUDGET) -> None:
        self.initial, self.next_byte, self.is_final, self.left = initial, next_byte, is_final, budget
        self._ends: dict[tuple[int, int], dict[int, str]] = {}

    def first(self, texts: list[str]) -> str | None:
        """The first of ``texts`` the automaton accepts whole, or None."""
        for text in dict.fromkeys(texts):
            after = self.step(self.initial, text)
            if after is not None and self.is_final(after):
                return text
        return None

    def accepted(self, value: Any, tries: tuple[str, ...] = ()) -> str | None:
        """A spelling of ``value`` the automaton accepts whole, or None; `_OutOfBudget` past the budget. ``tries``
        and the value's own order come first (most instances are accepted in one of them), then the search."""
        found = self.first([*tries, json.dumps(value, ensure_ascii=False, separators=(",", ":"))])
        if found is not None:
            return found
        return next((text for state, text in self.ends(self.initial, value).items() if self.is_final(state)), None)

    def step(self, state: int, text: str) -> int | None:
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget
        for byte in text.encode():
            next_state = self.next_byte(state, byte)
            if next_state is None:
                return None
            state = next_state
        return state

    def ends(self, state: int, value: Any) -> dict[int, str]:
        """Each state a spelling of ``value`` from ``state`` leads to, with one such spelling."""
        key = (id(value), state)  # (the value is held by the caller's instance: its id stays its own)
        if key not in self._ends:
            if isinstance(value, dict):
                self._ends[key] = self._object(state, value)
            elif isinstance(value, list):
                self._ends[key] = self._array(state, value)
            else:
                text = json.dumps(value, ensure_ascii=False)
                after = self.step(state, text)
                self._ends[key] = {} if after is None else {after: text}
        return self._ends[key]

    def _object(self, state: int, value: dict[str, Any]) -> dict[int, str]:
        opened = self.step(state, "{")
        layer: dict[tuple[int, frozenset[str]], str] = {} if opened is None else {(opened, frozenset()): "{"}
        for _ in value:  # one more member per layer
            grown: dict[tuple[int, frozenset[str]], str] = {}
            for (at, done), text in layer.items():
                for name in value.keys() - done:
                    spelled = ("," if done else "") + json.dumps(name, ensure_ascii=False) + ":"
                    named = self.step(at, spelled)
                    if named is not None:
                        for after, member in self.ends(named, value[name]).items():
                            grown.setdefault((after, done | {name}), text + spelled + member)
            layer = grown
        closed = ((self.step(at, "}"), text) for (at, _), text in layer.items())
        return {after: text + "}" for after, text in closed if after is not None}

    def _array(self, state: int, value: list[Any]) -> dict[int, str]:
        opened = self.step(state, "[")
        layer = {} if opened is None else {opened: "["}
        for i, item in enumerate(value):
            grown: dict[int, str] = {}
            for at, text in layer.items():
                comma = self.step(at, ",") if i else at
                for after, spelled in self.ends(comma, item).items() if comma is not None else ():
                    grown.setdefault(after, text + ("," if i else "") + spelled)
            layer = grown
        closed = ((self.step(at, "]"), text) for at, text in layer.items())
        return {after: text + "]" for after, text in closed if after is not None}


def _accepted(fsm: Any, value: Any, schema: Any, valid: bool) -> tuple[bool | None, str | None]:
    """Whether the token FSM (a `TokenFSM` or an `_OutlinesIndex`) accepts ``value``, and the text it accepts:
    in the schema's member order or the value's own, and for a valid value in any order (`OrderSearch`; None
    where the search runs past its budget: undecided, counted apart). An invalid value is tried in the two
    orders only: proving that no order is accepted can take every subset of its members."""
    from structspec.testing import in_layout

    byte_token = _WORKER["lm"].vocab.single_byte_tokens

    def next_byte(state: int, byte: int) -> int | None:
        token = byte_token.get(byte)
        return None if token is None else fsm.next_state(state, token)

    search = OrderSearch(fsm.initial_state, next_byte, fsm.is_final, SEARCH_BUDGET)
    layout = in_layout(value, schema, schema)
    try:
        text = search.accepted(value, (layout,)) if valid else search.first(
            [layout, json.dumps(value, ensure_ascii=False, separators=(",", ":"))])
    except _OutOfBudget:
        return None, None
    return text is not None, text


def _verdicts(fsm: Any, tests: list[dict[str, Any]], schema: Any) -> tuple[dict[str, Any], list[str]]:
    """The counts of known instances ``fsm`` gets right, and the texts of the valid ones it accepts."""
    results = [(t["valid"], *_accepted(fsm, t["data"], schema, t["valid"])) for t in tests]
    decided = [(valid, accepted) for valid, accepted, _ in results if accepted is not None]
    return {"valid_accepted": [sum(1 for v, a in decided if v and a), sum(1 for v, _ in decided if v)],
            "invalid_rejected": [sum(1 for v, a in decided if not v and not a), sum(1 for v, _ in decided if not v)],
            "undecided": sum(1 for _, accepted, _ in results if accepted is None)}, [
        text for valid, accepted, text in results if valid and accepted]


def _mask_seconds(fsm: Any, texts: list[str]) -> list[float]:
    """Seconds to compute the token mask of each state the first instance passes through (up to 64)."""
    seconds = []
    for state in islice(_byte_states(fsm, texts[0]), 64) if texts else ():
        if state is None:
            break
        start = time.perf_counter()
        fsm.allowed_token_ids(state)
        seconds.append(time.perf_counter() - start)
    return seconds


def _run_task(engine: str, row: dict[str, Any]) -> dict[str, Any]:
    import structspec
    from structspec.errors import SchemaError

    from structspec.automaton.fsm import TokenFSM
    from structspec.automaton.nfa import gc_paused
    from structspec.automaton.parse import ParsedRegex, written_size
    from structspec.schema import constraint_of

    lm, schema = _WORKER["lm"], row["schema"]
    if engine == "generate":
        return {"generated": _generate_and_validate(schema)}
    out: dict[str, Any] = {"status": "compiled"}
    gc.collect()  # each compile starts from a collected heap, not paying the collections earlier rows left due
    try:
        start = time.perf_counter()
        if engine == "structspec":
            with gc_paused():  # as `structspec.compile` does
                # its text is not written: compiling never needs it
                regex = constraint_of(schema, open_objects=_WORKER["open_objects"]).pattern
                out["regex_s"] = time.perf_counter() - start
                fsm: Any = TokenFSM.from_regex(regex, lm.vocab, lm.logits_width)
                out["compile_s"] = time.perf_counter() - start
            fsm.allowed_token_ids(fsm.initial_state)  # built lazily: llguidance's times include the first mask
            out["first_mask_s"] = time.perf_counter() - start
            start = time.perf_counter()
            structspec.compile(schema, lm, open_objects=_WORKER["open_objects"])
            out["cached_s"] = time.perf_counter() - start
        else:
            from outlines_core import Index
            from outlines_core.json_schema import build_regex_from_schema

            regex = build_regex_from_schema(json.dumps(schema), "")
            out["regex_s"] = time.perf_counter() - start
            fsm = _OutlinesIndex(Index(regex, _WORKER["outlines_vocab"]))
            out["compile_s"] = time.perf_counter() - start
    except SchemaError as e:
        return {"status": "schema_error", "keyword": e.keyword}
    except Exception as e:  # noqa: BLE001 — every other failure is a result to report
        return {"status": "error", "error": f"{type(e).__name__}: {str(e)[:160]}"}
    # Ours is built lazily: its size is the NFA's; outlines-core's is the states of its Index.
    out["states"] = len(fsm.index.dfa.nfa) if engine == "structspec" else len(fsm.index.get_transitions())
    # ours is never written (it may run to gigabytes): its size is what `write` would write
    out["regex_chars"] = written_size(regex.items) if isinstance(regex, ParsedRegex) else len(regex)
    tests = [t for t in row.get("tests") or [] if "data" in t]
    verdicts, accepted = _verdicts(fsm, tests, schema)
    out.update(verdicts)
    if engine == "structspec":  # what laziness moves into decoding: each new state's mask
        out["mask_s"] = _mask_seconds(fsm, accepted)
    return out


def _generate_and_validate(schema: Any) -> list[int]:
    """[valid, invalid, incomplete] over one greedy and ``generate - 1`` sampled outputs of the tiny model."""
    import jsonschema

    import structspec

    from structspec.schema import validator as schema_validator

    validator = schema_validator(schema)
    counts = [0, 0, 0]
    for seed in range(_WORKER["generate"]):
        options = {"temperature": 1.0, "do_sample": True, "seed": seed} if seed else {}
        try:
            result = structspec.generate_result(_WORKER["tiny"], schema, "JSON:", max_new_tokens=128,
                                                open_objects=_WORKER["open_objects"], **options)
        except jsonschema.ValidationError:  # the parser validates the original schema too
            counts[1] += 1
            continue
        if not result.complete:
            counts[2] += 1
        else:
            counts[0 if validator.is_valid(json.loads(result.text)) else 1] += 1
    return counts


def _worker_main(conn: Any, memory_gb: float, model: str, generate: int, open_objects: bool | None) -> None:
    _worker_setup(memory_gb, model, generate, open_objects)
    conn.send("ready")
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            conn.send(_run_task(*task))
        except MemoryError:
            conn.send({"status": "memory"})


class Worker:
    """One worker process; a task that runs past ``timeout`` kills it and a fresh one takes over."""

    def __init__(self, timeout: float, memory_gb: float, model: str, generate: int, open_objects: bool | None = None,
                 ) -> None:
        self.timeout, self.args = timeout, (memory_gb, model, generate, open_objects)
        self.process: Any = None
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, *self.args), daemon=True)
        self.process.start()
        if not self.conn.poll(600) or self.conn.recv() != "ready":
            raise RuntimeError("the coverage worker did not start")

    def run(self, engine: str, row: dict[str, Any]) -> dict[str, Any]:
        self.conn.send((engine, row))
        if self.conn.poll(self.timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass  # it died (out of memory in native code): replace it
        status = "timeout" if self.process.is_alive() else "crash"
        self.process.kill()
        self.process.join()
        self._start()
        return {"status": status}

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(10)
