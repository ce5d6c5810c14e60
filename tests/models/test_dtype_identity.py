"""Identity in every dtype: on a batch-invariant model (`LM.batch_invariant`, as `load` makes its models), every
batched row and every draft mode is token-identical to the row decoded alone with plain masked decoding, in
float32 and bfloat16 alike; the kernels that make it so give each row its alone result; forward passes use
transformers' current cache argument."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import structspec
from structspec.models.invariance import TorchLinear, attention_by_row, make_batch_invariant
from structspec.testing import tiny_lm

from tests.conftest import DEVICE
from tests.decoding.test_batch import PROMPTS, SPECS

DTYPES = [torch.float32, torch.bfloat16]


def plain(lm, specs, prompts, max_new_tokens: int = 40) -> list[structspec.Result]:
    return [structspec.generate_result(lm, s, p, max_new_tokens=max_new_tokens, fast_forward="off", draft=None)
            for s, p in zip(specs, prompts)]


@pytest.fixture(scope="module", params=[(k, d) for k in ("byte_level", "sentencepiece") for d in DTYPES],
                ids=lambda p: f"{p[0]}-{str(p[1]).removeprefix('torch.')}")
def invariant_lm(request: pytest.FixtureRequest) -> structspec.LM:
    kind, dtype = request.param
    return tiny_lm(kind, device=DEVICE, dtype=dtype, batch_invariant=True)


@pytest.fixture(scope="module")
def alone(invariant_lm) -> list[structspec.Result]:
    """Plain masked decoding of every row alone on `invariant_lm`: the reference every mode must equal."""
    return plain(invariant_lm, SPECS, PROMPTS)


@pytest.mark.slow
def test_every_batched_row_is_the_row_decoded_alone(invariant_lm, alone) -> None:
    lm = invariant_lm
    assert {r.stop_reason for r in alone} >= {"fsm_complete", "max_new_tokens"}  # rows end at different times
    for batch_size in (1, 2, 3, 8):
        batch = structspec.generate_batch(lm, SPECS, PROMPTS, batch_size=batch_size, max_new_tokens=40,
                                          fast_forward="off")
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone], batch_size
    dtype = str(lm.model.dtype).removeprefix("torch.")
    assert {(r.stats.dtype, r.stats.batch_invariant) for r in alone + batch} == {(dtype, True)}


@pytest.mark.slow
@pytest.mark.parametrize("draft", [None, "prompt_lookup", "lookahead", structspec.TreeDrafter(), structspec.SelfDraft(),
                                   "auto"], ids=str)
def test_every_draft_mode_batched_and_alone_is_plain_masked_decoding(invariant_lm, alone, draft: object) -> None:
    lm = invariant_lm
    fast = [structspec.generate_result(lm, s, p, max_new_tokens=40, draft=draft) for s, p in zip(SPECS, PROMPTS)]
    assert [r.token_ids for r in fast] == [r.token_ids for r in alone]
    for batch_size in (3, 8):
        batch = structspec.generate_batch(lm, SPECS, PROMPTS, batch_size=batch_size, max_new_tokens=40, draft=draft)
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone], batch_size


def test_a_model_not_made_invariant_says_so(byte_lm) -> None:
    result = structspec.generate_result(byte_lm, SPECS[0], PROMPTS[0], max_new_tokens=10)
    assert (result.stats.dtype, result.stats.batch_invariant) == ("float32", False)


def _wide(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """Random inputs over 24 binary orders of magnitude: another summation order shows after rounding."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    return x * torch.exp2(torch.randint(-12, 12, x.shape, generator=generator).float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_torch_kernel_row_linear_gives_every_row_its_alone_result(dtype: torch.dtype) -> None:
    # SmolLM2's shapes; torch's own kernels change a row's sums with the row count (bfloat16 here at 2 vs 8)
    for inner, outer in ((576, 1536), (1536, 576)):
        layer = TorchLinear(torch.nn.Linear(inner, outer, dtype=dtype))
        layer.invariance = "one"  # as `pack_linears` feeds torch's kernel
        x = _wide(40, inner, seed=inner).to(dtype)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
        for rows in (2, 8, 17, 40):  # past a small call's 16 rows, too
            assert torch.equal(layer(x[:rows]), alone[:rows]), (inner, outer, layer.invariance, rows)


def test_attention_gives_each_batch_row_exactly_its_kept_keys() -> None:
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, h, n, 64, generator=generator).to(torch.bfloat16)
                         for h, n in ((9, 3), (3, 40), (3, 40)))  # SmolLM2's heads
    # row 1 of a slot cache: holes at every 7th slot (rejected drafts, a refilled row's old slots)
    seen = torch.ones(2, 1, 3, 40, dtype=torch.bool).tril(37)
    seen[1, 0, :, torch.arange(3, 30, 7)] = False
    kept = seen[1, 0, -1].nonzero().squeeze(-1)  # the slots row 1 kept, and its window (causal over them)
    alone = attention_by_row(query[1:], key[1:, :, kept], value[1:, :, kept], None, None)  # causal over kept
    additive = torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)
    for mask in (seen, additive):
        both = attention_by_row(query, key, value, mask, None)
        assert torch.equal(both[1:], alone)  # as if the holes and padding were never there
        assert torch.equal(both[:1], attention_by_row(query[:1], key[:1], value[:1], None, None))


