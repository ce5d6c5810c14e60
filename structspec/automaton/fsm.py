"""The token-level FSM: a regex compiled over a tokenizer's vocabulary, and its compile cache.

A `TokenFSM` is cached (in memory, and on disk when slow to build) and its language never changes;
decode state is a plain ``int``. Walking a token sequence returns the list of
states visited, so rolling back is indexing that list, not undoing mutations.
Masks follow the allocate / fill / apply trio other engines speak::

    masks = fsm.allocate_token_bitmask(len(states))
    for row, state in enumerate(states):
        fsm.fill_next_token_bitmask(masks, row, state)
    apply_token_bitmask_inplace(logits, masks.to(logits.device))
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from structspec.automaton import dfa as dfa_module
from structspec.automaton.bitmask import checked, remember
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.index import TokenIndex
from structspec.automaton.nfa import ByteNFA
from structspec.automaton.parse import ParsedRegex
from structspec.cache import cache_dir, read_pickle, write_pickle
from structspec.checks import as_int, check_option
from structspec.errors import OptionError, UnspellableError
from structspec.vocab import TokenVocab

# Compiled indexes kept in memory, least recently used first; each keeps the masks of the states it visited.
_MEMORY: OrderedDict[str, TokenIndex] = OrderedDict()
_MEMORY_LIMIT = 64
_MEMORY_LOCK = threading.Lock()
DISK_MIN_SECONDS = 0.005
"""An automaton built faster than this is kept in memory only: pickling and writing it would cost more than
reading it back saves a later process (about 1 ms + 0.3 of the build to write, 0.4 of the build to read, on
JSONSchemaBench's Github_hard and Github_ultra schemas)."""
# Bumped when the pickled automaton changes shape (or module), so stale disk entries are not read.
_FORMAT = "lazy-dfa-12"  # 6: fragments built when first entered (the NFA keeps recipes); 7: `Stated` recipes;
# 8: `_entered`; 9: states and closures as tuples, `_entered_one`; 10: only built rows stored (`rows`, `slots`);
# 11: behind a checksum (`structspec.cache.write_pickle`); 12: a counted character's region takes the wide states
# ahead (its rows numbered otherwise)


def clear_cache(disk: bool = False) -> None:
    """Forget the compiled automata kept in memory and, with ``disk=True``, delete the on-disk ones too, and the
    token walks kept on disk per tokenizer (those in memory stay: they answer exactly as a new walk would).

    FSMs already returned keep working; the next `TokenFSM.from_regex` compiles
    (or reads the disk) again.
    """
    with _MEMORY_LOCK:
        _MEMORY.clear()
    if disk:
        for path in [*cache_dir("fsm").glob("*.dfa"), *cache_dir("shapes").glob("*.shape")]:
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class CompileInfo:
    """How a `TokenFSM` was obtained: ``source`` is "compiled", "memory" or "disk"."""

    seconds: float
    source: str


@dataclass(frozen=True, eq=False)
class TokenFSM:
    """A regex over token ids; states are ints.

    ``pattern`` is the regex it was compiled from, text or `ParsedRegex` (`regex` is its text). Every read
    below leaves the language unchanged. Reads that meet a state for the first time build the DFA rows they
    reach and cache that state's answer, under a lock, so threads sharing an FSM get the answers one thread
    would.
    """

    pattern: str | ParsedRegex
    index: TokenIndex
    info: CompileInfo

    @property
    def regex(self) -> str:
        """The regex text (a `ParsedRegex`'s is written on the first read, then kept)."""
        return str(self.pattern)

    @classmethod
    def from_regex(
        cls, regex: str | ParsedRegex, vocab: TokenVocab, logits_width: int | None = None,
        eos_token_ids: int | Sequence[int] | None = None,
    ) -> TokenFSM:
        """Compile (or load from cache) the FSM of ``regex`` (text, or a `ParsedRegex`: never written) over
        ``vocab``.

        ``logits_width`` is the model's logits size (default: the tokenizer's
        size); ids the tokenizer does not have are never allowed. ``eos_token_ids``
        are the tokens that end the output (default: the tokenizer's EOS; the first
        is `eos_token_id`), see `check_eos_token_ids`. `RegexError` if the regex is
        invalid, uses what a DFA cannot do, or matches no string.
        """
        start = time.perf_counter()
        width = logits_width or len(vocab)
        eos = check_eos_token_ids(vocab, eos_token_ids)
        # The automaton does not depend on the tokenizer or its end tokens: one disk entry serves every model
        # and EOS set. The in-memory index does depend on both, so its key names them.
        # (surrogatepass: a regex may name a lone surrogate, which then matches nothing)
        # A `ParsedRegex` (a translated schema) names its language by a key cheaper to hash than its text.
        named = f"{_FORMAT}\0key\0{regex.key}" if isinstance(regex, ParsedRegex) else f"{_FORMAT}\0{regex}"
        digest = hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        path = cache_dir("fsm") / f"{digest}.dfa"
        key = f"{digest}{vocab.fingerprint}:{width}:{','.join(map(str, eos))}"
        with _MEMORY_LOCK:
            index = _MEMORY.get(key)
        if index is not None:
            source = "memory"
        elif (stored := read_pickle(path, LazyDFA, "compiled again")) is not None:  # a damaged entry: dropped
            index, source = TokenIndex(stored, vocab, width, eos), "disk"
        else:
            built = time.perf_counter()
            dfa = LazyDFA(ByteNFA(regex))
            if time.perf_counter() - built >= DISK_MIN_SECONDS:
                try:
                    write_pickle(path, dfa)
                except RecursionError:  # pickling recurses once per level of the parts not built yet; too deep
                    pass  # to keep: compiled again by the next process
            index, source = TokenIndex(dfa, vocab, width, eos), "compiled"
        with _MEMORY_LOCK:
            _MEMORY[key] = index
            _MEMORY.move_to_end(key)
            if len(_MEMORY) > _MEMORY_LIMIT:
                _MEMORY.popitem(last=False)
        return cls(regex, index, CompileInfo(time.perf_counter() - start, source))

    @property
    def vocab(self) -> TokenVocab:
        return self.index.vocab

    @property
    def logits_width(self) -> int:
        return self.index.logits_width

    @property
    def initial_state(self) -> int:
        return self.index.dfa.initial

    @property
    def eos_token_id(self) -> int:
        """The primary end token (the first of `eos_token_ids`), for code that needs one id."""
        return self.index.eos_token_ids[0]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token that ends the output: each is allowed exactly in final states."""
        return self.index.eos_token_ids

    def is_final(self, state: int) -> bool:
        """Whether the text so far is a complete match (the EOS ids are allowed). Does not change anything."""
        return self.index.dfa.is_final(state)

    def allowed_token_ids(self, state: int) -> np.ndarray:
        """Token ids allowed in ``state``, ascending, every EOS id included when final: a read-only int array.

        `UnspellableError` (naming the characters needed) if the state is not final and the
        vocabulary has no token for what comes next; so do `is_complete` and the mask fill.

        Use ``len``, indexing and ``in`` on it. Does not change the language; the
        first call per state walks the vocabulary (the DFA table grows) and caches the answer.
        """
        return self.index.allowed_token_ids(state)

    def unspellable(self, state: int) -> UnspellableError | None:
        """The `UnspellableError` `allowed_token_ids` raises in ``state`` (the vocabulary has no token for what
        comes next), or None where it raises none. A drafter's token leading to such a state is not drafted, so
        only the output itself reaching it stops a row. Caches like `allowed_token_ids` (which keeps the error)."""
        try:
            self.allowed_token_ids(state)
        except UnspellableError as error:
            return error
        return None

    def spellable(self, state: int) -> bool:
        """Whether some token of the vocabulary (or an EOS id) can follow ``state`` (`unspellable` is None)."""
        return self.unspellable(state) is None

    def is_complete(self, state: int) -> bool:
        """Whether an EOS id is the only way on: the output is finished without asking the model.

        Does not change the language (caches like `allowed_token_ids`).
        """
        return len(self.allowed_token_ids(state)) == len(self.eos_token_ids) and self.is_final(state)

    def knows(self, state: int) -> bool:
        """Whether ``state`` is one this FSM has reached (by `initial_state`, `next_state` or `walk`)."""
        return 0 <= state < len(self.index.dfa)

    def packed_mask(self, state: int) -> np.ndarray:
        """The allowed ids of ``state`` as ceil(logits_width / 32) int32 words (bit j of word i ⇔ token 32*i+j),
        computed once per state and cached: do not modify it (callers copy it into their bitmask)."""
        return self.index.packed_mask(state)

    def mask_ready(self, state: int) -> bool:
        """Whether the mask of ``state`` is computed (reading it copies a cached row; else the first read walks
        the vocabulary): a hint for spreading first visits over threads, never needed for a right answer.
        Changes nothing."""
        return self.index.computed(state)

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after ``token_id``, or None if the token is not allowed (an EOS id leads to no state).

        Builds the rows it reaches: the table grows, the language does not.
        """
        index = self.index  # (read once: a decode step's accept runs this)
        token_bytes = index.vocab.token_bytes
        data = token_bytes[token_id] if 0 <= token_id < len(token_bytes) else None
        if not data or token_id in index.eos_token_ids:
            return None
        nxt = index.dfa.step(state, data)
        return None if nxt == DEAD else nxt

    def next_bytes(self, state: int) -> list[int]:
        """The bytes the language allows next from ``state``, ascending (the byte automaton's view: a byte no
        token can go on from is still listed). Cheaper than `allowed_token_ids` on a state's first visit.

        Builds the row it reads: the table grows, the language does not.
        """
        return self.index.dfa.next_bytes(state)

    def walk(self, state: int, token_ids: list[int]) -> list[int]:
        """States after each token of ``token_ids``; stops before the first rejected token.

        ``len(result) < len(token_ids)`` means ``token_ids[len(result)]`` is rejected.
        Builds the rows it reaches: the table grows, the language does not.
        """
        # (one token, a decode step's accept: `next_state`, a quarter of the cost of the core's walk's set-up)
        if len(token_ids) == 1 and type(token_ids[0]) is int:
            nxt = self.next_state(state, token_ids[0])
            return [] if nxt is None else [nxt]
        # (in the compiled core, all tokens in one call, where `next_state` is this class's own: a subclass's
        # states, such as `BudgetedFSM`'s, are not the DFA's)
        if dfa_module.CORE is not None and type(self).next_state is TokenFSM.next_state:
            return self.index.walk_tokens(state, token_ids)
        states: list[int] = []
        for t in token_ids:
            nxt = self.next_state(state, t)
            if nxt is None:
                break
            states.append(nxt)
            state = nxt
        return states

    def allocate_token_bitmask(self, rows: int) -> torch.Tensor:
        """A new CPU int32 bitmask [rows, ceil(logits_width / 32)], every bit set (an unfilled row masks nothing).

        Does not change the FSM. `OptionError` unless ``rows`` is an int ≥ 0.
        """
        count = as_int(rows)
        if count is None or count < 0:
            raise OptionError(f"rows must be an int ≥ 0 (not a bool), got {rows!r}: pass the number of mask rows")
        return torch.full((count, -(-self.logits_width // 32)), -1, dtype=torch.int32)

    def check_token_bitmask(self, bitmask: torch.Tensor, row: int) -> int:
        """``row`` as an int, or `OptionError` naming the fix unless ``bitmask`` is an int32 tensor
        [rows, ceil(logits_width / 32)] (as `allocate_token_bitmask` makes it) and ``0 ≤ row < rows``.
        Changes nothing."""
        words = -(-self.logits_width // 32)
        fix = "allocate it with matcher.fsm.allocate_token_bitmask(rows) (or, without a Matcher, the FSM's own)"
        if not isinstance(bitmask, torch.Tensor):
            raise OptionError(f"the bitmask is of type {type(bitmask).__name__}, not a torch tensor: {fix}")
        if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
            raise OptionError(f"the bitmask is a {bitmask.dim()}-D {bitmask.dtype} tensor, not a 2-D [rows, "
                              f"words] torch.int32 one: {fix} (one row: bitmask.unsqueeze(0))")
        if bitmask.shape[-1] != words:
            raise OptionError(
                f"the bitmask has {bitmask.shape[-1]} words per row but this FSM's logits width "
                f"{self.logits_width} needs {words}: {fix}, or compile with logits_width set to the model's"
            )
        index = as_int(row)
        if index is None or not 0 <= index < len(bitmask):
            raise OptionError(f"row {row!r} is not a row of this bitmask ({len(bitmask)} rows): pass an int "
                              f"from 0 to {len(bitmask) - 1}, or allocate more rows")
        return index

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int, state: int) -> None:
        """Write the mask of ``state`` into ``bitmask[row]`` (bit j of word i ⇔ token 32*i+j allowed).

        Changes ``bitmask`` only; the packed row is computed once per state and cached. `OptionError` for a
        bitmask or row `check_token_bitmask` refuses, or a state this FSM has not reached. A CPU bitmask is
        checked once (`structspec.automaton.bitmask`): a warm fill is a lookup and a copy.
        """
        rows = checked(bitmask)  # a CPU bitmask met before, unchanged since
        if (rows is not None and type(row) is int and 0 <= row < rows.count and type(state) is int
                and rows.words == -(-self.index.logits_width // 32)):
            # a mask computed (so a state reached); a subclass's states, such as `BudgetedFSM`'s, are not the DFA's
            packed = (self.index.packed_if_computed(state) if type(self).packed_mask is TokenFSM.packed_mask
                      else None)
            if packed is None and self.knows(state):  # a first visit: the bitmask needs no second check
                packed = self.packed_mask(state)
            if packed is not None:
                rows.write(bitmask, row, packed)
                return
        index = self.check_token_bitmask(bitmask, row)
        number = as_int(state)
        if number is None or not self.knows(number):
            raise OptionError(f"state {state!r} is not a state this FSM has reached: "
                              "pass initial_state or a state next_state / walk returned")
        if rows is None:
            rows = remember(bitmask)  # None: not on the CPU, or rows not contiguous
        if rows is not None:
            rows.write(bitmask, index, self.packed_mask(number))
        elif bitmask.device.type == "cpu":  # through numpy's view of it: a torch copy of one row costs more
            bitmask.numpy()[index] = self.packed_mask(number)
        else:
            bitmask[index].copy_(torch.tensor(self.packed_mask(number)))  # (a copy: a cached mask is read-only)

    def mask_logits_inplace(self, logits: torch.Tensor, states: list[int]) -> None:
        """Set disallowed logits to -inf; row ``i`` of ``logits`` [rows, width] is masked by ``states[i]``.

        Changes ``logits`` (returns None, as the other in-place calls do), not the FSM. Built on the bitmask
        trio; `OptionError` (with the fix) for fewer logits rows than states, and as they do.
        """
        if isinstance(logits, torch.Tensor) and logits.dim() == 2 and len(logits) < len(states):
            raise OptionError(f"logits has {len(logits)} rows for {len(states)} states: pass one state per row")
        bitmask = self.allocate_token_bitmask(len(states))
        for row, state in enumerate(states):
            self.fill_next_token_bitmask(bitmask, row, state)
        apply_token_bitmask_inplace(logits[: len(states)], bitmask)


def check_eos_token_ids(vocab: TokenVocab, eos_token_ids: int | Sequence[int] | None) -> tuple[int, ...]:
    """``eos_token_ids`` (an id or ids) without repeats, in order; None: the tokenizer's EOS alone.
    Changes nothing.

    `OptionError` for an empty list, an id that is not an int, or one that is not the tokenizer's EOS nor one of
    its special tokens (an end token must add no text, so it can never also be part of the output).
    """
    if eos_token_ids is None:
        return (vocab.eos_token_id,)
    given = check_option("eos_token_id", eos_token_ids)  # an id or a non-empty list of ids, by type
    ids = tuple(dict.fromkeys(given if isinstance(given, list) else [given]))
    for i in ids:
        if i != vocab.eos_token_id and not (0 <= i < len(vocab) and vocab.token_bytes[i] is None):
            spelled = f"the text token {vocab.token_bytes[i]!r}" if 0 <= i < len(vocab) else "not a token"
            raise OptionError(
                f"eos_token_id {i} is {spelled}: an end token must be the tokenizer's EOS (id "
                f"{vocab.eos_token_id}) or another special token, such as an instruct model's <|im_end|>"
            )
    return ids


def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[r, t]`` to -inf wherever bit t of ``bitmask[r]`` is clear.

    ``logits`` is [rows, width] (float32, bfloat16, ...; any device); ``bitmask`` is
    int32 [rows, words] on the same device or the CPU, bit j of word i standing
    for token 32*i+j. Ids at or past 32*words are disallowed; bits past ``width``
    are ignored. All rows in one vectorized op; changes ``logits`` and nothing else. `OptionError` (with the
    fix) for tensors of other kinds or shapes: a 1-D ``logits`` takes a 1-D ``bitmask``.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() not in (1, 2):
        got = f"a {logits.dim()}-D {logits.dtype} tensor" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise OptionError(f"logits must be a 1-D or 2-D floating-point tensor, got {got}: pass the [rows, width] "
                          "scores, e.g. outputs.logits[:, -1]")
    if (not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32 or bitmask.dim() != logits.dim()
            or bitmask.shape[:-1] != logits.shape[:-1]):
        got = f"{bitmask.dtype} {list(bitmask.shape)}" if isinstance(bitmask, torch.Tensor) else type(bitmask).__name__
        raise OptionError(f"the bitmask must be torch.int32 with the logits' rows ({list(logits.shape[:-1])}), got "
                          f"{got}: fill one row per logits row in fsm.allocate_token_bitmask(rows)")
    width = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    words = bitmask.to(logits.device, non_blocking=True)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).flatten(-2).bool()  # [rows, 32 * words]
    covered = min(width, allowed.shape[-1])
    logits[..., :covered].masked_fill_(~allowed[..., :covered], float("-inf"))
    logits[..., covered:] = float("-inf")

