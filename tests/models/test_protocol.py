"""The `LanguageModel` protocol: the transformers `LM` and the pass-counting wrapper each have every member it
declares as their own (no ``__getattr__`` forwarding), and the wrapper reports what the model it wraps says."""

from __future__ import annotations

import inspect

import torch

import structspec
from structspec.models.protocol import LanguageModel
from structspec.testing import CountingLM, FakeLM

MEMBERS = sorted(
    {*LanguageModel.__annotations__}
    | {name for name, value in vars(LanguageModel).items()
       if not name.startswith("_") and (callable(value) or isinstance(value, property))}
)
DESCRIPTION = ["name", "tokenizer", "vocab", "logits_width", "max_context", "device", "dtype", "kernels", "batchable",
               "batch_invariant", "prefills_apart", "max_pass_tokens"]


def test_the_protocol_declares_what_the_loop_reads() -> None:
    assert set(DESCRIPTION) < set(MEMBERS)
    assert {"forward", "forward_slots", "crop", "new_cache", "encode_prompt", "early_exit"} < set(MEMBERS)


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
