"""The drafter for ``draft=``: a name, a loaded LM, a drafter named by a small frozen value, or a `Drafter`.

Typical use::

    check_draft(options.draft)            # before any model loads: OptionError naming the fix
    drafter = make_drafter(options.draft, lm)

The names are `DRAFT_NAMES`; the research drafters are classes the user
constructs: ``TreeDrafter()`` (token trees), ``SelfDraft()`` (the target's first
layers), ``SelfDraft(threshold=True)`` (threshold decoding), ``Staged()`` (staged
self-draft) and ``Staged(lm)`` (a loaded draft LM with staged speculation).
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args


from structspec.decoding.drafters.composite import Composite
from structspec.decoding.drafters.cross_tokenizer import CrossTokenizerDrafter
from structspec.decoding.drafters.draft_model import ModelDrafter
from structspec.decoding.drafter import Drafter, TreeDrafting
from structspec.decoding.drafters.lookahead import LookaheadDrafter
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.drafters.policy import THRESHOLD
from structspec.decoding.drafters.staged import StagedDrafter
from structspec.errors import OptionError
from structspec.models.protocol import LanguageModel

DraftName = Literal["prompt_lookup", "lookahead", "auto"]
DRAFT_NAMES: tuple[str, ...] = get_args(DraftName)
RETIRED = {  # retired names → the class to construct
    "tree": "TreeDrafter()", "self": "SelfDraft()", "threshold": "SelfDraft(threshold=True)", "staged": "Staged()",
}


@dataclass(frozen=True)
class SelfDraft:
    """``draft=SelfDraft()``: self-draft, the target's first layers drafting (`LM.early_exit`); with
    ``threshold``, threshold decoding's stop (the candidate's cumulative draft probability under one half).
    Names a drafter and holds no state, so `generate_batch` takes it and makes one drafter per row."""

    threshold: bool = False


@dataclass(frozen=True)
class Staged:
    """``draft=Staged(lm)``: the loaded draft LM ``lm`` drafting with staged speculation; ``Staged()``: staged
    self-draft. Names a drafter and holds no state, so `generate_batch` takes it and makes one drafter per row."""

    lm: LanguageModel | None = None


Draft: TypeAlias = DraftName | LanguageModel | Drafter | SelfDraft | Staged | None
"""What ``draft=`` takes: a drafter's name, a loaded LM (a draft model), a drafter object, or None (no drafts)."""


def check_draft(draft: object) -> None:
    """`OptionError` unless ``draft`` is None, one of `DRAFT_NAMES`, a loaded LM, `SelfDraft`, `Staged` or a
    `Drafter`: a retired name says which class to construct, an unknown one suggests the nearest name. Loads
    nothing, changes nothing."""
    names = ", ".join(map(repr, DRAFT_NAMES))
    if isinstance(draft, type):  # a class passes the runtime Protocol checks below, having their methods
        raise OptionError(f"draft={draft.__name__} is a class, not a drafter: pass an instance, as "
                          f"draft={draft.__name__}(), one of {names}, a loaded LM or None")
    if isinstance(draft, str):
        if draft in DRAFT_NAMES:
            return
        if draft in RETIRED:
            raise OptionError(f"draft={draft!r} is no longer a name: pass draft=structspec.{RETIRED[draft]} instead")
        near = difflib.get_close_matches(draft, DRAFT_NAMES + tuple(RETIRED), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise OptionError(f"draft={draft!r} is not one of {names}: {hint}pass one of them, a loaded LM or a Drafter")
    if draft is not None and not isinstance(draft, (SelfDraft, Staged, Drafter, LanguageModel)):
        raise OptionError(
            f"draft= got a {type(draft).__name__}: pass None, one of {names}, a loaded LM, SelfDraft(), Staged(), "
            "TreeDrafter() or another Drafter"
        )


def make_drafter(draft: Draft, target: LanguageModel) -> Drafter | None:
    """The drafter for ``draft=`` (module doc), already let through by `check_draft` (the options check it once
    per call), drafting for ``target``: a `Drafter` as it is, a new one otherwise. Changes nothing."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, LanguageModel):
        if draft.vocab.fingerprint == target.vocab.fingerprint:
            return ModelDrafter(draft)
        return CrossTokenizerDrafter(draft, target.tokenizer, target.vocab)
    if isinstance(draft, SelfDraft):
        if draft.threshold:
            return ModelDrafter(target.early_exit(), name="threshold", confidence=THRESHOLD)
        return ModelDrafter(target.early_exit(), name="self_draft")
    if isinstance(draft, Staged):
        if draft.lm is None:
            return StagedDrafter(target.early_exit(), name="staged_self_draft")
        if draft.lm.vocab.fingerprint == target.vocab.fingerprint:
            return StagedDrafter(draft.lm)
        return CrossTokenizerDrafter(draft.lm, target.tokenizer, target.vocab, name="staged_draft_model",
                                     lookup=PromptLookup())
    if draft == "prompt_lookup":
        return PromptLookup()
    if draft == "lookahead":
        return LookaheadDrafter()
    assert draft == "auto", "check_draft let only the names through"
    # Self-draft tokens pay only where a pass that verifies them costs about what a one-token step does:
    # on a GPU (8 tokens fed cost 1.1× one, `structspec.tools.pass_cost`); on a CPU each fed token adds
    # to the pass and a quarter-model draft pass per token, and prompt lookup alone was faster.
    if target.device.type != "cuda":
        return PromptLookup()
    return Composite(PromptLookup(), ModelDrafter(target.early_exit(), name="self_draft"))


def check_row_draft(draft: Draft) -> None:
    """`OptionError` where ``draft`` cannot serve many rows: a `Drafter` instance that holds a model or one row's
    state (a token-tree drafter, `TreeDrafter` or `LookaheadDrafter`, has no model and is copied per row).
    Changes nothing."""
    if isinstance(draft, Drafter) and not isinstance(draft, TreeDrafting):
        raise OptionError(
            f"a {type(draft).__name__} instance holds one row's state: pass a drafter name, a loaded LM, "
            "SelfDraft(), Staged() or a TreeDrafter()"
        )


def make_row_drafter(draft: Draft, target: LanguageModel) -> Drafter | None:
    """`make_drafter` for one row of a batch, ``draft`` checked by `check_row_draft`: a token-tree drafter
    instance is copied for the row. Changes nothing."""
    check_row_draft(draft)
    if isinstance(draft, TreeDrafting):
        return copy.deepcopy(draft)
    return make_drafter(draft, target)
