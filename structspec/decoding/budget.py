"""How many tokens a draft should have: the tokens a verify pass is expected to keep against what it costs.

A target pass costs a fixed part (reading the weights, launching kernels) plus
a part per fed token (the matrix products). On a GPU the per-token part is
close to nothing up to hundreds of tokens, so long drafts are free; on a CPU a
fed token costs a sizeable share of a pass (``TOKEN_COST``, measured with
``structspec pass-cost``), and a 10-token draft of which two are kept makes a
pass slower than it saves. `DraftLength` learns, per row, how often the i-th
drafted token is accepted once the ones before it were, and drafts the length
with the most expected output tokens per unit of pass cost.

The choice depends only on the row's own history and the device, never on the
batch: a row decodes alike, in tokens, passes and samples, alone or in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Cost of one more fed token, in units of a one-token pass. CPU: Qwen2.5-Coder-0.5B, float32, 2 threads
# (a 4-token window costs about 1.45 one-token passes); CUDA: the H100 pass-cost curve in README (64 rows of
# 16 tokens cost under 2 one-token steps).
TOKEN_COST = {"cpu": 0.15, "cuda": 0.001}
PRIOR = (2.0, 1.0)  # pseudo-counts (accepted, rejected) of every position: an untried length looks decent


def token_cost(lm: object) -> float:
    """`TOKEN_COST` for where ``lm`` runs (its ``device``; a model without one counts as on the CPU, other
    accelerators as CUDA). Changes nothing."""
    device = getattr(lm, "device", None)
    return TOKEN_COST["cpu"] if device is None or device.type == "cpu" else TOKEN_COST["cuda"]


@dataclass
class DraftLength:
    """Per-row acceptance of drafted tokens by position, and the draft length it pays to ask for.

    ``tried[i]``: candidates whose drafted token ``i`` (0-based, drafter tokens
    only: spliced forced text is nearly always accepted and not counted) was
    verified with every drafted token before it accepted; ``kept[i]``: of those,
    how many kept it.
    """

    token_cost: float
    tried: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def choose(self, fed: int, cap: int) -> int:
        """The draft length in ``[0, cap]`` maximizing (1 + expected accepted) / (1 + token_cost × (fed +
        length)), where ``fed`` tokens go into the pass besides the draft. Changes nothing."""
        best, best_value = 0, 1.0 / (1.0 + self.token_cost * fed)
        expected, survive = 0.0, 1.0
        for k in range(1, cap + 1):
            survive *= self.hazard(k - 1)
            expected += survive
            value = (1.0 + expected) / (1.0 + self.token_cost * (fed + k))
            if value > best_value:
                best, best_value = k, value
        return best

    def hazard(self, i: int) -> float:
        """Estimated chance that drafted token ``i`` is accepted given the ones before it were."""
        tried, kept = (self.tried[i], self.kept[i]) if i < len(self.tried) else (0, 0)
        return (kept + PRIOR[0]) / (tried + PRIOR[0] + PRIOR[1])

    def record(self, drafted: int, accepted: int) -> None:
        """One verified candidate had ``drafted`` drafter tokens, of which the first ``accepted`` were kept
        (changes the counts)."""
        reached = min(accepted + 1, drafted)  # positions verified with all drafted tokens before them kept
        if len(self.tried) < reached:
            self.tried += [0] * (reached - len(self.tried))
            self.kept += [0] * (reached - len(self.kept))
        for i in range(reached):
            self.tried[i] += 1
            self.kept[i] += i < accepted
