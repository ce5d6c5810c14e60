"""lab.rowwalk: the trace of one turn names the row's calls into its cursor and the pass's into the masks."""

from __future__ import annotations

from lab import rowwalk


def test_a_traced_turn_finds_the_calls_between_the_wings_files() -> None:
    trace = rowwalk.traced_turn(2)
    callers_to_callees = {(a.split(":")[0], b.split(":")[0]) for a, b in trace.calls}
    assert ("row.py", "cursor.py") in callers_to_callees and ("passes.py", "masks.py") in callers_to_callees
    assert all(a.split(":")[0] != b.split(":")[0] for a, b in trace.calls)  # only calls across files
    text = rowwalk.summary(trace)
    assert "core of a turn" in text and "row.py:" in text
