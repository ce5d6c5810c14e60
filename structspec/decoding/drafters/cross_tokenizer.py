"""A draft model with another tokenizer, translated through text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from structspec.decoding.candidate import DraftRequest, Step
from structspec.decoding.drafters.draft_model import DraftModel
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.lookup import PromptLookup


@dataclass(eq=False)
class CrossTokenizerDrafter(DraftModel):
    """A draft LM with a different tokenizer: it continues the text greedily (unconstrained, in its own
    vocabulary) and the text is re-tokenized with the target's tokenizer.

    The two token streams stay aligned through text: each chunk starts from the
    target context decoded to text and re-encoded by the draft tokenizer, and
    the draft KV cache keeps the common prefix. Drafts are deterministic, so
    they verify as point masses. The last translated token is dropped (it may
    merge with the text that follows).

    With a ``lookup`` (staged speculation, as `StagedDrafter`), a chunk starts
    from prompt lookup's guess in the draft tokenizer's ids over the re-encoded
    context, checked by the draft in one pass; past the guess's first mismatch
    it goes on one pass per token. The chunk is the same greedy text either way.

    Alone it keeps a KV cache of its own; attached to a row of a batch's draft
    cache (`DraftModel.attach`), each of a chunk's passes is a `DraftRequest`
    that the batch's shared draft pass answers, and the chunk goes on from there.
    """

    target_tokenizer: Any
    target_vocab: Any
    name: str = "draft_model"
    lookup: PromptLookup | None = None  # None: one draft pass per token
    _buffer: list[int] = field(default_factory=list)  # translated tokens, proposed from _base on
    _base: int = 0
    _progress: tuple[list[int], list[int], list[int]] | None = None  # a chunk waiting on a batch's draft pass

    def begin(self) -> None:
        """Nothing per candidate: the translated chunk lasts while the context follows it."""

    def next(self, turn: Turn, context: list[int], state: int) -> Step | DraftRequest | None:
        done = len(context) - self._base
        if not (0 <= done < len(self._buffer) and context[self._base :] == self._buffer[:done]):
            if (request := self._translate_chunk(context, turn.drafted)) is not None:
                return request
            done = 0
        if done >= len(self._buffer):
            return None
        return Step(self._buffer[done], self.name)

    def _translate_chunk(self, context: list[int], length: int) -> DraftRequest | None:
        """Translate the draft's greedy text of ``length`` tokens after ``context`` (the row's draft length) into
        the target's ids (the buffer), or the batch's `DraftRequest` its next pass waits on. Changes the buffer
        and the draft cache."""
        # HF decode keeps special tokens as text (chat markers), which the draft tokenizer parses back
        text = self.target_tokenizer.decode(context, clean_up_tokenization_spaces=False)
        draft_ids = list(self.lm.tokenizer(text, add_special_tokens=False)["input_ids"])
        drafted = self._greedy(draft_ids, length + 1)  # one spare token: the last translated is dropped
        if isinstance(drafted, DraftRequest):
            return drafted
        new_text = self.lm.vocab.spell(drafted)
        try:
            ids = self.target_tokenizer.encode(new_text.decode("utf-8"), add_special_tokens=False)[:-1]
        except UnicodeDecodeError:
            ids = []
        spelled = self.target_vocab.spell(ids)
        if spelled != new_text[: len(spelled)]:
            ids = []  # the tokenizer normalized the text: no faithful translation
        self._buffer, self._base = ids, len(context)
        return None

    def _greedy(self, draft_ids: list[int], limit: int) -> list[int] | DraftRequest:
        """The draft's greedy continuation of ``draft_ids``, up to ``limit`` tokens and short of EOS: the first
        pass also checks the lookup's guess, each later pass adds one token. In a batch, the `DraftRequest` of
        the pass it waits on, its progress kept for the call after that pass. Changes the draft cache."""
        if self._progress is not None and self._progress[0] == draft_ids:
            _, drafted, guess = self._progress  # a batch's draft pass ran: go on from where the chunk stopped
        else:
            guess = self.lookup.guess(draft_ids, limit - 1) if self.lookup is not None else []
            drafted = []
        self._progress = None
        while len(drafted) < limit:
            rows = self._context.logits_along(draft_ids + drafted + guess, len(draft_ids) + len(drafted))
            if isinstance(rows, DraftRequest):
                self._progress = (draft_ids, drafted, guess)
                return rows
            rows = rows[:, : len(self.lm.vocab.token_bytes)]  # ids past the vocabulary (padding) spell nothing
            for row, proposed in zip(rows, guess + [None]):
                token = int(row.argmax())
                if token == self.lm.vocab.eos_token_id:
                    return drafted
                drafted.append(token)
                if token != proposed:
                    break
            guess = []
        return drafted

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """Nothing to learn: the row's draft length learns from the verdicts."""
