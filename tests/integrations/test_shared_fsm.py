"""One token FSM shared by threads, as in vLLM's in-process mode: the backend compiles and masks in vLLM's
compile thread pool while the proposer walks the same cached FSM (one lazy DFA, its rows built by whichever thread
reaches them first). Concurrent answers must equal the sequential ones. No vLLM needed."""

from __future__ import annotations

import sys
import threading

import pytest

import structspec
from structspec.automaton.fsm import TokenFSM

SCHEMA = {"type": "object", "properties": {
    "customer_full_name": {"type": "string", "maxLength": 24},
    "status": {"enum": ["active_subscription", "suspended_for_nonpayment", "closed_by_user"]},
    "tickets": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 4}},
    "required": ["customer_full_name", "status", "tickets"]}
TEXTS = ['{"customer_full_name": "Ada Lovelace", "status": "closed_by_user", "tickets": [1, 2]}',
         '{"customer_full_name":"Grace","status":"active_subscription","tickets":[]}',
         '{ "customer_full_name" : "Linus T", "status" : "suspended_for_nonpayment", "tickets" : [ 99 ] }',
         '{"customer_full_name": "Tim", "status": "closed_by_user", "tickets": [7, 8, 9, 10]}']


def answers(fsm: TokenFSM, tokens: list[int]) -> list[tuple[bool, tuple[int, ...], bool]]:
    """What the backend and the proposer read along ``tokens``: per state, whether the next token is accepted,
    the allowed tokens (the backend's bitmask), and whether it is final. Builds the DFA's rows it reaches."""
    states = [fsm.initial_state, *fsm.walk(fsm.initial_state, tokens)]
    bitmask = fsm.allocate_token_bitmask(1)
    found = []
    for i, state in enumerate(states):
        fsm.fill_next_token_bitmask(bitmask, 0, state)
        allowed = tuple(fsm.allowed_token_ids(state).tolist())
        found.append((i < len(tokens) and fsm.next_state(state, tokens[i]) is not None, allowed, fsm.is_final(state)))
    return found


@pytest.mark.parametrize("rounds", [3])
def test_threads_walking_and_masking_one_lazy_dfa_answer_as_one_thread(byte_lm: structspec.LM, isolated_cache: str,
                                                                       rounds: int) -> None:
    regex = structspec.to_regex(SCHEMA, "[ \n\r\t]*", open_objects=False)
    tokens = [byte_lm.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    structspec.clear_cache(disk=True)
    expected = [answers(TokenFSM.from_regex(regex, byte_lm.vocab), t) for t in tokens]
    assert all(all(step[0] for step in e[:-1]) and e[-1][2] for e in expected)  # (every text is in the language)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter lets them
    try:
        for _ in range(rounds):
            structspec.clear_cache(disk=True)  # a fresh lazy DFA: no row built yet
            found: list[object] = [None] * (2 * len(tokens))
            start = threading.Barrier(len(found))

            def run(k: int) -> None:
                start.wait()
                found[k] = answers(TokenFSM.from_regex(regex, byte_lm.vocab), tokens[k % len(tokens)])

            threads = [threading.Thread(target=run, args=(k,)) for k in range(len(found))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert found == expected * 2
    finally:
        sys.setswitchinterval(switch)
