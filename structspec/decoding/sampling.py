"""Choosing a token from masked logits: pure functions on tensors, no model in sight."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from structspec.errors import OptionError


@dataclass(frozen=True)
class SamplingConfig:
    """transformers' ``GenerationConfig`` names; ``do_sample=False`` is greedy."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise OptionError(f"temperature must be > 0, got {self.temperature} (use do_sample=False for greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise OptionError(f"top_k must be ≥ 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise OptionError(f"top_p must be in (0, 1], got {self.top_p}")


def warp_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p over the last dim (masked -inf entries stay -inf)."""
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= config.top_p  # keep the token that crosses top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The distribution a sampler draws from: softmax of the warped logits."""
    return warp_logits(logits.float(), config).softmax(-1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from the distribution ``p`` [vocab]; a point mass is returned without touching the RNG.

    Skipping the draw for a point mass keeps the RNG stream independent of how
    many single-choice steps a decode mode skips or verifies.
    """
    top = int(torch.argmax(p))
    if p[top] >= 1.0:
        return top
    return int(torch.multinomial(p, 1, generator=generator))


def choose_token(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> int:
    """Argmax for greedy; a `sample` from `probabilities` when sampling. ``logits`` is [vocab]."""
    if not config.do_sample:
        return int(torch.argmax(logits))
    return sample(probabilities(logits, config), generator)


def token_logprobs(logits: torch.Tensor, tokens: list[int], sampling: SamplingConfig) -> list[float]:
    """Log-probability of ``tokens[i]`` under row ``i`` of the masked ``logits`` [≥ len(tokens), vocab]: the
    warped distribution a sampler draws from, or the masked softmax when greedy (a single allowed token
    scores 0.0). Changes nothing."""
    rows = logits[: len(tokens)].float()
    if sampling.do_sample:
        rows = warp_logits(rows, sampling)
    at = torch.arange(len(tokens), device=rows.device)
    picked = rows.log_softmax(-1)[at, torch.tensor(tokens, device=rows.device)]
    return picked.tolist()
