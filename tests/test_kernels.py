"""oneDNN-packed linear layers (`structspec.kernels`): the same logits as torch's kernels, decoding that is
identical across every mode on a packed model, transformers' generate on it, and `load`'s option."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from typing import Literal

import structspec
from structspec.decoding.budget import curve_path
from structspec.errors import OptionError
from structspec.kernels import PackedLinear, native_bf16, pack_linears, packable
from structspec.testing import byte_level_tokenizer, divergence_margin, sentencepiece_tokenizer, tiny_llama

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
        torch.testing.assert_close(full[1], full[0], rtol=1e-4, atol=1e-4)
    hidden = torch.randn(2, plain.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    few = torch.tensor([3, 70, 200])
    rows = [lm.head(hidden, [None, few]) for lm in pair]
    torch.testing.assert_close(rows[1], rows[0], rtol=1e-4, atol=1e-4)
    assert rows[1][1].isfinite().sum() == 3


def test_a_packed_layer_runs_under_autograd_without_recording_a_graph(pair) -> None:
    _, packed = pair
    ids = torch.tensor([packed.encode_prompt(PROMPT)[:1]])
    with torch.enable_grad():
        logits = packed.model(input_ids=ids).logits
    assert not logits.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(packed.model(input_ids=ids).logits, logits)


@pytest.mark.parametrize("draft", ["prompt_lookup", "tree", "self", "threshold"])
def test_every_mode_on_a_packed_model_decodes_as_plain_masked(pair, draft: str) -> None:
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
    """The same random model in bfloat16 twice, for each tokenizer family: torch's kernels, and packed."""
    if not native_bf16():
        pytest.skip("this CPU has no native bfloat16 path (AVX-512 BF16 or AMX): bfloat16 is not packed")
    tokenizer = {"byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer}[request.param]()
    plain = structspec.from_transformers(tiny_llama(tokenizer, seed=3).to(torch.bfloat16), tokenizer)
    packed_model = tiny_llama(tokenizer, seed=3).to(torch.bfloat16)
    assert packable(packed_model.device, packed_model.dtype)
    assert pack_linears(packed_model) > 0
    return plain, structspec.from_transformers(packed_model, tokenizer)


def test_packed_bfloat16_logits_are_torchs_within_bfloat16_rounding(bf16_pair) -> None:
    plain, packed = bf16_pair
    ids = plain.encode_prompt(PROMPT)
    for window in (1, 5, 16):
        caches = [lm.new_cache() for lm in bf16_pair]
        for lm, cache in zip(bf16_pair, caches):
            lm.forward(ids[:-window], cache)
        full = [lm.forward(ids[-window:], cache, logits_to_keep=window) for lm, cache in zip(bf16_pair, caches)]
        # bfloat16 keeps 8 bits of mantissa: the two kernels sum in other orders, so logits agree to ~1%
        torch.testing.assert_close(full[1], full[0], rtol=0.02, atol=0.02 * float(full[0].abs().max()))


@pytest.mark.parametrize("draft", ["prompt_lookup", "tree", "lookahead"])
def test_on_a_packed_bfloat16_model_every_mode_leaves_plain_masked_only_at_a_near_tie(bf16_pair, draft: str) -> None:
    # In bfloat16 a multi-token verify pass is not bitwise a run of one-token steps (attention sums in another
    # order, README "float32 or bfloat16"), so greedy identity holds up to near-ties, and nowhere else.
    _, packed = bf16_pair
    assert packed.kernels == "onednn" and packed.model.dtype == torch.bfloat16
    fsm = structspec.compile(Order, packed).fsm
    plain = structspec.generate_result(packed, Order, PROMPT, draft=None, fast_forward="off", max_new_tokens=60)
    fast = structspec.generate_result(packed, Order, PROMPT, draft=draft, max_new_tokens=60)
    batched = structspec.generate_batch(packed, Order, [PROMPT, PROMPT + " "], batch_size=2, draft=draft,
                                        max_new_tokens=60)
    assert fast.stats.target_forward_passes < plain.stats.target_forward_passes
    for other in (fast, batched[0]):
        assert other.value is not None
        margin = divergence_margin(packed, fsm, packed.encode_prompt(PROMPT), plain.token_ids, other.token_ids)
        assert margin is None or margin < 0.1


@pytest.mark.real_model
def test_load_packs_float32_cpu_models_and_names_the_curve(smollm2: structspec.LM) -> None:
    assert smollm2.kernels == "onednn"
    path = curve_path(smollm2)
    assert path is not None and path.name.endswith("-onednn.json")  # torch's kernels have another curve
    with pytest.raises(OptionError, match="kernels='fast' is not one of"):
        structspec.load("smollm2-135m", kernels="fast")
    with pytest.raises(OptionError, match="float32 model on the CPU"):
        structspec.load("smollm2-135m", dtype="float16", kernels="onednn")
    assert not packable(torch.device("cpu"), torch.float16)  # auto leaves a float16 model to torch
    # bfloat16 is packed where the CPU multiplies it natively; elsewhere oneDNN would emulate it, slower
    assert packable(torch.device("cpu"), torch.bfloat16) == native_bf16()
