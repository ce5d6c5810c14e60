"""structspec constraints inside transformers' own ``model.generate``: a logits processor and a stopping criterion.

Typical use::

    from structspec.integrations.transformers import LogitsProcessor, StopWhenComplete

    lm = structspec.load("smollm2-135m")
    processor = LogitsProcessor(Person, lm)          # or LogitsProcessor(Person, tokenizer)
    out = lm.model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=200, do_sample=False,
        logits_processor=[processor], stopping_criteria=[StopWhenComplete(processor)],
    )

The processor keeps no per-row cursor that transformers could desynchronise: a
row's FSM state is a function of its generated tokens, recomputed from the
longest prefix a row of the previous call had walked (that row's
`structspec.decoding.Cursor`, copied and rolled back to the shared prefix). So
repeated calls on one prefix, a prefix that shrinks (assisted generation and
prompt lookup call it once per candidate position, then drop rejected ones),
beam search reordering rows, and left-padded batches all see the right state.
Greedy ``generate`` with it produces structspec's plain masked greedy output
(``generate_result(..., fast_forward="off")``) in float32, the dtype `load`
gives on a CPU without native bfloat16. In bfloat16 (the default on CUDA and
on AVX-512 BF16 CPUs) it is not guaranteed: ``generate`` feeds the whole prompt
in one pass, where structspec's batch-invariant decoding (`LM.batch_invariant`)
feeds it but its last token, then that token in a pass of its own, and
bfloat16 rounds the two differently, so the outputs may part where two
allowed tokens are nearly tied. Where identity matters in bfloat16, decode
with structspec itself: its batched and accelerated modes are identical to
its plain masked decoding there.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from structspec.automaton import apply_token_bitmask_inplace
from structspec.decoding import Cursor, eos_only_row
from structspec.errors import OptionError
from structspec.integrations.matcher import token_fsm
from structspec.schema import COMPACT


class LogitsProcessor(transformers.LogitsProcessor):
    """Masks each row's scores to the tokens its FSM allows next, for ``generate(logits_processor=[...])``.

    ``spec`` is anything `structspec.compile` takes (or a `structspec.Compiled`);
    ``model_or_tokenizer`` is a structspec `LM`, a shipped model's name, or a
    Hugging Face tokenizer. Spec errors are raised here, before generation.

    The prompt is what the first call sees (``input_ids.shape[1]``, padding
    included); every later token is generated. Within one generation each call
    adds at most one token to a row of the last call; a call that does not (a
    row that does not start with the prompt, or adds more) starts a new
    generation, so one processor serves several ``generate`` calls. Call
    `reset` before a prompt that is the last prompt, its output and one token.

    EOS is allowed where the output may end and is the only token allowed
    once it is complete; a row that has ended (or holds a token the FSM
    rejects, such as an unverified draft) allows EOS alone. Masks cover the
    scores' own width (ids past the tokenizer's are disallowed).
    """

    def __init__(
        self, spec: Any, model_or_tokenizer: Any, whitespace_pattern: str = COMPACT, strict: bool = True
    ) -> None:
        self.fsm = token_fsm(spec, model_or_tokenizer, whitespace_pattern, strict)
        self._eos_row = eos_only_row(self.fsm)
        self.reset()

    def reset(self) -> None:
        """Forget the prompt and every walked prefix: the next call starts a new generation. Changes the processor."""
        self._prompt: torch.Tensor | None = None  # [rows, prompt] on the CPU
        self._generated = torch.empty(0, 0, dtype=torch.long)  # the last call's rows after the prompt
        self._cursors: list[Cursor] = []  # per last-call row: over its longest prefix the FSM accepts (EOS included)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """The scores [rows, width] with disallowed tokens at -inf (a new tensor; ``scores`` is unchanged).

        Changes the processor's cache of walked prefixes only. `OptionError`, before any change, unless
        ``input_ids`` is [rows, tokens] and ``scores`` [rows, width] with a width of at least the FSM's.
        """
        check_scores(input_ids, scores, self.fsm.logits_width)
        cursors = self.cursors(input_ids)
        bitmask = self.fsm.allocate_token_bitmask(len(cursors))
        for row, cursor in enumerate(cursors):
            if cursor.accepted == self._generated.shape[1]:
                cursor.fill_bitmask(bitmask, row)
            else:  # a row holding a token the FSM rejects allows EOS alone, as one that ended
                bitmask[row].copy_(self._eos_row)
        scores = scores.clone()
        apply_token_bitmask_inplace(scores, bitmask)
        return scores

    def states(self, input_ids: torch.Tensor) -> list[int | None]:
        """Each row's FSM state after its generated tokens; None where the row ended with EOS or holds a
        token the FSM rejects. Changes the processor's cache of walked prefixes only; `OptionError` (changing
        nothing) unless ``input_ids`` is a [rows, tokens] integer tensor."""
        cursors, width = self.cursors(input_ids), self._generated.shape[1]
        return [c.state if c.accepted == width and not c.is_terminated() else None for c in cursors]

    def cursors(self, input_ids: torch.Tensor) -> list[Cursor]:
        """Each row's `Cursor` over the longest prefix of its generated tokens the FSM accepts (EOS in a final
        state included): the whole row unless it holds a token the FSM rejects. Changes the processor's cache of
        walked prefixes only; `OptionError` (changing nothing) unless ``input_ids`` is a [rows, tokens] integer
        tensor."""
        check_input_ids(input_ids)
        ids = input_ids.detach().cpu()
        common = self._common_prefixes(ids)
        if common is None:
            self.reset()
            self._prompt = ids
        generated = ids[:, self._prompt.shape[1] :]
        known = self._known_prefixes(common) if common is not None else [Cursor(self.fsm) for _ in ids]
        for row, cursor in zip(generated.tolist(), known):
            rest = row[cursor.accepted :]
            cursor.accept(rest[: cursor.validate(rest)])
        self._generated, self._cursors = generated, known
        return known

    def _common_prefixes(self, ids: torch.Tensor) -> torch.Tensor | None:
        """How many generated tokens each row shares with each row of the last call [rows, last rows], or
        None if ``ids`` start a new generation.

        Within one generation every row starts with a prompt row and adds at most one token to some row of
        the last call (rows may be reordered, repeated, fewer or more: beam search hands its stopping
        criteria twice the beams). Anything else is a new prompt.
        """
        prompt = self._prompt
        if prompt is None or ids.shape[1] < prompt.shape[1]:
            return None
        if not (ids[:, None, : prompt.shape[1]] == prompt[None]).all(-1).any(-1).all():
            return None
        generated = ids[:, prompt.shape[1] :]
        width = min(generated.shape[1], self._generated.shape[1])
        same = generated[:, None, :width] == self._generated[None, :, :width]  # [rows, last rows, width]
        common = same.int().cumprod(-1).sum(-1)
        return common if bool((common.max(-1).values >= generated.shape[1] - 1).all()) else None

    def _known_prefixes(self, common: torch.Tensor) -> list[Cursor]:
        """For each row, a new cursor over its longest prefix that a row of the last call had walked (that row's,
        copied and rolled back). Changes nothing."""
        walked = torch.tensor([c.accepted for c in self._cursors])
        usable = torch.minimum(common, walked[None, :])  # states exist only for a valid prefix
        known = []
        for row, j in enumerate(usable.argmax(-1).tolist()):
            cursor = self._cursors[j].copy()
            cursor.rollback(cursor.accepted - int(usable[row, j]))
            known.append(cursor)
        return known


def check_input_ids(input_ids: Any) -> None:
    """`OptionError` unless ``input_ids`` is an integer tensor [rows, tokens], as ``generate`` passes it. Changes
    nothing."""
    integer = isinstance(input_ids, torch.Tensor) and not (
        input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool)
    if not integer or input_ids.dim() != 2:
        raise OptionError(f"input_ids must be an integer tensor [rows, tokens], as generate passes it; got "
                          f"{_shown(input_ids)}: pass a LongTensor, input_ids[None] for one row")


def check_scores(input_ids: Any, scores: Any, width: int) -> None:
    """`OptionError` unless ``input_ids`` is [rows, tokens] (`check_input_ids`) and ``scores`` a floating tensor
    [rows, at least ``width``] (the FSM's logits width: narrower scores cannot hold its ids). Changes nothing."""
    check_input_ids(input_ids)
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or not scores.dtype.is_floating_point:
        raise OptionError(f"scores must be a floating tensor [rows, vocabulary], got {_shown(scores)}: pass the "
                          "logits generate passes, one row per input_ids row")
    if scores.shape[0] != input_ids.shape[0]:
        raise OptionError(f"scores has {scores.shape[0]} rows and input_ids {input_ids.shape[0]}: pass one row of "
                          "scores per row of input_ids")
    if scores.shape[1] < width:
        raise OptionError(f"scores are {scores.shape[1]} wide, narrower than this processor's FSM ({width}: its "
                          "tokenizer's size, or the LM's logits width): build the processor for the model whose "
                          "scores these are")


def _shown(value: Any) -> str:
    """``value`` in an error message: a tensor by its dtype and shape, anything else by its type."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


class StopWhenComplete(transformers.StoppingCriteria):
    """Ends a row once its output is complete (EOS is the only token left) or has ended with EOS.

    Pass the same processor: ``stopping_criteria=[StopWhenComplete(processor)]``.
    A row stopped while complete has no trailing EOS, as in structspec's own loop.
    """

    def __init__(self, processor: LogitsProcessor) -> None:
        self.processor = processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        """Which rows are done [rows] (on ``input_ids``' device). Changes the processor's prefix cache only."""
        done = [s is None or self.processor.fsm.is_complete(s) for s in self.processor.states(input_ids)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
