"""The token-level FSM: a regex compiled over a tokenizer's vocabulary.

A `TokenFSM` is immutable and cached (in memory and on disk); decode state is a
plain ``int``. Token masks come from `structspec.automaton.index.TokenIndex`, which
builds each state's mask when it is first visited instead of all of them up
front. Walking a token sequence returns the list of states visited, so rolling
back is indexing that list, not undoing mutations.
"""

from __future__ import annotations

import hashlib
import pickle
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from structspec.automaton.index import TokenIndex
from structspec.cache import cache_dir, write_atomic
from structspec.vocab import TokenVocab

# Masks of visited states are kept up to this many bytes per FSM.
_MASK_CACHE_BYTES = 256 * 2**20
_MEMORY: dict[str, TokenIndex] = {}
# Bumped when the pickled automaton changes shape, so stale disk entries are not read.
_FORMAT = "lazy-dfa-1"


@dataclass(frozen=True)
class CompileInfo:
    """How a `TokenFSM` was obtained: ``source`` is "compiled", "memory" or "disk"."""

    seconds: float
    source: str


@dataclass(eq=False)
class TokenFSM:
    """A regex over token ids; states are ints, transitions come from a `TokenIndex`."""

    regex: str
    index: TokenIndex
    vocab: TokenVocab
    logits_width: int
    info: CompileInfo
    _allowed: dict[int, list[int]] = field(default_factory=dict, repr=False)
    _blocked: OrderedDict[int, torch.Tensor] = field(default_factory=OrderedDict, repr=False)

    @classmethod
    def from_regex(cls, regex: str, vocab: TokenVocab, logits_width: int | None = None) -> TokenFSM:
        """Compile (or load from cache) the FSM of ``regex`` over ``vocab``.

        ``logits_width`` is the model's logits size (≥ the tokenizer's size; extra
        ids are never allowed).
        """
        start = time.perf_counter()
        # The automaton does not depend on the tokenizer: one disk entry serves every model.
        key = hashlib.sha256(f"{_FORMAT}\0{regex}".encode()).hexdigest()[:40]
        path = cache_dir("fsm") / f"{key}.dfa"
        key += vocab.fingerprint
        if key in _MEMORY:
            index, source = _MEMORY[key], "memory"
        elif path.exists():
            index, source = TokenIndex(pickle.loads(path.read_bytes()), vocab), "disk"
        else:
            index, source = TokenIndex.from_regex(regex, vocab), "compiled"
            write_atomic(path, pickle.dumps(index.dfa, protocol=pickle.HIGHEST_PROTOCOL))
        _MEMORY[key] = index
        info = CompileInfo(time.perf_counter() - start, source)
        return cls(regex, index, vocab, logits_width or len(vocab), info)

    @property
    def initial_state(self) -> int:
        return self.index.get_initial_state()

    @property
    def eos_token_id(self) -> int:
        return self.vocab.eos_token_id

    def is_final(self, state: int) -> bool:
        """Whether the text so far is a complete match (EOS is allowed)."""
        return self.index.is_final_state(state)

    def allowed_token_ids(self, state: int) -> list[int]:
        """Token ids allowed in ``state`` (EOS included when final). Does not change anything."""
        ids = self._allowed.get(state)
        if ids is None:
            ids = self._allowed[state] = self.index.get_allowed_tokens(state)
        return ids

    def is_complete(self, state: int) -> bool:
        """Whether EOS is the only way on: the output is finished without asking the model."""
        return self.allowed_token_ids(state) == [self.eos_token_id]

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after ``token_id``, or None if the token is not allowed."""
        return self.index.get_next_state(state, token_id)

    def walk(self, state: int, token_ids: list[int]) -> list[int]:
        """States after each token of ``token_ids``; stops before the first rejected token.

        ``len(result) < len(token_ids)`` means ``token_ids[len(result)]`` is rejected.
        """
        states: list[int] = []
        for t in token_ids:
            nxt = self.index.get_next_state(state, t)
            if nxt is None:
                break
            states.append(nxt)
            state = nxt
        return states

    def blocked_mask(self, state: int) -> torch.Tensor:
        """Bool row of width ``logits_width``, True where a token is NOT allowed (cached per state)."""
        mask = self._blocked.get(state)
        if mask is None:
            mask = torch.ones(self.logits_width, dtype=torch.bool)
            mask[torch.tensor(self.allowed_token_ids(state), dtype=torch.long)] = False
            self._blocked[state] = mask
            if len(self._blocked) * self.logits_width > _MASK_CACHE_BYTES:
                self._blocked.popitem(last=False)
        else:
            self._blocked.move_to_end(state)
        return mask

    def mask_logits_inplace(self, logits: torch.Tensor, states: list[int]) -> torch.Tensor:
        """Set disallowed logits to -inf; row ``i`` of ``logits`` is masked by ``states[i]``."""
        for row, state in zip(logits, states):
            row.masked_fill_(self.blocked_mask(state), float("-inf"))
        return logits
