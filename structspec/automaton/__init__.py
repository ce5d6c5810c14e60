"""Regex → token FSM as a straight stack: utf8 → parse → nfa → dfa → index → fsm.

Each module imports only those before it; this wing imports no other.
"""

from structspec.automaton.fsm import TokenFSM, apply_token_bitmask_inplace, clear_cache
from structspec.automaton.index import UnspellableError

__all__ = ["TokenFSM", "UnspellableError", "apply_token_bitmask_inplace", "clear_cache"]
