"""The decode loop and what an adapter drives: one output's `Cursor` over a compiled token FSM, its `Forcer`
(forced tokens and text, spelled with the splits learned), and the core's drafters (`PromptLookup`).

Adapters (`structspec.integrations`) import these names from here, never the wing's modules.
"""

from structspec.decoding.candidate import FORCED, Candidate
from structspec.decoding.cursor import ENDED, Cursor, eos_only_row
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.fastforward import Forcer

__all__ = ["ENDED", "FORCED", "Candidate", "Cursor", "Forcer", "PromptLookup", "eos_only_row"]
