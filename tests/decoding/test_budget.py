"""Draft lengths by cost: the pass-cost curve, per-position acceptance, and what a stored curve changes."""

from __future__ import annotations

import json

import pytest

import structspec
from structspec.result import DraftStats
from structspec.decoding import calibrate
from structspec.decoding.cost import (
    FLAT_COST, DraftLength, PassCost, choose_widths, curve_path, draft_pass_cost, pass_cost, prior_cost,
)
from structspec.testing import FakeLM, save_tiny_model, tiny_lm
from structspec.tools import pass_cost as pass_cost_tool


def store(lm: structspec.LM, seconds: dict[int, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """Store ``seconds`` per pass by tokens fed as ``lm``'s curve, as a calibration on an idle machine would."""
    monkeypatch.setattr(calibrate, "measure", lambda lm: seconds)
    monkeypatch.setattr(calibrate, "others_running", lambda: 0)
    assert structspec.calibrate(lm).stored


def test_a_curve_interpolates_between_its_points_and_extends_its_last_slope() -> None:
    cost = PassCost(((1, 1.0), (4, 1.6), (8, 2.0)))
    assert cost(1) == 1.0
    assert cost(2) == pytest.approx(1.2)
    assert cost(6) == pytest.approx(1.8)
    assert cost(12) == pytest.approx(2.4)  # 0.1 per token past 8
    assert PassCost.linear(0.5)(5) == pytest.approx(3.0)
    assert PassCost(((1, 1.0),))(9) == 1.0  # a single point: flat


def test_acceptance_counts_each_position_verified_after_accepted_ones() -> None:
    lengths = DraftLength(FLAT_COST)
    lengths.record(drafted=5, accepted=2)  # tokens 0 and 1 kept, token 2 rejected, 3 and 4 never judged
    lengths.record(drafted=2, accepted=2)
    assert lengths.tried == [2, 2, 1]
    assert lengths.kept == [2, 2, 0]
    assert lengths.hazard(2) < lengths.hazard(0)
    assert lengths.hazard(7) == pytest.approx(2 / 3)  # never tried: the prior


def test_a_new_row_starts_from_its_pools_acceptance_and_moves_off_it_with_its_own() -> None:
    cost = PassCost.linear(0.1)
    pool = DraftLength(cost)
    for _ in range(30):  # earlier rows of the job: drafts rejected at their first token
        DraftLength(cost, pool=pool).record(drafted=4, accepted=0)
    assert pool.tried == [30] and pool.kept == [0]  # each row's verdicts reach the pool
    fresh, alone = DraftLength(cost, pool=pool), DraftLength(cost)
    assert fresh.hazard(0) == pytest.approx(pool.hazard(0)) and pool.hazard(0) < 0.1
    assert alone.hazard(0) == pytest.approx(2 / 3)
    assert fresh.choose(fed=1, cap=8) == 0 < alone.choose(fed=1, cap=8)  # the job's verdicts, not the prior's
    for _ in range(6):  # this row's drafts are kept: its own counts outweigh the pool's three
        fresh.record(drafted=4, accepted=4)
    assert fresh.choose(fed=1, cap=8) > 0
    assert pool.tried[:1] == [36] and fresh.tried == [6, 6, 6, 6]


def test_drafts_grow_where_tokens_are_cheap_and_shrink_where_drafts_fail() -> None:
    flat, steep = PassCost.linear(0.001), PassCost.linear(0.5)
    good, bad = DraftLength(flat), DraftLength(steep)
    for _ in range(20):
        good.record(10, 10)
        bad.record(10, 0)
    assert good.choose(fed=1, cap=10) == 10
    assert bad.choose(fed=1, cap=10) == 0
    assert DraftLength(flat).choose(fed=1, cap=3) == 3  # the cap wins
    # the same history drafts shorter when a fed token costs more
    middling = [DraftLength(PassCost.linear(c)) for c in (0.01, 0.15, 0.4)]
    for lengths in middling:
        for accepted in (0, 2, 3, 5, 1):
            lengths.record(8, accepted)
    chosen = [lengths.choose(fed=1, cap=16) for lengths in middling]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1]


def test_a_drafter_that_stops_where_unsure_is_measured_by_whole_paths() -> None:
    # it drafts on only after confident tokens: where it reached token 2 the path was kept whole, although half
    # its candidates lost token 1 (its unsure last one); the per-position product calls token 2 a coin toss
    product = DraftLength(FLAT_COST, draft_pass=0.25)
    whole = DraftLength(FLAT_COST, draft_pass=0.25, unsure_stops=True)
    for lengths in (product, whole):
        for _ in range(20):
            lengths.record(drafted=4, accepted=4, passes=4)
            lengths.record(drafted=2, accepted=1, passes=2)
    assert whole.expected_kept([-1, 0, 1, 2], [True] * 4)[-1] > product.expected_kept([-1, 0, 1, 2], [True] * 4)[-1]
    assert whole.choose(fed=1, cap=16) > product.choose(fed=1, cap=16)
    # past the deepest token tried: one more like the tried ones (all kept), so the length grows past them
    grows = DraftLength(FLAT_COST, draft_pass=0.25, unsure_stops=True)
    for _ in range(10):
        grows.record(drafted=4, accepted=4, passes=4)
    assert grows.choose(fed=1, cap=16) > 5


def test_a_draft_pass_costs_its_share_of_a_target_pass_per_drafted_token(byte_lm) -> None:
    free, costly = DraftLength(FLAT_COST), DraftLength(FLAT_COST, draft_pass=0.3)
    for lengths in (free, costly):
        for _ in range(5):
            lengths.record(drafted=8, accepted=6, passes=8)  # a model drafter: a pass a token
    assert free.choose(fed=1, cap=16) == 16  # free tokens on a flat curve: as long as allowed
    assert 0 < costly.choose(fed=1, cap=16) < 8
    assert DraftLength(FLAT_COST, draft_pass=1.0).choose(fed=1, cap=16) == 0  # a pass as dear as the target's
    staged = DraftLength(FLAT_COST, draft_pass=1.0)  # ... pays where one draft pass drafts many tokens
    for _ in range(5):
        staged.record(drafted=8, accepted=8, passes=1)
    assert staged.drafting < 0.2 and staged.choose(fed=1, cap=16) > 4
    # the prior: the draft's share of the target's parameters; nothing known of a fake's: free
    assert 0 < draft_pass_cost(byte_lm.early_exit(1), byte_lm) < 1 == draft_pass_cost(byte_lm, byte_lm)
    assert draft_pass_cost(FakeLM(), FakeLM()) == 0


@pytest.mark.slow
def test_a_stored_curve_sets_draft_lengths_and_never_the_output(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "budget-test"  # a curve of its own, apart from the session's shared tiny models
    nameless = FakeLM()
    nameless.name = ""
    assert pass_cost(lm) == prior_cost(lm) and curve_path(nameless) is None  # no name, no curve of its own
    spec = structspec.Regex(r'\{"name": "(ada|bob) (ada|bob) (ada|bob)", "n": [0-9]{1,2}\}')
    prompt = 'Copy: {"name": "ada bob ada", "n": 12} and again {"name": "ada bob ada", "n": 12}'
    runs = {}
    for label, seconds in (("steep", {1: 1.0, 2: 3.0}), ("flat", {1: 1.0, 16: 1.0})):
        store(lm, seconds, monkeypatch)
        assert pass_cost(lm)(2) == pytest.approx(seconds.get(2, 1.0))
        runs[label] = structspec.generate_result(lm, spec, prompt, draft="prompt_lookup", max_new_tokens=40)
    assert runs["steep"].token_ids == runs["flat"].token_ids
    lookup = {label: r.stats.drafts.get("prompt_lookup", DraftStats()) for label, r in runs.items()}
    # a token that costs two one-token passes is worth drafting only beside the prompt's many tokens: in the
    # first pass, and in no later one
    assert lookup["steep"].verify_passes <= 1 < lookup["flat"].verify_passes
    assert lookup["steep"].drafted < lookup["flat"].drafted


def test_the_prior_counts_a_models_parameters_once(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    first = prior_cost(lm)
    monkeypatch.setattr(lm.model, "parameters", lambda: pytest.fail("the parameters were summed again"))
    assert prior_cost(lm) == first == FLAT_COST  # a tiny model: flat


@pytest.mark.slow
def test_pass_cost_table_times_packed_passes_of_every_rows_and_window(tmp_path) -> None:
    model_dir = save_tiny_model(tmp_path / "tiny")
    table = tmp_path / "cells.json"
    assert pass_cost_tool.main(["--model", str(model_dir), "--batch-sizes", "1,3", "--windows", "1,4", "--context",
                                "8", "--repeats", "1", "--json", str(table)]) == 0
    cells = json.loads(table.read_text())["cells"]
    assert [(c["rows"], c["window"]) for c in cells] == [(1, 1), (1, 4), (3, 1), (3, 4)]
    assert all(c["ms"] > 0 and c["forced_ms"] > 0 for c in cells) and cells[0]["relative"] == 1.0


@pytest.mark.slow
def test_pass_cost_store_writes_the_curve_decoding_reads(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(calibrate, "others_running", lambda: 0)  # other test workers may be busy beside this one
    model_dir = save_tiny_model(tmp_path / "tiny")
    assert pass_cost_tool.main(["--model", str(model_dir), "--store", "--repeats", "1", "--context", "8"]) == 0
    stored = pass_cost(structspec.load(str(model_dir), device="cpu"))
    assert [n for n, _ in stored.points] == list(calibrate.TOKENS)  # calibrate's curve: one measure, one curve
    assert stored(1) == 1.0


def test_a_stored_point_never_costs_more_than_a_wider_pass(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "budget-outlier-test"
    # a stall measured the 2-token pass at twice the 4-token one: stored capped by the wider pass
    store(lm, {1: 1.0, 2: 3.0, 4: 1.5, 8: 2.0}, monkeypatch)
    stored = pass_cost(lm)
    assert stored.points == ((1, 1.0), (2, 1.5), (4, 1.5), (8, 2.0))
    assert [stored(n) for n in (1, 2, 3, 4, 8)] == sorted(stored(n) for n in (1, 2, 3, 4, 8))
    # a one-token pass measured slower than a two-token one: capped, and the unit with it
    store(lm, {1: 1.2, 2: 1.0, 4: 1.5}, monkeypatch)
    assert pass_cost(lm).points == ((1, 1.0), (2, 1.0), (4, 1.5))


@pytest.mark.slow
def test_with_a_stored_curve_greedy_rows_keep_their_tokens_and_sampled_rows_their_samples(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "budget-batch-test"
    # alone a row's first drafted tokens are cheap; a batch of 3 feeds 3 pending tokens, and its 4th costs a pass
    store(lm, {1: 1.0, 3: 1.5, 4: 4.0}, monkeypatch)
    spec = structspec.Regex(r'\{"name": "(ada|bob) (ada|bob) (ada|bob)", "n": [0-9]{1,2}\}')
    prompts = [f'Copy {i}: {{"name": "ada bob ada", "n": 12}} {{"name": "ada bob ada", "n": 1{i}}}' for i in range(3)]
    alone = [structspec.generate_result(lm, spec, p, max_new_tokens=40) for p in prompts]
    batched = structspec.generate_batch(lm, spec, prompts, batch_size=3, max_new_tokens=40)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    drafted = [sum(d.drafted for name, d in r.stats.drafts.items() if name != "forced") for r in (alone + batched)]
    assert sum(drafted[3:]) < sum(drafted[:3])  # batched greedy rows draft less where tokens cost more
    sampled = {"temperature": 1.0, "seed": 5, "max_new_tokens": 40}
    batch = structspec.generate_batch(lm, spec, prompts, batch_size=3, **sampled)
    for i, prompt in enumerate(prompts):
        one = structspec.generate_result(lm, spec, prompt, **{**sampled, "seed": 5 + i})
        assert one.token_ids == batch[i].token_ids  # sampled rows draft as if alone: the same draws


# a packed pass against the tokens it feeds in all: the fixed part dominates up to 8 tokens, then each costs more
PACKED = PassCost(((1, 1.0), (8, 1.4), (16, 2.0), (32, 3.4), (64, 6.2)))


def test_packed_widths_feed_each_row_what_pays_for_its_tokens() -> None:
    forced_run = [float(w) for w in range(1, 11)]  # a 10-token forced run: every token fed is output
    draft = [1.0, 1.3, 1.5, 1.6]  # one pending token, then drafts that often fail
    good = [1.0, 1.9, 2.7, 3.4]  # drafts that usually hold
    lone = [1.0]
    # eight rows: 8 tokens cost 1.4; the forced run's tokens each keep one and pay; the failing draft's do not
    assert choose_widths([forced_run, draft] + [lone] * 6, PACKED, [1] * 8) == [10, 1] + [1] * 6
    assert choose_widths([forced_run, draft, good] + [lone] * 5, PACKED, [1] * 8) == [10, 1, 3] + [1] * 5  # 4th: 0.7
    # no curve: every window whole, nothing cut
    assert choose_widths([forced_run, draft] + [lone] * 6, FLAT_COST, [1] * 8) == [10, 4] + [1] * 6
    # 32 rows: a token costs 0.82 of a row's share of the pass, so failing drafts stop paying (plain decoding's
    # pass) and good ones pay for their first token (kept with 0.9), not their second (0.8)
    assert choose_widths([draft] * 32, PACKED, [1] * 32) == [1] * 32
    assert choose_widths([good] * 32, PACKED, [1] * 32) == [2] * 32
    assert choose_widths([good] * 2, PACKED, [1] * 2) == [4, 4]
    # a floor (a sampled row's whole window) is kept; the cap bounds the tokens in all
    assert choose_widths([draft, lone], PACKED, [4, 1]) == [4, 1]
    assert choose_widths([forced_run] * 3, FLAT_COST, [1] * 3, cap=12) == [10, 1, 1]
    assert sum(choose_widths([forced_run] * 8, FLAT_COST, [1] * 8, cap=20)) == 20


def test_expected_kept_tokens_of_a_cut_chain_or_tree() -> None:
    lengths = DraftLength(FLAT_COST)  # every position at the prior: kept with 2/3
    p = 2 / 3
    # a chain: forced text (kept), then two drafted tokens
    assert lengths.expected_kept([-1, 0, 1], [False, True, True]) == pytest.approx([1, 1 + p, 1 + p + p * p])
    # a tree: two drafted roots, the second with a child; its first nodes' best path
    assert lengths.expected_kept([-1, -1, 1], [True, True, True]) == pytest.approx([p, p, p + p * p])
    for _ in range(10):
        lengths.record(drafted=3, accepted=0)  # the first drafted token never kept
    assert lengths.expected_kept([-1, 0], [True, True])[-1] < 0.3


@pytest.mark.parametrize("draft", ["prompt_lookup", "lookahead"])
def test_a_row_alone_is_fed_what_pays_on_the_curve(byte_lm, monkeypatch, draft) -> None:
    from structspec import events
    from structspec.decoding import loop

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
        "type": "string"}}}, "required": ["name", "tags"]}
    prompt = 'Copy: {"name":"abc def ghi","tags":["x","yy","zzz"]} {"name":"abc def ghi","tags":["x","yy"]}'
    plain = structspec.generate_result(byte_lm, schema, prompt, fast_forward="off", draft=None, max_new_tokens=60)

    def run(cost: PassCost, **kw) -> structspec.Result:
        monkeypatch.setattr(events, "pass_cost", lambda lm: cost)  # what generate_result reads and passes down
        return structspec.generate_result(byte_lm, schema, prompt, draft=draft, max_new_tokens=60, **kw)

    flat, steep = run(FLAT_COST), run(PassCost.linear(0.6))
    assert flat.token_ids == steep.token_ids == plain.token_ids  # greedy: passes change, never tokens
    assert sum(steep.stats.tokens_fed) < sum(flat.stats.tokens_fed)  # failing drafts not fed
    assert max(steep.stats.tokens_fed) < max(flat.stats.tokens_fed)
    # a sampled row's draft (drawn with its generator) is never cut; point-mass drafts: the same sample
    monkeypatch.setattr(loop, "choose_widths", lambda *a, **k: pytest.fail("a sampled row's window was cut"))
    sampled = [run(cost, do_sample=True, seed=3) for cost in (FLAT_COST, PassCost.linear(0.6))]
    assert sampled[0].token_ids == sampled[1].token_ids


def test_a_jobs_greedy_rows_share_a_pool_and_a_sampled_row_drafts_by_its_own_history() -> None:
    from structspec.decoding.drafters.lookup import PromptLookup
    from structspec.decoding.row import DecodeOptions, RowDecode, RowInput
    from structspec.decoding.sampling import SamplingConfig

    lm = FakeLM()
    fsm = structspec.compile({"type": "object", "properties": {"a": {"type": "string"}}}, lm).fsm
    pool = DraftLength(FLAT_COST)
    item = RowInput(0, fsm, lm.encode_prompt("x"), PromptLookup(), None)
    greedy = RowDecode.start(item, DecodeOptions(), lm, FLAT_COST, pool)
    sampled = RowDecode.start(item, DecodeOptions(sampling=SamplingConfig(do_sample=True)), lm, FLAT_COST, pool)
    assert greedy.lengths is not None and greedy.lengths.pool is pool
    assert sampled.lengths is not None and sampled.lengths.pool is None  # a seed reproduces its sample in any job
