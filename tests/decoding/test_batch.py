"""Batched decoding: every row equals the same row decoded alone; errors stay in their row."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import Regex, batches, events
from structspec.decoding.batch import shared_prefix
from structspec.decoding import cost
from structspec.decoding.cost import FLAT_COST, PassCost
from structspec.decoding.drafters.factory import SelfDraft
from structspec.decoding.row import DecodeOptions, RowDecode, RowInput
from structspec.decoding.window import Window
from structspec.decoding.drafters.tree import TreeDrafter
from structspec.models.packed_slots import PackedSlots
from structspec.testing import chi_square_pvalue, exact_output_distribution, tiny_lm
from structspec.decoding.sampling import SamplingConfig

from tests.conftest import DEVICE


class Order(BaseModel):
    customer: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    city: Literal["Paris", "London", "Tokyo", "Berlin"]
    items: Annotated[int, Field(json_schema_extra={"maxDigits": 2})]
    paid: bool


# mixed specs and prompt lengths: rows finish at different times and are refilled
SPECS = [Order, Regex(r"(red|green|blue) (small|large) [a-z]{2,6}"), Order,
         {"type": "array", "items": {"enum": ["Oslo", "Lima"]}, "maxItems": 3}, Regex(r"[a-z]{3,30}"), Order,
         Regex(r"(yes|no)"), Order]
PROMPTS = ["Alice from Paris ordered 12 items, paid: true. Alice lives in Paris.", "Bob",
           "Carol from London ordered 3 items and has not paid. " * 4, "x y z", "Dave, Tokyo", "Eve paid.",
           "Is it?", "Frank from Berlin, 7 items, paid: false. Frank lives in Berlin."]
MODES = {"off": {"fast_forward": "off"}, "exact": {}, "prompt_lookup": {"draft": "prompt_lookup"},
         "self": {"draft": SelfDraft()}, "auto": {"draft": "auto"}}


def alone(lm, specs, prompts, **options) -> list[structspec.Result]:
    return [structspec.generate_result(lm, s, p, max_new_tokens=40, **options) for s, p in zip(specs, prompts)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_every_row_equals_the_row_decoded_alone(kind: str, mode: str, request) -> None:
    lm = request.getfixturevalue(kind)
    single = alone(lm, SPECS, PROMPTS, **MODES[mode])
    for batch_size in (1, 3, 8):
        batch = structspec.generate_batch(lm, SPECS, PROMPTS, batch_size=batch_size, max_new_tokens=40, **MODES[mode])
        assert [r.token_ids for r in batch] == [r.token_ids for r in single], batch_size
        assert [r.stop_reason for r in batch] == [r.stop_reason for r in single]
        assert [r.value for r in batch] == [r.value for r in single]
        # a batch feeds a row its window or less (`choose_widths` cuts drafts that do not pay), never more
        assert all(b.stats.target_forward_passes >= a.stats.target_forward_passes for a, b in zip(single, batch))
    assert {r.stop_reason for r in single} >= {"fsm_complete", "max_new_tokens"}  # rows end at different times


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True])
def test_a_draft_model_drafts_for_all_rows_in_batched_passes(byte_lm, sampled: bool, free_drafts) -> None:
    draft = tiny_lm("byte_level", seed=7, device=DEVICE)  # another random model: many rejected drafts
    passes = []
    forward_slots = draft.forward_slots
    draft.forward_slots = lambda *a, **k: (passes.append(len(a[4])), forward_slots(*a, **k))[1]
    options = {"temperature": 1.3} if sampled else {}
    single = [structspec.generate_result(byte_lm, s, p, max_new_tokens=40, draft=draft, **options,
                                         **({"seed": 5 + i} if sampled else {}))
              for i, (s, p) in enumerate(zip(SPECS, PROMPTS))]
    batch = structspec.generate_batch(byte_lm, SPECS, PROMPTS, batch_size=4, max_new_tokens=40, draft=draft,
                                      **options, **({"seed": 5} if sampled else {}))
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    drafted = sum(r.stats.drafts["draft_model"].drafted for r in batch)
    assert drafted > sum(r.stats.drafts["draft_model"].accepted for r in batch) > 0
    assert passes and max(passes) == 4  # one draft pass serves every row of the batch
    assert len(passes) < sum(r.stats.drafts["draft_model"].draft_passes for r in batch)


@pytest.mark.slow
def test_holes_from_rejected_drafts_are_compacted(byte_lm, monkeypatch) -> None:
    compactions = []
    original = PackedSlots.compact

    def compact(self: PackedSlots) -> bool:
        compactions.append(original(self))
        return compactions[-1]

    monkeypatch.setattr(PackedSlots, "compact", compact)
    monkeypatch.setattr(PackedSlots, "slack", 0)  # compact as soon as holes outnumber used slots
    draft = tiny_lm("byte_level", seed=7, device=DEVICE)
    single = alone(byte_lm, SPECS, PROMPTS, draft=draft)
    batch = structspec.generate_batch(byte_lm, SPECS, PROMPTS, batch_size=4, max_new_tokens=40, draft=draft)
    assert sum(compactions) >= 2  # compacted more than once, between refills too
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]


@pytest.mark.slow
def test_iter_batch_yields_each_row_once_as_it_finishes(byte_lm) -> None:
    seen = [i for i, _ in structspec.iter_batch(byte_lm, SPECS, PROMPTS, batch_size=3, max_new_tokens=40)]
    assert sorted(seen) == list(range(len(PROMPTS)))
    assert seen != list(range(len(PROMPTS)))  # short rows come back before long ones


@pytest.mark.slow
def test_the_shared_prompt_prefix_is_prefilled_once(byte_lm) -> None:
    instruction = "Extract the order as JSON. Use the customer's first name and the city they live in. Text: "
    prompts = [instruction + p for p in PROMPTS[:4]]
    batch = structspec.generate_batch(byte_lm, Order, prompts, batch_size=2, max_new_tokens=40)
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone(byte_lm, [Order] * 4, prompts)]
    reused = [r.stats.prefix_tokens_reused for r in batch]
    assert len(set(reused)) == 1 and reused[0] >= len(byte_lm.encode_prompt(instruction)) - 2


def test_shared_prefix_leaves_every_prompt_its_last_token() -> None:
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == [1, 2]
    assert shared_prefix([[1, 2, 3], [1, 5, 3]]) == [1]
    assert shared_prefix([[7], [7, 8]]) == []


@pytest.mark.slow
def test_sampled_rows_keep_the_distribution_and_do_not_depend_on_the_batch(byte_lm) -> None:
    spec, prompt, temperature = Regex(r"(ab|b|ba|a){1,3}"), "pick:", 1.5
    fsm = structspec.compile(spec, byte_lm).fsm
    exact = exact_output_distribution(byte_lm, fsm, byte_lm.encode_prompt(prompt), SamplingConfig(True, temperature))
    n = 400
    batch = structspec.generate_batch(byte_lm, spec, [prompt] * n, batch_size=8, temperature=temperature, seed=0,
                                      draft="prompt_lookup")
    counts: dict[tuple[int, ...], int] = {}
    for r in batch:
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert chi_square_pvalue(counts, exact) > 0.001
    # row i samples with seed + i: the same draws at another batch size and alone
    again = structspec.generate_batch(byte_lm, spec, [prompt] * 12, batch_size=5, temperature=temperature, seed=0)
    assert [r.token_ids for r in again] == [r.token_ids for r in batch[:12]]
    assert [structspec.generate_result(byte_lm, spec, prompt, temperature=temperature, seed=i).token_ids
            for i in range(4)] == [r.token_ids for r in batch[:4]]


@pytest.mark.slow
def test_bad_rows_are_results_and_other_rows_are_unaffected(byte_lm) -> None:
    long_prompt = "word " * (byte_lm.max_context + 10)
    prompts = [PROMPTS[0], "", long_prompt, PROMPTS[1]]
    specs = [Order, Order, Order, Regex("(ab")]
    results = structspec.generate_batch(byte_lm, specs, prompts, batch_size=4, max_new_tokens=40)
    assert results[0].token_ids == alone(byte_lm, [Order], PROMPTS[:1])[0].token_ids
    for i, kind, words in [(1, structspec.PromptError, "empty"), (2, structspec.PromptError, "shorten the prompt"),
                           (3, structspec.RegexError, "(ab")]:
        assert results[i].stop_reason == "error" and results[i].value is None
        assert isinstance(results[i].error, kind) and words in str(results[i].error)
        assert f"row {i}" in str(results[i].error)


def test_batch_arguments_are_checked_before_any_pass(byte_lm) -> None:
    with pytest.raises(structspec.OptionError, match="2 specs for 3 prompts"):
        structspec.generate_batch(byte_lm, [Order, Order], PROMPTS[:3])
    with pytest.raises(structspec.OptionError, match="batch_size"):
        structspec.generate_batch(byte_lm, Order, PROMPTS[:3], batch_size=0)
    with pytest.raises(structspec.OptionError, match="list of prompts"):
        structspec.generate_batch(byte_lm, Order, "one prompt")


@pytest.mark.slow
def test_a_full_context_stops_the_row_with_its_partial_text() -> None:
    lm = tiny_lm("byte_level", device=DEVICE)
    prompt, room = PROMPTS[2], 9
    lm.max_context = len(lm.encode_prompt(prompt)) + room  # the model's positions, as its config would say
    spec = Regex(r"[a-z]{40}")
    single = structspec.generate_result(lm, spec, prompt, max_new_tokens=40)
    batch = structspec.generate_batch(lm, [spec, spec], [prompt, "Bob"], batch_size=2, max_new_tokens=40)
    assert single.stop_reason == batch[0].stop_reason == "max_context" and single.value is None
    assert len(single.token_ids) == room + 1  # every position used, and the last choice kept
    assert batch[0].token_ids == single.token_ids
    assert batch[1].stop_reason != "max_context"
    with pytest.raises(structspec.PromptError, match=f"{lm.max_context} positions"):
        structspec.generate_result(lm, spec, prompt * 2)


@pytest.mark.real_model
def test_smollm2_batched_rows_equal_single_rows(smollm2) -> None:
    # `load` makes the model batch-invariant: a batched row is its row alone bit for bit, not up to near-ties
    from structspec.tools.tasks import extraction_prompt, load_tasks

    assert smollm2.batch_invariant
    tasks = list({t.schema_name: t for t in load_tasks()}.values())[:6]  # one task per schema
    specs = [t.schema for t in tasks]
    prompts = [extraction_prompt(t.text, t.schema) for t in tasks]
    options = {"max_new_tokens": 120, "draft": "prompt_lookup"}
    single = [structspec.generate_result(smollm2, s, p, **options) for s, p in zip(specs, prompts)]
    batch = structspec.generate_batch(smollm2, specs, prompts, batch_size=6, **options)
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]


@pytest.mark.slow
def test_batch_size_one_and_sliding_window_models_run_the_single_row_loop() -> None:
    lm = tiny_lm("byte_level", device=DEVICE)
    lm.batchable = False  # as a model with sliding-window layers (Gemma 3) says
    lm.forward_slots = None  # the slot path must not run
    batch = structspec.generate_batch(lm, SPECS[:3], PROMPTS[:3], batch_size=3, max_new_tokens=40)
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone(lm, SPECS[:3], PROMPTS[:3])]
    assert [r.stats.prefill_passes for r in batch] == [0, 0, 0]


# Each row's tokens in a packed pass (`choose_widths`, `Window.first`) by a packed curve. STEEP: a token past a
# pass's first costs 1.5 one-token passes, so rows are fed their pending tokens only, no draft and no spliced text;
# STORED: a CPU-like curve (the fixed part dominates up to 8 tokens), so widths vary with what the rows bring.
STEEP = PassCost.linear(1.5)
STORED = PassCost(((1, 1.0), (8, 1.4), (16, 2.0), (32, 3.4), (64, 6.2)))
# long forced runs (fast-forwarded into pending, then fed in chunks) beside rows with choices
SHIPMENT = Regex(r'\{"customer_name": "[A-Z][a-z]{1,8}", "destination_city": "(Paris|London|Tokyo)", '
                 r'"number_of_items": [0-9]{1,2}, "shipping_is_paid": (true|false)\}')
FORCED_SPECS = [SHIPMENT, SPECS[1], SHIPMENT, SPECS[3], Order, SHIPMENT, SPECS[4], SHIPMENT]
FORCED_PROMPTS = [f'Copy: {{"customer_name": "{name}", "destination_city": "{city}", "number_of_items": {n}, '
                  f'"shipping_is_paid": true}} and {name} again.' if i % 2 == 0 else PROMPTS[i]
                  for i, (name, city, n) in enumerate(zip(["Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal"],
                                                          ["Paris", "Tokyo", "London", "Paris"] * 2, range(3, 90, 11)))]


def spy_fits(monkeypatch) -> tuple[list[tuple[int, int, int]], list[int]]:
    """(window length, width, pending tokens) of every window a batch cut (`Window.first`), and the pending tokens
    before every chunk committed."""
    fits, chunks = [], []
    first, commit = Window.first, RowDecode.commit
    monkeypatch.setattr(Window, "first", lambda self, width: (
        fits.append((len(self.tokens), width, len(self.pending))), first(self, width))[1])
    monkeypatch.setattr(RowDecode, "commit", lambda self, window, *args: (
        window.chunk and chunks.append(len(window.pending)), commit(self, window, *args))[1])
    return fits, chunks


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["prompt_lookup", TreeDrafter(), "lookahead", SelfDraft(), None], ids=str)
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_windows_fit_to_the_batch_width_keep_plain_masked_tokens(kind: str, draft: object, request,
                                                                 monkeypatch) -> None:
    lm = request.getfixturevalue(kind)
    plain = alone(lm, FORCED_SPECS, FORCED_PROMPTS, fast_forward="off", draft=None)
    assert sum(r.stats.forced_tokens for r in alone(lm, FORCED_SPECS, FORCED_PROMPTS, draft=None)) > 40
    for curve in (STEEP, STORED):
        monkeypatch.setattr(batches, "pass_cost", lambda lm, curve=curve: curve)
        fits, chunks = spy_fits(monkeypatch)
        got = structspec.generate_batch(lm, FORCED_SPECS, FORCED_PROMPTS, batch_size=4, max_new_tokens=40, draft=draft)
        assert [r.token_ids for r in got] == [r.token_ids for r in plain]
        assert [r.stop_reason for r in got] == [r.stop_reason for r in plain]
        # every pass caches at least one token per row: never more passes than one token per pass
        for r, p in zip(got, plain):
            assert r.stats.target_forward_passes <= p.stats.target_forward_passes
        # a row is fed its pending tokens (prompt, forced run) whole: no cap here, so never a chunk
        assert not chunks and all(width >= max(pending, 1) for _, width, pending in fits)
        if curve is STEEP:  # no token beyond the pending ones pays: plain masked decoding's passes
            assert all(width == max(pending, 1) for _, width, pending in fits)
            assert any(length > width for length, width, _ in fits)  # drafts and spliced text were cut
        else:  # where rows bring forced text or drafts that hold, feeding them pays
            assert any(width > max(pending, 1) for _, width, pending in fits)
    monkeypatch.setattr(batches, "pass_cost", lambda lm: FLAT_COST)  # no curve: every window whole
    fits, chunks = spy_fits(monkeypatch)
    whole = structspec.generate_batch(lm, FORCED_SPECS, FORCED_PROMPTS, batch_size=4, max_new_tokens=40, draft=draft)
    assert [r.token_ids for r in whole] == [r.token_ids for r in plain]
    assert not chunks and all(length <= width for length, width, _ in fits)
    assert max(n for r in whole for n in r.stats.tokens_fed[1:]) > 5


def test_a_chunk_feeds_pending_tokens_with_no_logits(byte_lm) -> None:
    fsm = structspec.compile(SHIPMENT, byte_lm).fsm
    prompt = byte_lm.encode_prompt("Ship the order now, please:")
    row = RowDecode.start(RowInput(0, fsm, prompt, None, None), DecodeOptions(), byte_lm, FLAT_COST)  # all pending
    window = row.prepare()
    assert isinstance(window, Window) and window.start == 0 and list(window.pending) == prompt
    assert len(prompt) > 4 and window.candidate.sources == ["forced"] * (len(window.tokens) - len(prompt)) != []
    assert window.gains == tuple(float(w) for w in range(1, len(window.tokens) + 1))  # pending, forced: certain
    chunk = window.first(3)
    assert chunk.tokens == prompt[:3] and window.tokens[:3] == prompt[:3]  # a new window: the offer stays whole
    assert chunk.states == [] and chunk.parents == [-1, 0, 1] and chunk.positions == [0, 1, 2]
    done = row.commit(chunk, torch.empty(0, byte_lm.logits_width))
    assert done.kept == [0, 1, 2] and done.token_ids == [] and row.out == []
    again = row.prepare()  # the rest of the prompt, then the same candidate
    assert isinstance(again, Window) and again.tokens == window.tokens[3:]
    assert again.start == 3 and list(again.pending) == prompt[3:]
    cut = again.first(len(prompt) - 1)
    assert cut.tokens == window.tokens[3 : len(prompt) + 2]  # the candidate cut to its first two nodes
    assert cut.states == [again.state] + cut.candidate.states and len(cut.candidate.tokens) == 2
    assert cut.positions == list(range(3, len(prompt) + 2))


@pytest.mark.slow
def test_sampled_rows_are_never_cut_so_their_samples_do_not_depend_on_the_batch(byte_lm, monkeypatch, free_drafts) -> None:
    # alone a row's drafted tokens are nearly free, past 8 tokens in a pass each costs a whole pass: were a
    # sampled row's draft (drawn with its generator) cut to the batch's width, its next draws would differ
    curve = PassCost(((1, 1.0), (8, 1.1), (9, 2.1)))
    for module in (batches, events):  # what generate_batch and generate_result read and pass down
        monkeypatch.setattr(module, "pass_cost", lambda lm: curve)
    draft = tiny_lm("byte_level", seed=7, device=DEVICE)
    options = {"temperature": 1.3, "max_new_tokens": 40, "draft": draft}
    single = [structspec.generate_result(byte_lm, s, p, seed=5 + i, **options)
              for i, (s, p) in enumerate(zip(FORCED_SPECS, FORCED_PROMPTS))]
    got = structspec.generate_batch(byte_lm, FORCED_SPECS, FORCED_PROMPTS, batch_size=4, seed=5, **options)
    assert [r.token_ids for r in got] == [r.token_ids for r in single]
    assert max(n for r in got for n in r.stats.tokens_fed) > 3  # long drafts, fed whole


def test_batched_self_draft_rows_count_the_draft_passes_they_asked_for(byte_lm, monkeypatch) -> None:
    # a batched row's self-draft waits on one shared draft pass per round (a DraftRequest, not a replay): each
    # row drafts what it drafts alone and counts one draft pass per drafted token, as alone
    monkeypatch.setattr(cost, "prior_cost", lambda lm: FLAT_COST)  # every window whole, as alone
    prompts = ["Alice from Paris ordered 12 items.", "Bob from London, 3 items", "Carol, Paris, 7 items"]
    alone = [structspec.generate_result(byte_lm, Order, p, max_new_tokens=40, draft=SelfDraft()) for p in prompts]
    batched = structspec.generate_batch(byte_lm, Order, prompts, batch_size=3, max_new_tokens=40, draft=SelfDraft())
    for a, b in zip(alone, batched):
        assert b.token_ids == a.token_ids
        mine, theirs = b.stats.drafts["self_draft"], a.stats.drafts["self_draft"]
        assert (mine.drafted, mine.accepted, mine.draft_passes) == (theirs.drafted, theirs.accepted, theirs.draft_passes)
        assert mine.draft_passes >= mine.drafted > 0
