"""Fast-forward: tokens the FSM forces cost no forward pass of their own.

``fast_forward="exact"`` (the default; ``"off"`` is plain masked decoding) is
lossless — the output is token-identical to plain masked decoding, greedy or
sampled — through two levers:

* while the token FSM allows exactly one token, append it without a model call
  (`Forcer.force`);
* the forced *text* — the longest byte string every continuation of the state
  starts with, and where it stops only because JSON whitespace may come next,
  the one other byte allowed there (a key's ``"`` and its ``:``, which models
  write as one token ``":``) — is spelled canonically (`Forcer.spelled`) and
  spliced into the candidate the target verifies in its next pass anyway. Where the target
  agrees, those tokens cost nothing; where it prefers another spelling (SmolLM2
  writes ``":`` + ``"`` rather than ``":"``) its own token wins and the forcer
  learns that split for the rest of the output (`Forcer.learn`).

The forced text comes from walking the same token FSM byte by byte (a byte is
forced when every allowed token starts with it), so the character-level view
agrees with the token FSM by construction. A token FSM rarely has a single
choice (``{"`` is also ``{`` + ``"``), so the second lever carries the savings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.candidate import enterable
from structspec.vocab import is_byte_level

FastForward = Literal["off", "exact"]

# Forced runs longer than this are cut (keeps one pass's input bounded).
_MAX_FORCED_BYTES = 512
_RESPELL_BYTES = 16  # the longest first token `Forcer.respellings` tries
_WHITESPACE = frozenset(b" \t\n\r")


class Splits(dict[int, int]):
    """The splits a target was seen to prefer: token → the shorter token it starts that token's text with (``":``
    for ``":"``), and in `after` the same by the token before it, which wins over the token alone: Qwen closes
    a tool call's ``name`` key with ``":`` + ``"get``, its argument keys mostly with ``":"``, and one key's
    habit is right for that key in every call while the token alone flips between keys. One `Splits` may be
    shared by several forcers (an engine's requests under one tokenizer), so what one output teaches spells
    the next one's forced text; `version` counts its changes, so each forcer knows when the text it spelled
    is stale."""

    version = 0

    def __init__(self) -> None:
        super().__init__()
        self.after: dict[tuple[int, int], int] = {}
        """(token before, token) → the head the target starts the token's text with there (itself: whole)."""

    def head(self, before: int | None, token: int) -> int | None:
        """The token ``token``'s text starts with after ``before`` (None: unknown): the split learned there, or
        for ``token`` anywhere; None where it is spelled whole. Changes nothing."""
        head = self.after.get((before, token)) if before is not None else None
        head = self.get(token) if head is None else head
        return None if head == token else head


@dataclass
class Forced:
    """Tokens to append without a model call, and the FSM states after each."""

    token_ids: list[int]
    states: list[int]


@dataclass(eq=False)
class Forcer:
    """Computes forced tokens for one FSM and tokenizer; caches per state. Never changes the FSM. ``splits``: the
    splits learned (`learn`), this forcer's own unless a shared `Splits` is passed."""

    fsm: TokenFSM
    tokenizer: Any
    splits: Splits = field(default_factory=Splits)
    _forced_bytes: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    _spelled: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    _spelled_at: int = 0  # the `Splits.version` the spelled and closing caches were filled under
    _closing: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    _spaced: set[int] = field(default_factory=set)  # bytes the target writes whitespace before where it may

    def __post_init__(self) -> None:
        self._byte_token = self.fsm.vocab.single_byte_tokens  # to walk the FSM one byte at a time
        self._backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._byte_level = is_byte_level(self.tokenizer)

    def force(self, state: int) -> Forced | None:
        """The tokens forced from ``state`` (while the FSM allows exactly one token, not EOS), or None.
        A run that reaches a state the vocabulary cannot spell on from ends there: the output keeps the forced
        text, and the row stops there with the `UnspellableError` (`structspec.decoding.row.RowDecode.prepare`).
        Does not change anything."""
        tokens, visited = [], []
        while self.fsm.spellable(state) and (
            len(allowed := self.fsm.allowed_token_ids(state)) == 1 and allowed[0] != self.fsm.eos_token_id
        ):
            token = int(allowed[0])
            state = self.fsm.next_state(state, token)
            tokens.append(token)
            visited.append(state)
        return Forced(tokens, visited) if tokens else None

    def forced_bytes(self, state: int) -> tuple[bytes, int]:
        """The forced text from ``state`` and the state after it. Fills the forcer's cache; changes nothing else."""
        if state in self._forced_bytes:
            return self._forced_bytes[state]
        start, text = state, bytearray()
        # A byte is forced where it is the only one the automaton allows and the state is not final (no EOS):
        # every allowed token starts with it. The byte row is read first: most states allow several bytes, and
        # their token masks (a vocabulary walk on first visit) need not be built for a draft.
        while len(text) < _MAX_FORCED_BYTES and not self.fsm.is_final(state):
            live = self.fsm.next_bytes(state)
            if len(live) != 1 or live[0] not in self._byte_token or not self.fsm.spellable(state):
                break  # (an unspellable state: the output stops there with "error", a draft never enters it)
            state = self.fsm.next_state(state, self._byte_token[live[0]])
            text.append(live[0])
        self._forced_bytes[start] = (bytes(text), state)
        return self._forced_bytes[start]

    def spelled(self, state: int) -> tuple[list[int], list[int]]:
        """The forced text from ``state`` and, where it stops only because JSON whitespace may come next, the one
        other byte allowed there (``"name"`` + ``:`` under a layout that allows whitespace before the colon) unless
        the target was seen writing whitespace before that byte (`learn`: a pretty-printing model's ``{`` +
        newline + ``"``), in the canonical spelling with the learned splits; the states after each token.

        Nothing is held back: these tokens are drafts the target verifies, so a
        boundary where the model would rather merge, or whitespace it writes,
        costs no correctness. Fills the forcer's cache; changes nothing else.
        """
        self._drop_stale()
        if state not in self._spelled:
            text, end = self.forced_bytes(state)
            allowed = self.fsm.next_bytes(end) if not self.fsm.is_final(end) else []
            other = [b for b in allowed if b not in _WHITESPACE]
            if len(other) == 1 and len(other) < len(allowed) and other[0] not in self._spaced:
                text += bytes(other)
            self._spelled[state] = self.spell_text(state, text)
        return self._spelled[state]

    def closing(self, state: int) -> tuple[list[int], list[int]]:
        """The value at ``state`` closed: the first of ``"`` (a string), ``,``, ``}`` and ``]`` (a number or
        literal) the FSM allows there, and the forced text after it, in their canonical spelling (``","`` +
        ``vendor`` + ``":"`` where another key must follow, ``,"`` + ``unit_price`` + ``":`` after a number),
        the states after each; empty where the FSM allows none. Models close a copied value with one such
        token (``","``, ``"}``), rarely with ``"`` alone. Fills the forcer's cache; changes nothing else."""
        self._drop_stale()
        if state not in self._closing:
            self._closing[state] = ([], [])
            for byte in b'",}]':
                token = self._byte_token.get(byte)
                after = self.fsm.next_state(state, token) if token is not None else None
                if after is not None:
                    self._closing[state] = self.spell_text(state, bytes([byte]) + self.forced_bytes(after)[0])
                    break
        return self._closing[state]

    def respellings(self, state: int, text: bytes | None = None, most: int = 1) -> list[tuple[list[int], list[int]]]:
        """Other spellings of ``text`` from ``state`` (default: the forced text there) than `spelled`'s, at most
        ``most``: another first token the FSM allows that spells a prefix of it, longest first, then the rest
        spelled canonically; with the states after each token. Qwen closes one key with ``":`` + ``"`` and the
        next with ``":"``, a value with ``","`` + ``title`` or ``",`` + ``"title``: a learned split is right
        only part of the time. Does not change anything."""
        text = self.forced_bytes(state)[0] if text is None else text
        canonical = self.spell_text(state, text)[0][:1]
        ids, out = self.fsm.vocab.ids_by_bytes, []
        for size in range(min(len(text), _RESPELL_BYTES), 0, -1):
            token = ids.get(text[:size])
            after = self.fsm.next_state(state, token) if token is not None and [token] != canonical else None
            if after is None or not self.fsm.spellable(after):
                continue
            rest, states = self.spell_text(after, text[size:])
            out.append(([token, *rest], [after, *states]))
            if len(out) == most:
                break
        return out

    def spell_text(self, state: int, text: bytes) -> tuple[list[int], list[int]]:
        """``text`` from ``state`` in its canonical spelling with the learned splits, cut where the FSM stops it
        or before a state the vocabulary cannot spell on from (drafts never reach one: only the output stops
        there, with "error"), and the states after each token. Does not change anything."""
        ids = self._respell(self._encode(text) or []) if text else []
        visited = self.fsm.walk(state, ids)
        keep = enterable(self.fsm, visited)
        return ids[:keep], visited[:keep]

    def learn(self, rejected: int, chosen: int, before: int | None = None) -> None:
        """The target rejected forced token ``rejected`` for ``chosen`` after token ``before`` (None: unknown); if
        ``chosen`` spells a proper prefix of it (``":`` for ``":"``), spell forced text that way from now on (in
        every output sharing `splits`), after ``before`` and wherever no split is learned for that place. If
        ``rejected`` was such a learned head and ``chosen`` is the whole token again, spell it whole after
        ``before`` and forget the split elsewhere: Qwen writes the first key's ``":`` + ``"`` and every later
        key's ``":"``, and keeping the split cost a pass per key.
        If ``chosen`` starts with whitespace, the rejected text's first byte was `spelled`'s guess past optional
        whitespace (forced text proper allows none): stop guessing that byte, as the target spaces before it."""
        whole, head = self.fsm.vocab.token_bytes[rejected] or b"", self.fsm.vocab.token_bytes[chosen] or b""
        if head and len(head) < len(whole) and whole.startswith(head):
            self.splits[rejected] = chosen
            if before is not None:
                self.splits.after[(before, rejected)] = chosen
        elif self.splits.head(before, chosen) == rejected:
            self.splits.pop(chosen, None)
            if before is not None:
                self.splits.after[(before, chosen)] = chosen
        elif whole and head[:1] and head[0] in _WHITESPACE and whole[0] not in _WHITESPACE:
            self._spaced.add(whole[0])
        else:
            return
        self.splits.version += 1  # (every forcer sharing them spells anew; this one's whitespace changed too)
        self._drop_stale()

    def _drop_stale(self) -> None:
        """Empty the spelled and closing caches if `splits` changed since they were filled."""
        if self._spelled_at != self.splits.version:
            self._spelled.clear()
            self._closing.clear()
            self._spelled_at = self.splits.version

    def _respell(self, ids: list[int], before: int | None = None) -> list[int]:
        """``ids`` (after token ``before``; None: unknown) with every learned split applied (`Splits.head`, by the
        token before where one is learned there): the preferred head, then the rest spelled canonically."""
        out: list[int] = []
        for t in ids:
            head = self.splits.head(out[-1] if out else before, t)
            if head is None:
                out.append(t)
                continue
            rest = self._encode(self.fsm.vocab.token_bytes[t][len(self.fsm.vocab.token_bytes[head]) :])
            out += [head] + self._respell(rest, head) if rest is not None else [t]
        return out

    def _encode(self, text: bytes) -> list[int] | None:
        """Canonical token ids of ``text`` if they spell exactly ``text``, else None (always without a
        tokenizer: forced tokens and bytes need none, spelling does)."""
        if self.tokenizer is None:
            return None
        try:
            s = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if self._byte_level or self._backend is None:
            ids = self.tokenizer.encode(s, add_special_tokens=False)
        else:  # SentencePiece-style: the BPE model alone, without the normalizer's leading "▁"
            ids = [piece.id for piece in self._backend.model.tokenize(s.replace(" ", "▁"))]
        return ids if self.fsm.vocab.spell(ids) == text else None
