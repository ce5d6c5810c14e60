"""A regex as a lazily determinized byte automaton, and token masks read off it on demand.

outlines-core's `Index` computes, at compile time, the transition of every token
from every state of the regex's DFA. On real JSON Schemas that takes seconds to
minutes (it is JSONSchemaBench's compile-time tail), and most of those states are
never visited by one generation. Here compiling only parses the regex into a
byte-level NFA (Thompson construction; character classes become UTF-8 byte-range
sequences). A DFA state (a set of NFA states) is built when first reached, and
its token mask when decoding first asks for it: the whole vocabulary is walked
through the DFA at once with numpy, one vectorized step per byte position, and
tokens drop out as soon as they hit the dead state.

`TokenIndex` answers the questions outlines-core's `Index` answers, with the same
conventions (EOS is allowed exactly in final states and leads nowhere), so the two
can be compared state by state; `tests/test_automaton.py` does.
"""

from __future__ import annotations

import re
import re._constants as C  # the parser's opcodes
import re._parser as parser
import unicodedata
from functools import cache

import numpy as np

from structspec.errors import RegexError
from structspec.vocab import TokenVocab

_MAX_CODEPOINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)  # not encodable in UTF-8, so never matched
DEAD = 0


# ---- characters → UTF-8 byte-range sequences ----


def _utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of ``lo..hi``.

    Splits the range until every piece has one encoded length and aligned
    continuation bytes; then each byte position ranges independently.
    """
    out, todo = [], [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        bound = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if bound is not None:
            todo += [(lo, bound), (bound + 1, hi)]
            continue
        for i in range(1, len(chr(lo).encode())):
            low_bits = (1 << (6 * i)) - 1
            if lo & ~low_bits == hi & ~low_bits:
                continue
            if lo & low_bits:  # lo is not at the start of a block of 2^(6i) code points
                todo += [(lo, lo | low_bits), ((lo | low_bits) + 1, hi)]
                break
            if hi & low_bits != low_bits:  # hi is not at the end of one
                todo += [(lo, (hi & ~low_bits) - 1), (hi & ~low_bits, hi)]
                break
        else:
            out.append(list(zip(chr(lo).encode(), chr(hi).encode())))
    return out


@cache
def _byte_sequences(ranges: tuple[tuple[int, int], ...]) -> list[list[tuple[int, int]]]:
    """The UTF-8 byte-range sequences of a character class (classes recur: computed once)."""
    return [seq for lo, hi in ranges for seq in _utf8_sequences(lo, hi)]


def _normalize(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged code point ranges without the surrogates."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out = []
    for lo, hi in merged:
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            if a <= b:
                out.append((a, b))
    return tuple(out)


@cache
def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out, nxt = [], 0
    for lo, hi in _normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_CODEPOINT:
        out.append((nxt, _MAX_CODEPOINT))
    return _normalize(tuple(out))


# Unicode's White_Space property, which Rust's regex (outlines-core) reads \s as.
_WHITE_SPACE = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000))


@cache
def _category(name: C._NamedIntConstant) -> tuple[tuple[int, int], ...]:
    """Code point ranges of ``\\d``, ``\\s``, ``\\w`` (and negations), as Rust's regex reads them."""
    negated = {C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT, C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE,
               C.CATEGORY_NOT_WORD: C.CATEGORY_WORD}
    if name in negated:
        return _complement(_category(negated[name]))
    if name is C.CATEGORY_SPACE:
        return _WHITE_SPACE
    # \d is Nd; \w is letters, marks, Nd, Nl, Pc and the two joiners (Python's own \w differs).
    wanted = {"Nd"} if name is C.CATEGORY_DIGIT else {"Nd", "Nl", "Mn", "Mc", "Me", "Pc"}
    letters = name is C.CATEGORY_WORD
    ranges: list[list[int]] = []
    for cp in range(_MAX_CODEPOINT + 1):
        category = unicodedata.category(chr(cp))
        if category in wanted or (letters and (category[0] == "L" or cp in (0x200C, 0x200D))):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    return tuple((lo, hi) for lo, hi in ranges)


# ---- regex → byte NFA ----


class _Unsupported(Exception):
    pass


# Escapes, whole character classes, and parentheses: what a scan for groups must tell apart.
_GROUP_SCAN = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)
_HOLE = 0xF0000  # private-use code points stand in for groups cut out of a regex
_HOLE_MIN = 48  # groups shorter than this are parsed in place


