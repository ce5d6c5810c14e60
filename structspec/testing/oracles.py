"""Oracles for tests: the exact output distribution of plain masked sampling, seeded sample counts, Pearson's
chi-square p-value, and the logit margin where two greedy outputs part."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch


def exact_output_distribution(
    lm: Any, fsm: Any, prompt_ids: list[int], sampling: Any, min_prob: float = 1e-9
) -> dict[tuple[int, ...], float]:
    """The exact distribution of complete outputs of plain masked sampling, by enumerating the token tree.

    Mirrors the decode loop: a state that allows only EOS ends the output
    without a draw; elsewhere the next token (EOS included where the state is
    final) is drawn from the masked, warped logits. Branches below
    ``min_prob`` are dropped, so keep the language small.
    """
    from structspec.decoding.sampling import probabilities

    out: dict[tuple[int, ...], float] = {}
    stack: list[tuple[tuple[int, ...], int, float]] = [((), fsm.initial_state, 1.0)]
    while stack:
        prefix, state, prob = stack.pop()
        if fsm.is_complete(state):
            out[prefix] = out.get(prefix, 0.0) + prob
            continue
        logits = lm.forward(list(prompt_ids) + list(prefix), lm.new_cache())[-1:]
        fsm.mask_logits_inplace(logits, [state])
        p = probabilities(logits[0], sampling).double()
        for token in torch.nonzero(p * prob > min_prob).flatten().tolist():
            if token in fsm.eos_token_ids:
                out[prefix] = out.get(prefix, 0.0) + prob * float(p[token])
            else:
                stack.append((prefix + (token,), fsm.next_state(state, token), prob * float(p[token])))
    return out


def sample_outputs(
    lm: Any, spec: Any, prompt: str, drafter: Any, samples: int, temperature: float
) -> tuple[Counter[tuple[int, ...]], int, int]:
    """Complete outputs of ``samples`` seeded runs (seeds 0..samples-1, plain masked decoding plus ``drafter``),
    counted by token ids, with the draft tokens proposed and accepted over all runs."""
    from structspec.api import generate_result

    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for seed in range(samples):
        r = generate_result(lm, spec, prompt, temperature=temperature, seed=seed, draft=drafter,
                            fast_forward="off", max_new_tokens=10)
        counts[tuple(r.token_ids)] += 1
        drafted += sum(d.drafted for d in r.stats.drafts.values())
        accepted += sum(d.accepted for d in r.stats.drafts.values())
    return counts, drafted, accepted


def chi_square_pvalue(counts: dict[Any, int], probs: dict[Any, float]) -> float:
    """Pearson's goodness-of-fit p-value of ``counts`` against ``probs``.

    Outcomes with an expected count under 5 are pooled into one bin, as the
    test requires; an observed outcome with probability 0 gives p = 0.
    """
    n = sum(counts.values())
    if any(k not in probs for k in counts):
        return 0.0
    bins: list[tuple[float, int]] = []
    pooled_e, pooled_o = 0.0, 0
    for k, p in probs.items():
        if n * p >= 5:
            bins.append((n * p, counts.get(k, 0)))
        else:
            pooled_e += n * p
            pooled_o += counts.get(k, 0)
    if pooled_e > 0:
        bins.append((pooled_e, pooled_o))
    stat = sum((o - e) ** 2 / e for e, o in bins)
    dof = len(bins) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def divergence_margin(lm: Any, fsm: Any, prompt_ids: list[int], ours: list[int], theirs: list[int]) -> float | None:
    """At the first position where two outputs of ``fsm``'s language differ, the gap between the two best
    allowed logits of ``lm`` (plain decoding, one pass over the common prefix); None if neither differs.

    A small gap is a near-tie that float rounding (another batch shape or
    dtype) may flip; a large one is a real difference.
    """
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if ours == theirs:
        return None
    prefix = ours[:i]
    logits = lm.forward(list(prompt_ids) + prefix, lm.new_cache())[-1:].float()
    state = fsm.walk(fsm.initial_state, prefix)[-1] if prefix else fsm.initial_state
    fsm.mask_logits_inplace(logits, [state])
    top = logits[0].topk(2).values
    return float(top[0] - top[1])
