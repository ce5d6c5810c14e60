"""Fast-forward: append the tokens the FSM forces without asking the model.

Two modes (``"off"`` is plain masked decoding):

* ``exact``: while the token FSM allows exactly one token, append it. Output is
  token-identical to plain masked decoding.
* ``canonical``: find the forced *text* — the longest byte string every
  continuation of the state starts with — and append the tokens the tokenizer
  would use for that text in context. A token FSM rarely has a single choice
  (``{"`` can be spelled ``{`` + ``"``), so this is where the savings are.

The forced text comes from walking the same token FSM byte by byte
(a byte is forced when every allowed token starts with it), so the
character-level view agrees with the token FSM by construction.

Boundaries. The forced text is tokenized after the whole output, as
``tokenizer.encode`` sees the final text, and the model's tokens keep their
spelling: forced tokens start at the first canonical token boundary at or
after the end of the model's text. SmolLM2 writes ``",`` + ``"`` where the
canonical spelling is ``","``, so after ``",`` nothing is forced until the
model has written the ``"`` (rewriting its ``",`` into ``","`` would show it a
spelling it did not choose, which costs field accuracy). At the far end, the
tokens of the last pre-token of the forced text could merge with the text that
follows (``"`` + ``Alice`` → ``"Alice``), so they are held back and left to the
model — unless the pre-tokenizer splits there for every byte that may follow,
or the output is complete. Tokenizers without a pre-tokenizer hold back the
last two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from structspec.automaton.fsm import TokenFSM
from structspec.vocab import is_byte_level

FastForward = Literal["off", "exact", "canonical"]

# Forced runs longer than this are cut (keeps one pass's input bounded).
_MAX_FORCED_BYTES = 512
_HOLDBACK_TOKENS = 2


@dataclass
class Forced:
    """Tokens to append without a model call, and the FSM states after each."""

    token_ids: list[int]
    states: list[int]


@dataclass(eq=False)
class Forcer:
    """Computes forced tokens for one FSM and tokenizer; caches per state. Never changes the FSM."""

    fsm: TokenFSM
    tokenizer: Any
    mode: FastForward
    _forced_bytes: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    _hard_end: dict[tuple[int, str], bool] = field(default_factory=dict)
    _spelled: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    _splits: dict[int, int] = field(default_factory=dict)  # token → the shorter first token the target prefers

    def __post_init__(self) -> None:
        self._byte_token = self.fsm.vocab.single_byte_tokens  # to walk the FSM one byte at a time
        self._backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._byte_level = is_byte_level(self.tokenizer)
        self._pre_tokenizer = self._backend.pre_tokenizer if self._backend is not None else None

    def force(self, state: int, out: list[int]) -> Forced | None:
        """Forced tokens after the output ``out``, which has led to ``state``; None if there are none."""
        if self.mode == "exact":
            return self._force_exact(state)
        if self.mode == "canonical":
            return self._force_canonical(state, out)
        return None

    def _force_exact(self, state: int) -> Forced | None:
        tokens, visited = [], []
        while len(allowed := self.fsm.allowed_token_ids(state)) == 1 and allowed[0] != self.fsm.eos_token_id:
            state = self.fsm.next_state(state, allowed[0])
            tokens.append(allowed[0])
            visited.append(state)
        return Forced(tokens, visited) if tokens else None

    def forced_bytes(self, state: int) -> tuple[bytes, int]:
        """The forced text from ``state`` and the state after it (cached; does not change anything)."""
        if state in self._forced_bytes:
            return self._forced_bytes[state]
        start, text = state, bytearray()
        while len(text) < _MAX_FORCED_BYTES:
            allowed = self.fsm.allowed_token_ids(state)
            if self.fsm.eos_token_id in allowed:
                break
            first = {self.fsm.vocab.token_bytes[t][0] for t in allowed[:2]}
            byte = first.pop()
            if first or byte not in self._byte_token or any(
                self.fsm.vocab.token_bytes[t][0] != byte for t in allowed
            ):
                break
            state = self.fsm.next_state(state, self._byte_token[byte])
            text.append(byte)
        self._forced_bytes[start] = (bytes(text), state)
        return self._forced_bytes[start]

    def spelled(self, state: int) -> tuple[list[int], list[int]]:
        """The forced text from ``state`` in its canonical spelling, and the states after each token.

        Nothing is held back: these tokens are drafts the target verifies, so a
        boundary where the model would rather merge costs no correctness.
        Cached; does not change anything.
        """
        if state not in self._spelled:
            text, _ = self.forced_bytes(state)
            ids = self._respell(self._encode(text) or []) if text else []
            visited = self.fsm.walk(state, ids)
            self._spelled[state] = (ids[: len(visited)], visited)
        return self._spelled[state]

    def learn(self, rejected: int, chosen: int) -> None:
        """The target rejected forced token ``rejected`` for ``chosen``; if ``chosen`` spells a proper prefix
        of it (``":`` for ``":"``), spell forced text that way from now on (this decode only)."""
        whole, head = self.fsm.vocab.token_bytes[rejected] or b"", self.fsm.vocab.token_bytes[chosen] or b""
        if head and len(head) < len(whole) and whole.startswith(head):
            self._splits[rejected] = chosen
            self._spelled.clear()

    def _respell(self, ids: list[int]) -> list[int]:
        """``ids`` with every learned split applied: the preferred head, then the rest spelled canonically."""
        out: list[int] = []
        for t in ids:
            if t not in self._splits:
                out.append(t)
                continue
            head = self._splits[t]
            rest = self._encode(self.fsm.vocab.token_bytes[t][len(self.fsm.vocab.token_bytes[head]) :])
            out += [head] + self._respell(rest) if rest is not None else [t]
        return out

    def _force_canonical(self, state: int, out: list[int]) -> Forced | None:
        forced, end_state = self.forced_bytes(state)
        if not forced:
            return None
        # The whole text, as tokenizer.encode sees it: forced text can merge into the model's last pre-token.
        written = self.fsm.vocab.spell(out)
        ids = self._encode(written + forced)
        if ids is None:
            return self._force_exact(state)
        skip = self._tokens_covering(ids, len(written))
        if len(self.fsm.vocab.spell(ids[:skip])) != len(written):
            return None  # a canonical token spans the end of the model's text: the model goes on
        keep = len(ids) if self.fsm.is_complete(end_state) else self._keep(written + forced, ids, end_state)
        ids = ids[skip:keep]
        if not ids:
            return None
        visited = self.fsm.walk(state, ids)
        assert len(visited) == len(ids), "tokens that spell allowed bytes are allowed"
        return Forced(ids, visited)

    def _encode(self, text: bytes) -> list[int] | None:
        """Canonical token ids of ``text`` if they spell exactly ``text``, else None."""
        try:
            s = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if self._byte_level or self._backend is None:
            ids = self.tokenizer.encode(s, add_special_tokens=False)
        else:  # SentencePiece-style: the BPE model alone, without the normalizer's leading "▁"
            ids = [piece.id for piece in self._backend.model.tokenize(s.replace(" ", "▁"))]
        return ids if self.fsm.vocab.spell(ids) == text else None

    def _tokens_covering(self, ids: list[int], n_bytes: int) -> int:
        """How many leading tokens of ``ids`` it takes to cover the first ``n_bytes`` bytes."""
        covered, count = 0, 0
        while covered < n_bytes:
            covered += len(self.fsm.vocab.token_bytes[ids[count]] or b"")
            count += 1
        return count

    def _keep(self, text: bytes, ids: list[int], end_state: int) -> int:
        """How many tokens of ``ids`` (spelling ``text``) cannot merge with what follows."""
        if self._pre_tokenizer is None:
            return max(len(ids) - _HOLDBACK_TOKENS, 0)
        s = text.decode("utf-8")
        pieces = self._pre_tokenizer.pre_tokenize_str(s)
        last = pieces[-1][1][0] if pieces else 0
        if self._boundary_is_hard(s[last:], end_state):
            return len(ids)
        last_start = len(s[:last].encode("utf-8"))
        keep, covered = 0, 0
        for t in ids:
            covered += len(self.fsm.vocab.token_bytes[t] or b"")
            if covered > last_start:
                break
            keep += 1
        return keep

    def _boundary_is_hard(self, s: str, end_state: int) -> bool:
        """Whether the pre-tokenizer splits after ``s`` (the last pre-token) whatever character the FSM allows next."""
        key = (end_state, s)
        if key not in self._hard_end:
            nexts = {
                b[:1] for t in self.fsm.allowed_token_ids(end_state)
                if (b := self.fsm.vocab.token_bytes[t])
            }
            chars = {c.decode("utf-8", "ignore") or "é" for c in nexts}  # any non-ASCII byte: a letter
            self._hard_end[key] = all(
                any(end == len(s) for _, (_, end) in self._pre_tokenizer.pre_tokenize_str(s + c)) for c in chars
            )
        return self._hard_end[key]



def noncanonical_forced(tokenizer: Any, vocab: Any, token_ids: list[int], sources: list[str]) -> int:
    """How many forced tokens differ from ``tokenizer.encode`` of the final text at the same byte span.

    The measure of canonical mode (target 0). Leading bytes the tokenizer adds
    itself (SentencePiece's ``▁`` before the first word) are allowed for.
    """
    text = vocab.spell(token_ids)
    canonical = tokenizer.encode(text.decode("utf-8", "replace"), add_special_tokens=False)
    pos = len(text) - len(vocab.spell(canonical))  # ≤ 0: bytes the tokenizer prepended
    spans = set()
    for t in canonical:
        n = len(vocab.token_bytes[t] or b"")
        spans.add((pos, t))
        pos += n
    count, pos = 0, 0
    for t, source in zip(token_ids, sources):
        if source == "forced" and (pos, t) not in spans:
            count += 1
        pos += len(vocab.token_bytes[t] or b"")
    return count