def _parse(regex: str, cache: dict[str, list]) -> list:
    """Parse ``regex`` into `re._parser` items, parsing each distinct large group's text once.

    Translated JSON Schemas repeat subschemas verbatim (outlines-core spells k optional
    properties in O(k²) text), and Python's parser costs microseconds per character.
    Large groups are cut out, replaced by one placeholder character each, and parsed
    separately through ``cache``; identical groups then share one subtree.
    """
    found = cache.get(regex)
    if found is not None:
        return found
    pieces, holes, depth, start, last = [], [], 0, 0, 0
    if not any(_HOLE <= ord(c) < _HOLE + 0x10000 for c in set(regex)):
        for m in _GROUP_SCAN.finditer(regex):
            if m.group() == "(":
                start, depth = (m.start() if depth == 0 else start), depth + 1
            elif m.group() == ")" and depth:
                depth -= 1
                body = start + 3 if regex.startswith("(?:", start) else start + 1
                if depth or m.end() - start < _HOLE_MIN or regex[body] == "?" or len(holes) == 0x10000:
                    continue  # nested, small, or another kind of (?...) group: parsed in place
                pieces += [regex[last:start], chr(_HOLE + len(holes))]
                holes.append(regex[body : m.end() - 1])
                last = m.end()
    tree = list(parser.parse("".join(pieces) + regex[last:]))
    found = cache[regex] = _fill(tree, [_parse(h, cache) for h in holes]) if holes else tree
    return found


def _fill(items: list, subtrees: list[list]) -> list:
    """``items`` with each placeholder literal replaced by its group's subtree."""
    def hole(op: C._NamedIntConstant, arg: object) -> bool:
        return op is C.LITERAL and _HOLE <= arg < _HOLE + len(subtrees)

    out = []
    for op, arg in items:
        if hole(op, arg):
            op, arg = C.SUBPATTERN, (None, 0, 0, subtrees[arg - _HOLE])
        elif op is C.IN and any(hole(*item) for item in arg):  # the parser turned `(…)|(…)` into a set
            others = [item for item in arg if not hole(*item)]
            alternatives = [subtrees[a - _HOLE] for o, a in arg if hole(o, a)] + ([[(C.IN, others)]] if others else [])
            op, arg = C.BRANCH, (None, alternatives)
        elif op is C.SUBPATTERN:
            arg = (*arg[:3], _fill(arg[3], subtrees))
        elif op is C.BRANCH:
            arg = (arg[0], [_fill(alt, subtrees) for alt in arg[1]])
        elif op in _REPEATS:
            arg = (arg[0], arg[1], _fill(arg[2], subtrees))
        out.append((op, arg))
    return out


_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)


