"""oneDNN-packed linear layers (`structspec.models.invariance`): the same logits as torch's kernels, decoding that is
identical across every mode on a packed model, transformers' generate on it, and `load`'s option."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from typing import Literal

import structspec
from structspec.decoding.cost import curve_path
from structspec.errors import OptionError
from structspec.models.device import native_bf16
from structspec.models.invariance import (
    BY_ROW, PackedLinear, attention_by_row, measure_invariance, pack_linears, packable, use_attention_by_row,
)
from structspec.testing import byte_level_tokenizer, save_tiny_model, sentencepiece_tokenizer, tiny_llama
from tests.numerics import assert_logits_close

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


class Order(BaseModel):
    item: Literal["apple", "pear", "plum"]
    count: int
    note: str


PROMPT = 'Order: {"item": "pear", "count": 12, "note": "ripe pear from the market"}. Again: '


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def pair(request: pytest.FixtureRequest) -> tuple[structspec.LM, structspec.LM]:
    """The same random model twice, for each tokenizer family: torch's kernels, and packed."""
    tokenizer = {"byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer}[request.param]()
    plain = structspec.from_transformers(tiny_llama(tokenizer, seed=3), tokenizer)
    packed_model = tiny_llama(tokenizer, seed=3)
    assert packable(packed_model.device, packed_model.dtype)
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed_model.modules())
    assert pack_linears(packed_model) == linears > 0
    return plain, structspec.from_transformers(packed_model, tokenizer)


def test_packing_replaces_every_linear_and_keeps_the_heads_dense_weight(pair) -> None:
    plain, packed = pair
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    head = packed.model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight is not None
    assert all(m.weight is None for m in packed.model.modules() if isinstance(m, PackedLinear) and m is not head)
    assert (packed.kernels, plain.kernels) == ("onednn", "torch")
    assert packed.logits_width == plain.logits_width


def test_packed_logits_match_torchs_for_every_window_and_restricted_rows(pair) -> None:
    plain, packed = pair
    ids = plain.encode_prompt(PROMPT)
    for window in (1, 2, 5, 16):
        caches = [lm.new_cache() for lm in pair]
        for lm, cache in zip(pair, caches):
            lm.forward(ids[:-window], cache)
        full = [lm.forward(ids[-window:], cache, logits_to_keep=window) for lm, cache in zip(pair, caches)]
        assert_logits_close(full[1], full[0])  # other kernels, other blockings: rounding only
    hidden = torch.randn(2, plain.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    few = torch.tensor([3, 70, 200])
    rows = [lm.head(hidden, [None, few]) for lm in pair]
    assert_logits_close(rows[1], rows[0])
    assert rows[1][1].isfinite().sum() == 3


def test_a_packed_layer_runs_under_autograd_without_recording_a_graph(pair) -> None:
    _, packed = pair
    ids = torch.tensor([packed.encode_prompt(PROMPT)[:1]])
    with torch.enable_grad():
        logits = packed.model(input_ids=ids).logits
    assert not logits.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(packed.model(input_ids=ids).logits, logits)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["prompt_lookup", structspec.TreeDrafter(), structspec.SelfDraft(),
                                   structspec.SelfDraft(threshold=True)], ids=str)
def test_every_mode_on_a_packed_model_decodes_as_plain_masked(pair, draft: object) -> None:
    _, packed = pair
    plain = structspec.generate_result(packed, Order, PROMPT, draft=None, fast_forward="off", max_new_tokens=60)
    fast = structspec.generate_result(packed, Order, PROMPT, draft=draft, max_new_tokens=60)
    assert fast.token_ids == plain.token_ids
    assert fast.stats.target_forward_passes < plain.stats.target_forward_passes
    batched = structspec.generate_batch(packed, Order, [PROMPT, PROMPT + " "], batch_size=2, draft=draft,
                                        max_new_tokens=60)
    assert batched[0].token_ids == plain.token_ids


