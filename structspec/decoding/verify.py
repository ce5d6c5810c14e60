"""Verdicts on a drafted candidate: pure functions on the target's masked logits.

Names follow the speculative-sampling papers: ``p`` is the target's
distribution, ``q`` the draft's. Row ``i`` of the target's logits is the
distribution of the token at candidate position ``i``; the last row (one past
the candidate) is the "bonus" position. Every row, the bonus row included,
must already be masked by the FSM state reached at that position.

Two acceptance rules, both leaving the target's (masked, warped) distribution
unchanged:

* **Point mass** (``q`` is None at a position: prompt lookup, forced text, a
  greedy draft): draw ``y ~ p`` with the same sampler plain decoding uses and
  accept iff ``y`` equals the draft. This accepts with probability ``p(x)``
  and, on rejection, ``y`` is distributed as ``p`` without ``x`` — the
  residual of a point mass. The RNG is consumed exactly as plain decoding
  consumes it, so with a fixed seed the output is the same sample.
* **Rejection sampling** (Leviathan et al. 2023, "Fast Inference from
  Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating LLM
  Decoding with Speculative Sampling"): accept ``x ~ q`` with probability
  ``min(1, p(x)/q(x))``; on rejection draw from ``max(0, p − q)``
  renormalized.
"""

from __future__ import annotations

import torch

from structspec.decoding.sampling import SamplingConfig, probabilities, sample


def accept_tree(choices: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """Greedy verification of a token tree (SpecInfer: Miao et al. 2024, "SpecInfer: Accelerating Large
    Language Model Serving with Tree-based Speculative Inference and Verification").

    Node ``i`` holds ``tokens[i]`` after node ``parents[i]`` (−1: the root, the
    pending tokens; parents come first). ``choices`` are the target's masked
    argmax at the root (``choices[0]``) and after each node (``choices[1 + i]``).
    From the root, follow the child whose token is the target's choice while one
    exists. Returns (the verified path as node indices, next token: the choice
    after the path's last node). A chain is the tree with ``parents[i] = i − 1``.
    """
    children: dict[tuple[int, int], int] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        children.setdefault((parent, token), i)
    path, node = [], -1
    while (child := children.get((node, choices[node + 1]))) is not None:
        path.append(child)
        node = child
    return path, choices[node + 1]


def verify_sampled(
    logits: torch.Tensor,
    candidate: list[int],
    q: list[torch.Tensor | None],
    config: SamplingConfig,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling over ``candidate``; ``q[i]`` is the draft's distribution at position i or None.

    ``logits`` is [len(candidate) + 1, vocab], masked; ``config`` warps them into
    ``p`` as plain sampling does. Returns (accepted count, next token).
    """
    p = probabilities(logits, config)  # [n + 1, vocab]
    for i, x in enumerate(candidate):
        if q[i] is None:
            y = sample(p[i], generator)
            if y != x:
                return i, y
        elif not accept_draw(p[i], q[i], x, generator):
            return i, sample(residual(p[i], q[i]), generator)
    return len(candidate), sample(p[len(candidate)], generator)


def accept_draw(p: torch.Tensor, q: torch.Tensor, x: int, generator: torch.Generator | None) -> bool:
    """Accept a draft ``x ~ q`` with probability ``min(1, p(x) / q(x))`` (no RNG draw when it is 1)."""
    px, qx = float(p[x]), float(q[x])
    if px >= qx:
        return True
    return float(torch.rand((), generator=generator)) * qx < px


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``max(0, p − q)`` renormalized: what to sample from after a rejection."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q up to rounding: a rejection could not have happened