def test_forward_passes_use_transformers_current_cache_argument() -> None:
    lm = tiny_lm("byte_level", device=DEVICE)
    takes = "cache" in inspect.signature(lm.model.base_model.forward).parameters
    assert lm._cache_argument == ("cache" if takes else "past_key_values")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers warns that past_key_values is removed in 5.40
        structspec.generate_batch(lm, SPECS[:2], PROMPTS[:2], batch_size=2, max_new_tokens=8)
        structspec.generate_result(lm, SPECS[0], PROMPTS[0], max_new_tokens=8, draft="prompt_lookup")


def test_make_batch_invariant_twice_changes_nothing_more() -> None:
    lm = tiny_lm("byte_level", device=DEVICE, dtype=torch.bfloat16, batch_invariant=True)
    layers = [id(m) for m in lm.model.modules()]
    make_batch_invariant(lm.model)
    assert [id(m) for m in lm.model.modules()] == layers and lm.batch_invariant


# SmolLM2 as `load` gives it in each dtype (batch-invariant, packed for oneDNN where it packs): the session's
# fixtures, loaded once for every test that uses them.
SMOLLM2_DTYPES = {"float32": "smollm2", "bfloat16": "smollm2_bf16"}


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", SMOLLM2_DTYPES)
def test_smollm2_batched_rows_are_the_rows_decoded_alone(dtype: str, request: pytest.FixtureRequest) -> None:
    """Six example tasks (one per schema), in float32 (this CPU's default) and bfloat16 (the default on CUDA and
    AVX-512 BF16 CPUs): each batched row, plain and with prompt lookup, equals the row alone."""
    from structspec.tools.tasks import extraction_prompt, load_tasks

    lm = request.getfixturevalue(SMOLLM2_DTYPES[dtype])
    tasks = list({t.schema_name: t for t in load_tasks()}.values())[:6]
    specs, prompts = [t.schema for t in tasks], [extraction_prompt(t.text, t.schema) for t in tasks]
    alone = plain(lm, specs, prompts, max_new_tokens=60)
    for batch_size, draft in ((2, None), (3, None), (8, None), (8, "prompt_lookup")):
        batch = structspec.generate_batch(lm, specs, prompts, batch_size=batch_size, max_new_tokens=60, draft=draft)
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone], (batch_size, draft)
    assert all(r.stats.batch_invariant and r.stats.dtype == dtype for r in batch)


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", SMOLLM2_DTYPES)
def test_a_smollm2_verify_pass_is_its_one_token_steps_bit_for_bit(dtype: str,
                                                                   request: pytest.FixtureRequest) -> None:
    # in bfloat16 on torch's kernel this failed with a lone row padded to two (the key at position n + 5 of
    # layer 1 differed), where `invariant_by`'s random inputs agreed
    from structspec.tools.tasks import extraction_prompt, load_tasks

    lm = request.getfixturevalue(SMOLLM2_DTYPES[dtype])
    task = load_tasks()[0]
    ids = lm.encode_prompt(extraction_prompt(task.text, task.schema))
    n = len(ids) - 16
    cache = lm.new_cache()
    lm.forward(ids[:n], cache)
    steps = torch.cat([lm.forward([token], cache) for token in ids[n:]])
    for window in (2, 7, 16):
        cache = lm.new_cache()
        lm.forward(ids[:n], cache)
        windows = [ids[n + i:][:window] for i in range(0, 16, window)]
        passes = torch.cat([lm.forward(w, cache, logits_to_keep=len(w)) for w in windows])
        assert torch.equal(passes, steps), window


@pytest.mark.slow
@pytest.mark.parametrize("draft", [None, "prompt_lookup", "lookahead"], ids=str)
def test_ragged_windows_and_chunked_prefill_keep_every_row_the_row_alone(invariant_lm, alone, draft,
                                                                          monkeypatch) -> None:
    """Packed passes feed each row only its own tokens (no padding); prompts of up to `max_pass_tokens` are fed
    in chunks by the decode passes, longer ones in a prefill of their own, as alone; every pass's masks filled on
    the worker thread while the model runs; the tokens are the row alone's whatever the packed curve cuts."""
    from structspec import batches
    from structspec.decoding import masks
    from structspec.decoding.cost import FLAT_COST, PassCost

    monkeypatch.setattr(masks, "THREAD_ROWS", 1)  # every pass's masks overlap its forward
    lm = invariant_lm
    packed: list[int] = []  # tokens each batched pass fed, in all
    forward_slots = lm.forward_slots
    monkeypatch.setattr(lm, "forward_slots", lambda windows, *a, **k: (packed.append(sum(map(len, windows))),
                                                                       forward_slots(windows, *a, **k))[1])
    short = [len(lm.encode_prompt(p)) - 1 <= lm.max_pass_tokens for p in PROMPTS]
    assert any(short) and not all(short)
    for curve in (FLAT_COST, PassCost.linear(1.5), PassCost(((1, 1.0), (8, 1.4), (16, 2.0), (64, 6.2)))):
        monkeypatch.setattr(batches, "pass_cost", lambda lm, curve=curve: curve)
        packed.clear()
        batch = structspec.generate_batch(lm, SPECS, PROMPTS, batch_size=3, max_new_tokens=40, draft=draft)
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone], curve
        # every token a pass fed belongs to a row: no padding (a row's `tokens_fed` counts its share of a pass)
        assert sum(packed) == sum(sum(r.stats.tokens_fed) for r in batch)
        assert max(packed) <= lm.max_pass_tokens
        assert [r.stats.prefill_passes for r in batch] == [0 if s else 1 for s in short]  # chunked where short
