"""Repetition controls on a verified position's masked logits: pure functions of (logits, prefix ids).

transformers' two repetition processors, with its semantics (``RepetitionPenaltyLogitsProcessor``,
``NoRepeatNGramLogitsProcessor``): the prefix of a position is every token before it, **the prompt included**
(transformers penalizes every id in ``input_ids``), then the output so far, then the candidate's tokens on the path
to that position. Tokens the FSM forced are never penalized (they were not chosen), but they are part of the
prefixes of the positions after them, as in transformers' ``input_ids``.

A decode applies them to every logits row it verifies, each from that row's own prefix, before greedy's argmax
or sampling's temperature, top-k and top-p (transformers' order), so greedy output is the same whatever the
mode, the drafts or the batch. One departure, for constrained decoding: where the n-gram ban would leave no
token the FSM allows, the row is left unbanned (transformers would pick among -inf logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Repetition:
    """transformers' ``GenerationConfig`` names: ``repetition_penalty`` (1.0: none; above 1 discourages any token
    seen before, Keskar et al. 2019, "CTRL") and ``no_repeat_ngram_size`` (0: none; n bans every token that would
    repeat an n-gram of the prefix)."""

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @property
    def active(self) -> bool:
        """Whether either control changes any logits."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty, as transformers applies it: each logit of a ``seen`` token divided by
    ``penalty`` where positive, multiplied by it where negative (masked -inf logits stay -inf). ``logits`` and the
    boolean ``seen`` are [rows, width]. A new tensor; changes nothing."""
    scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, scaled, logits)


def ngram_bans(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """The tokens that would repeat an ``n``-gram of ``prefix`` [length] (int64): those that followed its last
    ``n − 1`` tokens earlier in it (transformers' ``_get_ngrams`` / ``_get_generated_ngrams``). Empty while the
    prefix holds no n-gram yet. Changes nothing."""
    if n < 1 or len(prefix) < n:
        return prefix[:0]
    if n == 1:
        return prefix
    suffix = prefix[len(prefix) - (n - 1) :]
    starts = prefix[:-1].unfold(0, n - 1, 1)  # every (n−1)-gram that has a token after it
    return prefix[n - 1 :][(starts == suffix).all(-1)]


def repetition_logits(logits: torch.Tensor, context: list[int], tails: list[list[int]],
                      repetition: Repetition) -> torch.Tensor:
    """``logits`` [rows, width] (masked) with ``repetition``'s controls applied, row ``r`` from its prefix: the ids
    ``context`` (the prompt included) then ``tails[r]``. Where the n-gram ban would leave a row no finite logit,
    that row is not banned. A new tensor on ``logits``' device; changes nothing."""
    if not repetition.active:
        return logits
    rows = len(tails)
    if repetition.repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape, dtype=torch.bool)
        seen[:, context] = True
        seen[torch.arange(rows).repeat_interleave(torch.tensor([len(t) for t in tails], dtype=torch.long)),
             torch.tensor([t for tail in tails for t in tail], dtype=torch.long)] = True
        logits = penalize(logits, seen.to(logits.device), repetition.repetition_penalty)
    if n := repetition.no_repeat_ngram_size:
        head = torch.tensor(context, dtype=torch.long)
        banned = [ngram_bans(torch.cat([head, torch.tensor(tail, dtype=torch.long)]), n) for tail in tails]
        ban = torch.zeros(logits.shape, dtype=torch.bool)
        ban[torch.arange(rows).repeat_interleave(torch.tensor([len(b) for b in banned])), torch.cat(banned)] = True
        banned_logits = logits.masked_fill(ban.to(logits.device), float("-inf"))
        logits = torch.where(banned_logits.isfinite().any(-1, keepdim=True), banned_logits, logits)
    return logits


def path_tails(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """What each logits row of a candidate (``tokens``, each after node ``parents[i]``, −1: the root) adds to the
    prefix before the root: nothing for the root's row, the tokens from the root to ``i`` for node ``i``'s row
    (one after it). Changes nothing."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents):
        paths.append(paths[parent + 1] + [token])
    return paths
