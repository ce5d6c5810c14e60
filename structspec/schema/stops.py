"""Free text and stop strings as regexes: text holding none of some strings (`avoiding`), and text up to and
including the first of them (`until`).

Both languages are regular: an Aho–Corasick automaton over the strings' characters (every other character
one class) recognises them, and eliminating its states one by one writes the regex (Brzozowski and
McCluskey's state elimination). Stop strings are short, so the regex is too.
"""

from __future__ import annotations

import re
from collections import deque

_ANY = r"[\s\S]"


def avoiding(words: tuple[str, ...]) -> str:
    """A regex for every text (the empty one included) holding none of ``words`` (non-empty strings)."""
    return _eliminate((), words) if words else f"{_ANY}*"


def not_opening(words: tuple[str, ...], openings: tuple[str, ...], skip: str = "") -> str:
    """A regex for every text (the empty one included) holding none of ``words`` that opens, past any characters
    of ``skip``, with none of ``openings`` (non-empty strings): what free text may be where an opening would
    commit to something else. ``words`` hold none of ``skip``'s characters."""
    moves, hit, alphabet = _automaton(words)
    onward: dict[str, set[str]] = {}  # each proper prefix of an opening: the characters that go on along one
    for opening in openings:
        for i in range(len(opening)):
            onward.setdefault(opening[:i], set()).add(opening[i])
    # A text leaves the openings' prefixes at one character; what follows depends only on the words' automaton
    # state there, so the leavings are grouped by that state, each group followed by its state's free text.
    ends, leaving = [], {}
    for path, going_on in onward.items():
        state = 0
        for c in path:
            state = moves[state].get(c, 0)
        if path in openings or hit[state]:
            continue
        ends.append(re.escape(path))
        barred = going_on | (set(skip) if not path else set())
        by_state: dict[int, list[str]] = {}
        for c in alphabet:
            if c not in barred and not hit[moves[state][c]] and moves[state][c]:
                by_state.setdefault(moves[state][c], []).append(c)
        home = "".join(map(re.escape, sorted(barred | {c for c in alphabet if moves[state][c]})))
        leaving.setdefault(0, []).append(re.escape(path) + (f"[^{home}]" if home else _ANY))
        for t, chars in by_state.items():
            leaving.setdefault(t, []).append(re.escape(path) + _class(chars, False, alphabet))
    tails = [f"(?:{'|'.join(heads)})(?:{_eliminate((), words, t) if words else f'{_ANY}*'})"
             for t, heads in leaving.items()]
    opened = f"[{''.join(map(re.escape, skip))}]*" if skip else ""
    return f"{opened}(?:{'|'.join(f'(?:{x})' for x in [*tails, *filter(None, ends)])})?"


def until(stops: tuple[str, ...], avoid: tuple[str, ...] = ()) -> str:
    """A regex for text that ends with the first occurrence of any of ``stops`` (non-empty strings): text
    holding none of them (nor any of ``avoid``), then one of them, written last."""
    return _eliminate(stops, avoid)


def _automaton(words: tuple[str, ...]) -> tuple[list[dict[str, int]], list[set[str]], str]:
    """Aho–Corasick over ``words``: each state's move on each of the words' characters, the words that end at
    each state, and the characters. A character no word holds leads back to the root (state 0)."""
    alphabet = "".join(sorted(set("".join(words))))
    children: list[dict[str, int]] = [{}]
    hit: list[set[str]] = [set()]
    for word in words:
        state = 0
        for c in word:
            if c not in children[state]:
                children.append({})
                hit.append(set())
                children[state][c] = len(children) - 1
            state = children[state][c]
        hit[state].add(word)
    fail = [0] * len(children)
    moves: list[dict[str, int]] = [{} for _ in children]
    order = deque([0])
    while order:  # breadth first: a state's fallback is shallower, so its moves are known
        state = order.popleft()
        hit[state] |= hit[fail[state]]
        for c in alphabet:
            child = children[state].get(c)
            if child is None:
                moves[state][c] = moves[fail[state]][c] if state else 0
            else:
                moves[state][c] = child
                fail[child] = moves[fail[state]][c] if state else 0
                order.append(child)
    return moves, hit, alphabet


def _class(chars: list[str], others: bool, alphabet: str) -> str:
    """One character of ``chars``, plus every character outside ``alphabet`` when ``others``."""
    if others:
        rest = [c for c in alphabet if c not in chars]
        return f"[^{''.join(map(re.escape, rest))}]" if rest else _ANY
    return re.escape(chars[0]) if len(chars) == 1 else f"[{''.join(map(re.escape, chars))}]"


def _eliminate(stops: tuple[str, ...], avoid: tuple[str, ...], first: int = 0) -> str:
    """The regex of the automaton over ``stops`` and ``avoid``, from its state ``first``: a stop's first
    occurrence ends the text (no stops: every text holding no avoided word ends anywhere); an avoided word is a
    dead end."""
    moves, hit, alphabet = _automaton((*stops, *avoid))
    until_first = bool(stops)
    start, end = -1, -2
    edges: dict[tuple[int, int], list[str]] = {(start, first): [""]}
    live = [s for s in range(len(moves)) if not hit[s]]
    for s in live:
        if not until_first:
            edges.setdefault((s, end), []).append("")
        targets: dict[int, list[str]] = {}
        for c, t in moves[s].items():
            targets.setdefault(t, []).append(c)
        targets.setdefault(0, [])  # characters outside the alphabet
        for t, chars in targets.items():
            if t != 0 and not chars:
                continue
            label = _class(chars, t == 0, alphabet) if chars or t == 0 else ""
            if hit[t]:
                if hit[t] & set(stops) and not hit[t] & set(avoid):
                    edges.setdefault((s, end), []).append(label)
            else:
                edges.setdefault((s, t), []).append(label)
    for k in reversed(live):  # deepest first: most edges then point back towards the root
        loop = _alternation(edges.pop((k, k), []))
        star = f"(?:{loop})*" if loop else ""
        into = [(p, _alternation(ls)) for (p, q), ls in list(edges.items()) if q == k]
        out = [(q, _alternation(ls)) for (p, q), ls in list(edges.items()) if p == k]
        for p, _ in into:
            del edges[(p, k)]
        for q, _ in out:
            del edges[(k, q)]
        for p, a in into:
            for q, b in out:
                edges.setdefault((p, q), []).append(_group(a) + star + _group(b))
    return _alternation(edges.get((start, end), []))


def _alternation(labels: list[str]) -> str:
    unique = list(dict.fromkeys(labels))
    return unique[0] if len(unique) == 1 else "|".join(f"(?:{x})" for x in unique)


def _group(regex: str) -> str:
    return f"(?:{regex})" if "|" in regex else regex