def test_transformers_generate_runs_on_a_packed_model(pair) -> None:
    ids = torch.tensor([pair[0].encode_prompt(PROMPT)])
    outs = [lm.model.generate(ids, max_new_tokens=8, do_sample=False) for lm in pair]
    assert outs[0].shape[1] > ids.shape[1]  # it generated (up to 8 tokens, or until the model's EOS)
    assert outs[1].tolist() == outs[0].tolist()


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def bf16_pair(request: pytest.FixtureRequest) -> tuple[structspec.LM, structspec.LM]:
    """The same random model in bfloat16 twice, for each tokenizer family: torch's kernels, and packed with
    attention by row, as `load` makes a bfloat16 CPU model."""
    if not native_bf16():
        pytest.skip("this CPU has no native bfloat16 path (AVX-512 BF16 or AMX): bfloat16 is not packed")
    tokenizer = {"byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer}[request.param]()
    plain = structspec.from_transformers(tiny_llama(tokenizer, seed=3).to(torch.bfloat16), tokenizer)
    packed_model = tiny_llama(tokenizer, seed=3).to(torch.bfloat16)
    assert packable(packed_model.device, packed_model.dtype)
    assert pack_linears(packed_model) > 0
    use_attention_by_row(packed_model)
    return plain, structspec.from_transformers(packed_model, tokenizer)


def _wide(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """Random inputs over 24 binary orders of magnitude: another summation order shows after rounding."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    return x * torch.exp2(torch.randint(-12, 12, x.shape, generator=generator).float())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_layer_gives_each_row_what_it_gives_the_row_alone(dtype: torch.dtype) -> None:
    if not packable(torch.device("cpu"), dtype):
        pytest.skip(f"{dtype} is not packed on this CPU")
    for inner, outer in ((4864, 896), (896, 4864), (64, 96)):  # Qwen2.5-0.5B's down and up projections, a tiny one
        layer = PackedLinear(torch.nn.Linear(inner, outer, dtype=dtype))
        layer.invariance, layer.most = measure_invariance(layer)
        x = _wide(64, inner, seed=inner).to(dtype)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(64)])
        for rows in (2, 5, 7, 16, 17, 40, 64):  # past a small call's 16 rows too
            assert torch.equal(layer(x[:rows]), alone[:rows]), (inner, outer, layer.invariance, layer.most, rows)
        assert torch.equal(layer(x[None, :3]), alone[None, :3])  # a [batch, rows, features] input too


def test_the_ways_to_feed_rows_give_the_kernels_results() -> None:
    layer = PackedLinear(torch.nn.Linear(32, 8))
    x = _wide(5, 32)
    with torch.no_grad():
        direct = [layer._product(x[i:i + 1]) for i in range(5)]
        padded = layer._product(torch.cat([x[:1], torch.zeros(1, 32)]))[:1]
        layer.invariance = "pad"
        assert torch.equal(layer(x[:1]), padded)
        layer.invariance = "one"
        assert torch.equal(layer(x), torch.cat(direct))


def test_attention_by_row_is_each_rows_one_token_step_for_every_mask_form() -> None:
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, h, n, 16, generator=generator).to(torch.bfloat16)
                         for h, n in ((4, 5), (2, 40), (2, 40)))
    steps = torch.cat([attention_by_row(query[:, :, i:i + 1], key[:, :, :36 + i], value[:, :, :36 + i], None, None)
                       for i in range(5)], dim=2)
    causal = torch.ones(5, 40, dtype=torch.bool).tril(35)[None, None]
    additive = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
    for mask in (None, causal, additive):
        assert torch.equal(attention_by_row(query, key, value, mask, None), steps)
    expanded = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
    whole = torch.nn.functional.scaled_dot_product_attention(query.float(), expanded[0].float(), expanded[1].float(),
                                                             attn_mask=causal)
    torch.testing.assert_close(steps.float(), whole, rtol=0.02, atol=0.02)
    # a token tree: node 3 does not see its sibling at key 37; it attends to its path's keys, gathered
    tree = causal.clone()
    tree[0, 0, 3:, 37] = False
    path = torch.tensor([*range(37), 38])
    node = attention_by_row(query[:, :, 3:4], key[:, :, path], value[:, :, path], None, None)
    assert torch.equal(attention_by_row(query, key, value, tree, None)[:, :, 3:4], node)
    # a batch of slots: row b's keys have holes, so each row keeps its mask
    holes = causal.repeat(2, 1, 1, 1)
    holes[1, 0, :, 3] = False
    two = attention_by_row(query.repeat(2, 1, 1, 1), key.repeat(2, 1, 1, 1), value.repeat(2, 1, 1, 1), holes, None)
    assert torch.equal(two[:1], steps) and not torch.equal(two[1:], steps)


def test_packed_bfloat16_logits_are_torchs_within_bfloat16_rounding(bf16_pair) -> None:
    plain, packed = bf16_pair
    ids = plain.encode_prompt(PROMPT)
    for window in (1, 5, 16):
        caches = [lm.new_cache() for lm in bf16_pair]
        for lm, cache in zip(bf16_pair, caches):
            lm.forward(ids[:-window], cache)
        full = [lm.forward(ids[-window:], cache, logits_to_keep=window) for lm, cache in zip(bf16_pair, caches)]
        # bfloat16 keeps 8 bits of mantissa and the packed model's attention runs in float32: the two sum in
        # other orders and round at other places, so logits agree to a few percent of their range
        scale = float(full[0].abs().max())
        torch.testing.assert_close(full[1], full[0], rtol=0.0, atol=0.05 * scale)
        assert float((full[1] - full[0]).abs().mean()) < 0.005 * scale


def test_a_packed_bfloat16_verify_pass_is_its_one_token_steps_bit_for_bit(bf16_pair) -> None:
    _, packed = bf16_pair
    assert packed.model.config._attn_implementation == BY_ROW
    ids = packed.encode_prompt(PROMPT + PROMPT)
    cache = packed.new_cache()
    packed.forward(ids[:-16], cache)
    steps = torch.cat([packed.forward([t], cache) for t in ids[-16:]])
    for window in (2, 7, 16):
        cache = packed.new_cache()
        packed.forward(ids[:-16], cache)
        passes = torch.cat([packed.forward(ids[len(ids) - 16 + i:][:window], cache, logits_to_keep=window)
                            for i in range(0, 16, window)])[:16]
        assert torch.equal(passes, steps)


@pytest.mark.parametrize("draft", ["prompt_lookup", structspec.TreeDrafter(), "lookahead"], ids=str)
def test_every_mode_on_a_packed_bfloat16_model_decodes_as_plain_masked(bf16_pair, draft: object) -> None:
    _, packed = bf16_pair
    assert packed.kernels == "onednn" and packed.model.dtype == torch.bfloat16 and packed.prefills_apart
    plain = structspec.generate_result(packed, Order, PROMPT, draft=None, fast_forward="off", max_new_tokens=60)
    fast = structspec.generate_result(packed, Order, PROMPT, draft=draft, max_new_tokens=60)
    assert fast.token_ids == plain.token_ids
    assert plain.stats.prefill_passes == fast.stats.prefill_passes == 1  # the prompt but its last token, apart
    assert fast.stats.target_forward_passes < plain.stats.target_forward_passes
    batched = structspec.generate_batch(packed, Order, [PROMPT, PROMPT + " "], batch_size=2, draft=draft,
                                        max_new_tokens=60)
    assert batched[0].token_ids == plain.token_ids


def test_load_makes_a_cpu_model_batch_invariant_where_it_packs_it(tmp_path) -> None:
    directory = save_tiny_model(tmp_path / "tiny")
    single = structspec.load(str(directory), device="cpu", dtype="float32")
    # float32 too: a batch row's attention over a slot cache with holes is not the row's own
    assert single.kernels == "onednn" and single.model.config._attn_implementation == BY_ROW
    assert single.batch_invariant
    half = structspec.load(str(directory), device="cpu", dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16
    assert (half.kernels, half.model.config._attn_implementation == BY_ROW) == (
        ("onednn", True) if native_bf16() else ("torch", True))
    assert half.batch_invariant
    kept = structspec.load(str(directory), device="cpu", dtype="bfloat16", kernels="torch")  # left as it is
    assert kept.model.config._attn_implementation != BY_ROW and not kept.batch_invariant


@pytest.mark.real_model
def test_load_packs_float32_cpu_models_and_names_the_curve(smollm2: structspec.LM) -> None:
    assert smollm2.kernels == "onednn"
    path = curve_path(smollm2)
    assert path is not None and path.name.endswith("-onednn2-packed.json")  # torch's kernels have another curve
    with pytest.raises(OptionError, match="kernels='fast' is not one of"):
        structspec.load("smollm2-135m", kernels="fast")
    with pytest.raises(OptionError, match="float32 model on the CPU"):
        structspec.load("smollm2-135m", dtype="float16", kernels="onednn")
    assert not packable(torch.device("cpu"), torch.float16)  # auto leaves a float16 model to torch
    # bfloat16 is packed where the CPU multiplies it natively; elsewhere oneDNN would emulate it, slower
    assert packable(torch.device("cpu"), torch.bfloat16) == native_bf16()


def test_a_packed_batchs_chains_gather_their_keys_once_and_attend_as_alone(monkeypatch) -> None:
    from structspec.models import invariance
    from structspec.models.packed_slots import PackedSlots

    generator = torch.Generator().manual_seed(1)
    # two rows packed in one sequence: row 0 kept slots 0-29, row 1 slots 30-59; each feeds a chain of 3 (60-65)
    query, key, value = (torch.randn(1, h, n, 16, generator=generator).to(torch.bfloat16)
                         for h, n in ((4, 6), (2, 66), (2, 66)))
    slots = PackedSlots(None, 2)
    slots.place(0, 30)
    slots.place(1, 30)
    mask = slots.window_mask([3, 3], [[-1, 0, 1], [-1, 0, 1]])[:, None]
    seen = invariance._seen(mask, 1, 6, 66)[0]
    groups = {id(k[0]) for k in seen}
    assert len(groups) == 2 and [k[1] for k in seen] == [31, 32, 33, 31, 32, 33]  # one gather per row's chain
    both = attention_by_row(query, key, value, mask, None)
    for row, own in ((0, torch.arange(30)), (1, torch.arange(30, 60))):
        window = torch.arange(60 + 3 * row, 63 + 3 * row)
        keys = torch.cat([own, window])
        alone = torch.cat([attention_by_row(query[:, :, 3 * row + i:3 * row + i + 1], key[:, :, keys[:31 + i]],
                                            value[:, :, keys[:31 + i]], None, None) for i in range(3)], dim=2)
        assert torch.equal(both[:, :, 3 * row:3 * row + 3], alone)
