"""The decode loop and what an adapter drives: one output's `Cursor` over a compiled token FSM, its `Forcer`
(forced tokens and text, spelled with the splits learned), the core's drafters (`PromptLookup`) and how long a
draft pays (`DraftLength` on a `PassCost` curve; `choose_widths` for a batch's rows in one pass).

Adapters (`structspec.integrations`) import these names from here, never the wing's modules.
"""

from structspec.decoding.candidate import FORCED, Candidate
from structspec.decoding.cost import CPU_COST, FLAT_COST, DraftLength, PassCost, choose_widths
from structspec.decoding.cursor import ENDED, Cursor, eos_only_row
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.fastforward import Forcer

__all__ = [
    "CPU_COST", "ENDED", "FLAT_COST", "FORCED", "Candidate", "Cursor", "DraftLength", "Forcer", "PassCost",
    "PromptLookup", "choose_widths", "eos_only_row",
]