class ByteNFA:
    """Thompson NFA over bytes: byte-range edges and epsilon edges; one start, one accept state.

    Construction is hash-consed: an item (by structure) built from a state it was
    already built from returns the same end state. Both ends have the same set of
    strings leading to them, so merging them changes no language, and the O(k²)
    spelling of optional properties becomes an O(k) automaton: the alternatives
    ``(a,)?b``, ``(a,)?(b,)?c``, … share their common prefixes.
    """

    def __init__(self, regex: str) -> None:
        try:
            tree = _parse(regex, {})
        except re.error:
            try:  # the whole regex again, so that the position refers to it
                parser.parse(regex)
            except re.error as e:
                raise RegexError(regex, f"{e.msg} at position {e.pos}") from None
            raise
        if re.match(r"\(\?[aiLmsux]+\)", regex):
            raise RegexError(regex, "inline flags such as (?i) are not supported")
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self._keys: dict[int, int] = {}  # id(items) → structural key (ints, so hashing stays cheap)
        self._interned: dict[tuple, int] = {}
        self._built: dict[tuple[object, int], int] = {}
        self.start = self._new()
        try:
            self.accept = self._sequence(tree, self.start)
        except _Unsupported as e:
            raise RegexError(regex, str(e)) from None
        self._closures: dict[int, frozenset[int]] = {}
        del self._keys, self._interned, self._built

    def __len__(self) -> int:
        return len(self.edges)

    def _new(self) -> int:
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def _key(self, items: list) -> int:
        """A small int naming the structure of ``items``, a sequence of the parsed tree."""
        key = self._keys.get(id(items))  # the tree outlives the build, so ids are not reused
        if key is None:
            parts = tuple(self._item_key(op, arg) for op, arg in items)
            key = self._keys[id(items)] = self._interned.setdefault(parts, len(self._interned))
        return key

    def _item_key(self, op: C._NamedIntConstant, arg: object) -> tuple:
        if op is C.SUBPATTERN:
            return op, arg[1], arg[2], self._key(arg[3])
        if op is C.BRANCH:
            return op, tuple(map(self._key, arg[1]))
        if op in _REPEATS:
            return op, arg[0], arg[1], self._key(arg[2])
        return op, (tuple(arg) if op is C.IN else arg)

    def _sequence(self, items: list, state: int) -> int:
        for op, arg in items:
            memo = (self._item_key(op, arg), state)
            end = self._built.get(memo)
            if end is None:
                end = self._built[memo] = self._item(op, arg, state)
            state = end
        return state

    def _item(self, op: C._NamedIntConstant, arg: object, state: int) -> int:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return self._chars(self._char_ranges(op, arg), state)
        if op is C.SUBPATTERN:
            if arg[1] or arg[2]:
                raise _Unsupported("inline flags such as (?i) are not supported")
            return self._sequence(arg[3], state)
        if op is C.BRANCH:  # alternatives start at `state` itself, so equal prefixes are shared
            end = self._new()
            for alternative in arg[1]:
                self.eps[self._sequence(alternative, state)].append(end)
            return end
        if op in _REPEATS:
            low, high, body = arg
            for _ in range(low):
                state = self._sequence(body, state)
            if high is C.MAXREPEAT:  # star: loop through one state
                loop = self._new()
                self.eps[state].append(loop)
                self.eps[self._sequence(body, loop)].append(loop)
                return loop
            end = self._new()
            for _ in range(high - low):
                self.eps[state].append(end)
                state = self._sequence(body, state)
            self.eps[state].append(end)
            return end
        raise _Unsupported(f"{str(op).lower()} (anchors, lookarounds, backreferences) is not supported")

    def _char_ranges(self, op: C._NamedIntConstant, arg: object) -> tuple[tuple[int, int], ...]:
        if op is C.LITERAL:
            return ((arg, arg),)
        if op is C.NOT_LITERAL:
            return _complement(((arg, arg),))
        if op is C.ANY:  # like Rust's regex (and Python's), '.' is any character but \n
            return _complement(((10, 10),))
        ranges, negate = [], False
        for item_op, item in arg:
            if item_op is C.NEGATE:
                negate = True
            elif item_op is C.LITERAL:
                ranges.append((item, item))
            elif item_op is C.RANGE:
                ranges.append(item)
            elif item_op is C.CATEGORY:
                ranges += _category(item)
            else:
                raise _Unsupported(f"character class item {item_op} is not supported")
        return _complement(tuple(ranges)) if negate else _normalize(tuple(ranges))

    def _chars(self, ranges: tuple[tuple[int, int], ...], state: int) -> int:
        end = self._new()
        for sequence in _byte_sequences(ranges):
            at = state
            for a, b in sequence[:-1]:
                at_next = self._new()
                self.edges[at].append((a, b, at_next))
                at = at_next
            self.edges[at].append((*sequence[-1], end))
        return end

    def closure(self, state: int) -> frozenset[int]:
        """NFA states reachable from ``state`` by epsilon edges that match a byte or accept."""
        found = self._closures.get(state)
        if found is None:
            seen, todo = {state}, [state]
            while todo:
                for nxt in self.eps[todo.pop()]:
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            found = self._closures[state] = frozenset(
                s for s in seen if self.edges[s] or s == self.accept
            )
        return found


# ---- NFA → DFA, one state at a time ----


class LazyDFA:
    """The subset construction of a `ByteNFA`, built as states are reached.

    State 0 is dead. ``table[d, byte]`` is the next state once row ``d`` is
    built (`ensure`); rows are built for whole batches of states at once.
    """

    def __init__(self, nfa: ByteNFA) -> None:
        self.nfa = nfa
        self._sets: list[frozenset[int]] = [frozenset()]
        self._ids: dict[frozenset[int], int] = {frozenset(): DEAD}
        self.table = np.zeros((64, 256), dtype=np.int32)
        self.built = np.zeros(64, dtype=bool)
        self.built[DEAD] = True
        self.initial = self._intern(nfa.closure(nfa.start))

    def __len__(self) -> int:
        return len(self._sets)

    def _intern(self, states: frozenset[int]) -> int:
        d = self._ids.get(states)
        if d is None:
            d = self._ids[states] = len(self._sets)
            self._sets.append(states)
            if d >= len(self.built):  # grow the table by doubling
                self.table = np.concatenate([self.table, np.zeros_like(self.table)])
                self.built = np.concatenate([self.built, np.zeros_like(self.built)])
        return d

    def is_final(self, d: int) -> bool:
        return self.nfa.accept in self._sets[d]

    def ensure(self, states: np.ndarray) -> None:
        """Build the rows of every state in ``states`` not built yet."""
        for d in np.unique(states[~self.built[states]]).tolist():
            targets: list[set[int]] = [set() for _ in range(256)]
            for s in self._sets[d]:
                for lo, hi, to in self.nfa.edges[s]:
                    for byte in range(lo, hi + 1):
                        targets[byte].add(to)
            interned: dict[frozenset[int], int] = {}
            row = self.table[d]
            for byte, to in enumerate(targets):
                key = frozenset(to)
                if key not in interned:
                    interned[key] = self._intern(frozenset().union(*map(self.nfa.closure, key)))
                row[byte] = interned[key]
            self.table[d] = row  # the table may have grown (and been copied) while interning
            self.built[d] = True

    def step(self, d: int, data: bytes) -> int:
        """The state after ``data`` from ``d`` (DEAD if it leaves the language)."""
        for byte in data:
            if not self.built[d]:
                self.ensure(np.array([d]))
            d = int(self.table[d, byte])
            if d == DEAD:
                return DEAD
        return d


