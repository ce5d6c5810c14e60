"""The `LanguageModel` protocol: the transformers `LM` and the pass-counting wrapper each have every member it
declares as their own (no ``__getattr__`` forwarding), and the wrapper reports what the model it wraps says."""

from __future__ import annotations

import inspect

import pytest
import torch

import structspec
from structspec.models.protocol import KVCache, LanguageModel
from structspec.testing import CountingLM, FakeLM, tiny_lm
from tests.conftest import DEVICE
from tests.numerics import assert_logits_close, logits_close

MEMBERS = sorted(
    {*LanguageModel.__annotations__}
    | {name for name, value in vars(LanguageModel).items()
       if not name.startswith("_") and (callable(value) or isinstance(value, property))}
)
DESCRIPTION = ["name", "tokenizer", "vocab", "logits_width", "max_context", "device", "dtype", "kernels", "batchable",
               "batch_invariant", "prefills_apart", "max_pass_tokens"]


def test_the_protocol_declares_what_the_loop_reads() -> None:
    assert set(DESCRIPTION) < set(MEMBERS)
    assert {"forward", "forward_slots", "new_cache", "encode_prompt", "early_exit"} < set(MEMBERS)


def test_lm_counting_lm_and_fake_lm_have_every_member_of_their_own(byte_lm: structspec.LM) -> None:
    counting = CountingLM(byte_lm)
    for lm in (byte_lm, counting, FakeLM()):
        assert isinstance(lm, LanguageModel)
        for name in MEMBERS:
            inspect.getattr_static(lm, name)  # raises AttributeError where only __getattr__ would answer
    assert not hasattr(CountingLM, "__getattr__")


def test_counting_lm_reports_the_wrapped_model_and_counts_its_passes(byte_lm: structspec.LM) -> None:
    counting = CountingLM(byte_lm)
    assert {name: getattr(counting, name) for name in DESCRIPTION} == {name: getattr(byte_lm, name)
                                                                      for name in DESCRIPTION}
    assert counting.dtype == torch.float32 and counting.device == byte_lm.model.device
    ids = byte_lm.encode_prompt("Alice is 31")
    logits = counting.forward(ids, counting.new_cache(), logits_to_keep=2)
    assert torch.equal(logits, byte_lm.forward(ids, byte_lm.new_cache(), logits_to_keep=2))
    assert (counting.passes, counting.fed) == (1, [len(ids)])


@pytest.fixture(scope="module")
def bf16_lm() -> structspec.LM:
    """`byte_lm` in bfloat16: its caches round every layer's output to 8 bits of mantissa."""
    return tiny_lm("byte_level", device=DEVICE, dtype=torch.bfloat16)


def test_each_models_cache_moves_its_slots_as_the_cache_protocol_says(byte_lm: structspec.LM,
                                                                      bf16_lm: structspec.LM) -> None:
    # What a batch's slot table and the prefix cache do to a cache, on both models' own caches: a copy of some
    # slots appended after others gives the logits the same tokens fed in that order give.
    ids = byte_lm.encode_prompt("Alice is 31 and lives in Paris")
    for lm in (byte_lm, bf16_lm, FakeLM()):
        members = {name for name, value in vars(KVCache).items() if not name.startswith("_")}
        assert isinstance(lm.new_cache(), KVCache) and members == {"nbytes", "append_slots", "gather_slots",
                                                                   "copy_slots", "crop_slots"}
        whole = lm.new_cache()
        expected = lm.forward(ids, whole, logits_to_keep=1)
        cache = lm.new_cache()
        cache.append_slots([whole.copy_slots(0, 4), whole.copy_slots(4, len(ids) - 1)])
        assert cache.nbytes == whole.nbytes * (len(ids) - 1) // len(ids)
        assert_logits_close(lm.forward(ids[-1:], cache), expected)
        gathered = lm.new_cache()
        lm.forward(ids[:3] + [7], gathered)  # a rejected draft after three kept tokens, gathered away
        gathered.gather_slots(torch.tensor([0, 1, 2]))
        assert_logits_close(lm.forward(ids[3:], gathered), expected)
        lost = lm.new_cache()
        lm.forward(ids[:3], lost)
        lost.gather_slots(torch.tensor([0, 2]))  # a kept token lost: another prefix
        assert not logits_close(lm.forward(ids[3:], lost), expected)


def test_a_cropped_cache_gives_the_logits_of_a_cache_rebuilt_over_the_kept_tokens(byte_lm: structspec.LM,
                                                                                   bf16_lm: structspec.LM) -> None:
    # A row decoded alone crops a rejected chain's tail off its cache: the next pass must then see exactly the
    # kept tokens, on both models' own caches.
    ids = byte_lm.encode_prompt("Alice is 31 and lives in Paris")
    kept, rejected = 6, [7, 8, 9]
    for lm in (byte_lm, bf16_lm, FakeLM()):
        rebuilt = lm.new_cache()
        expected = lm.forward(ids, rebuilt, logits_to_keep=len(ids) - kept)
        cache = lm.new_cache()
        lm.forward(ids[:kept] + rejected, cache)
        cache.crop_slots(kept)
        cache.crop_slots(kept + 5)  # a longer length keeps every slot
        assert cache.nbytes == rebuilt.nbytes * kept // len(ids)
        # (passes of other shapes than the whole one's: equal up to rounding, tests/numerics.py)
        assert_logits_close(lm.forward(ids[kept:], cache, logits_to_keep=len(ids) - kept), expected)
        stale = lm.new_cache()  # the same passes without the crop: every later position sees the rejected tail
        lm.forward(ids[:kept] + rejected, stale)
        later = lm.forward(ids[kept:], stale, logits_to_keep=len(ids) - kept)
        assert not logits_close(later, expected)
