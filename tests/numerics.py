"""How far apart two forward passes of one model may be when they compute the same logits in different shapes.

A whole prompt against the same prompt fed in two passes, one row against three, a cache copied against one
recomputed, oneDNN's packed layers against torch's: each runs its matmuls with another blocking (the BLAS picks
it by shape, thread count and the CPU's vector units: AVX2, AVX-512, AMX), so the same sums are added in another
order and round differently. Nothing makes such passes equal; only a bound on their distance is sound.

The bound scales with the largest logit (rounding is relative) and has two parts. A pass rounds each layer's
output to its dtype, which bfloat16 (8 bits of mantissa) feels most: measured on `tiny_llama` against a float64
pass, a bfloat16 pass is within 3 of bfloat16's eps of the largest logit, so two are within 6: we allow 8. And
a pass accumulates in float32 whatever its dtype, over many sums that its random, std-1 weights amplify: a
float32 pass is within 13 float32 eps of the float64 one, two within 26: we allow 256, ten times that, for
kernels we have not measured. (float32 at 256: 3e-4 on logits up to 10; a rejected token left in a cache moves
them by whole units. bfloat16 at 8: 0.06 of the range, the "few percent" bfloat16 kernels agree to.)
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

OUTPUT_EPS = 8
"""Allowed difference, in eps of the pass's dtype times the largest logit, from rounding each layer's output."""
ACCUMULATION_EPS = 256
"""Allowed difference, in float32 eps times the largest logit, from float32 sums added in another order."""
TINY_LOGIT_SCALE = 16.0
"""A bound on `tiny_llama`'s logits (std 3 by construction): the scale of its logprobs' tolerance."""


def relative_tolerance(dtype: torch.dtype) -> float:
    """The difference two passes in ``dtype`` of different shapes may show, relative to their largest logit."""
    return OUTPUT_EPS * torch.finfo(dtype).eps + ACCUMULATION_EPS * torch.finfo(torch.float32).eps


def logits_tolerance(expected: torch.Tensor) -> float:
    """The absolute difference allowed from ``expected``'s logits (its dtype and largest finite magnitude)."""
    finite = expected[torch.isfinite(expected)].float()
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return relative_tolerance(expected.dtype) * max(scale, 1.0)


def logits_close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``actual`` is ``expected`` up to the rounding of another pass shape (masked ``-inf`` equal)."""
    try:
        assert_logits_close(actual, expected)
    except AssertionError:
        return False
    return True


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Assert ``actual`` is ``expected`` up to the rounding of another pass shape (`logits_tolerance`)."""
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=logits_tolerance(expected))


def logprobs_approx(expected: Sequence[float], dtype: torch.dtype, scale: float = TINY_LOGIT_SCALE) -> object:
    """``expected`` logprobs as `pytest.approx` up to another pass shape's rounding: a logprob is a logit minus
    the log-sum-exp of all, so it moves by at most twice the logits' difference (logits up to ``scale``)."""
    return pytest.approx(expected, abs=2 * relative_tolerance(dtype) * scale)
