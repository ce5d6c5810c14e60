"""A turn is two calls on the row: the drivers take the window `RowDecode.prepare` offers and hand the pass's
logits to `RowDecode.commit`, and read nothing else of it."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

import structspec
from structspec import Regex, UnspellableError
from structspec.decoding.drafters.factory import SelfDraft
from structspec.decoding.row import RowDecode
from structspec.decoding.drafters.tree import TreeDrafter

SHIPMENT = Regex(r'\{"customer_name": "[A-Z][a-z]{1,8}", "destination_city": "(Paris|London|Tokyo)", '
                 r'"number_of_items": [0-9]{1,2}\}')
PROMPT = 'Copy: {"customer_name": "Ada", "destination_city": "Tokyo", "number_of_items": 7} for Ada.'
ROW = "structspec.decoding.row"


@pytest.fixture
def touched(monkeypatch) -> Counter[tuple[str, str]]:
    """Every (module, name) read off a `RowDecode` from outside row.py while the test runs."""
    reads: Counter[tuple[str, str]] = Counter()

    def spy(self: RowDecode, name: str) -> object:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller != ROW:
            reads[caller.removeprefix("structspec.decoding."), name] += 1
        return object.__getattribute__(self, name)

    monkeypatch.setattr(RowDecode, "__getattribute__", spy)
    return reads


@pytest.mark.parametrize("kw", [{}, {"draft": None, "fast_forward": "off"}, {"do_sample": True, "seed": 1},
                                {"draft": TreeDrafter()}], ids=["lookup", "plain", "sampled", "tree"])
def test_a_row_alone_is_called_twice_a_turn(byte_lm, touched, kw) -> None:
    result = structspec.generate_result(byte_lm, SHIPMENT, PROMPT, max_new_tokens=60, **kw)
    passes = result.stats.target_forward_passes
    assert passes > 1
    # the prompt's prefill (where the model prefills apart) is the row's one other call, before the first turn
    assert touched == Counter({("loop", "prepare"): passes + 1, ("passes", "commit"): passes,
                               ("loop", "prefilled"): touched["loop", "prefilled"]})
    assert touched["loop", "prefilled"] <= 1


@pytest.mark.parametrize("draft", ["prompt_lookup", TreeDrafter(), SelfDraft()], ids=str)
def test_a_batch_reads_nothing_of_its_rows_but_their_windows(byte_lm, touched, draft) -> None:
    prompts = [PROMPT, "Ship to Paris.", PROMPT.replace("Ada", "Bo"), "x"]
    results = structspec.generate_batch(byte_lm, SHIPMENT, prompts, batch_size=2, max_new_tokens=60, draft=draft)
    commits = sum(r.stats.target_forward_passes for r in results)
    assert {name for _, name in touched} <= {"prepare", "commit", "prefilled"}
    assert touched["passes", "commit"] == commits and touched["batch", "prepare"] >= commits + len(prompts)