# ---- the token index ----


class _VocabBytes:
    """A vocabulary as a byte matrix, longest tokens first, for vectorized walks."""

    def __init__(self, vocab: TokenVocab) -> None:
        ids = [i for i, b in enumerate(vocab.token_bytes) if b and i != vocab.eos_token_id]
        ids.sort(key=lambda i: -len(vocab.token_bytes[i]))
        self.ids = np.array(ids, dtype=np.int64)
        self.lengths = np.array([len(vocab.token_bytes[i]) for i in ids], dtype=np.int64)
        self.matrix = np.zeros((len(ids), int(self.lengths.max(initial=1))), dtype=np.uint8)
        for row, i in enumerate(ids):
            self.matrix[row, : self.lengths[row]] = np.frombuffer(vocab.token_bytes[i], dtype=np.uint8)


_VOCAB_BYTES: dict[str, _VocabBytes] = {}


class TokenIndex:
    """Which tokens a regex allows in each state, computed per state when first asked.

    Same questions and conventions as outlines-core's `Index`: states are ints,
    EOS is allowed exactly in final states, and EOS leads to no state.
    """

    def __init__(self, dfa: LazyDFA, vocab: TokenVocab) -> None:
        self.dfa = dfa
        if vocab.fingerprint not in _VOCAB_BYTES:
            _VOCAB_BYTES[vocab.fingerprint] = _VocabBytes(vocab)
        self._vocab = _VOCAB_BYTES[vocab.fingerprint]
        self._token_bytes = vocab.token_bytes
        self._eos = vocab.eos_token_id
        self._allowed: dict[int, np.ndarray] = {}

    @classmethod
    def from_regex(cls, regex: str, vocab: TokenVocab) -> TokenIndex:
        """Parse ``regex`` (`RegexError` if it is invalid or uses what a DFA cannot do)."""
        return cls(LazyDFA(ByteNFA(regex)), vocab)

    def get_initial_state(self) -> int:
        return self.dfa.initial

    def is_final_state(self, state: int) -> bool:
        return self.dfa.is_final(state)

    def get_next_state(self, state: int, token_id: int) -> int | None:
        data = self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else None
        if token_id == self._eos or not data:
            return None
        nxt = self.dfa.step(state, data)
        return None if nxt == DEAD else nxt

    def get_allowed_tokens(self, state: int) -> list[int]:
        """Allowed token ids in ascending order (EOS last when final)."""
        allowed = self._allowed.get(state)
        if allowed is None:
            allowed = self._allowed[state] = self._walk_vocabulary(state)
        return allowed.tolist() + [self._eos] if self.dfa.is_final(state) else allowed.tolist()

    def _walk_vocabulary(self, state: int) -> np.ndarray:
        vocab, table = self._vocab, self.dfa
        rows = np.arange(len(vocab.ids))  # tokens still alive and not yet ended
        states = np.full(len(rows), state, dtype=np.int32)
        allowed = []
        for position in range(vocab.matrix.shape[1]):
            ended = vocab.lengths[rows] == position  # longest first: the ended ones are at the end
            allowed.append(rows[ended])
            rows, states = rows[~ended], states[~ended]
            if not len(rows):
                break
            table.ensure(states)
            states = table.table[states, vocab.matrix[rows, position]]
            alive = states != DEAD
            rows, states = rows[alive], states[alive]
        allowed.append(rows)
        return np.sort(vocab.ids[np.concatenate(allowed)]).astype(np.int32)
