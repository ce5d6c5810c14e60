"""Terminal rendering of results: the stats table people read after a run."""

from __future__ import annotations

from rich.table import Table

from structspec.result import Stats


def stats_table(stats: Stats, title: str = "stats") -> Table:
    """A two-column table of one generation's stats."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    forced_share = stats.forced_tokens / max(stats.output_tokens, 1)
    rows = [
        ("prompt tokens", f"{stats.prompt_tokens}"),
        ("output tokens", f"{stats.output_tokens}"),
        ("target forward passes", f"{stats.target_forward_passes}"),
        ("passes per output token", f"{stats.passes_per_token:.3f}"),
        ("forced tokens (no model call)", f"{stats.forced_tokens} ({forced_share:.0%})"),
        # forced text verified as a draft is already counted in the row above
        *((f"accepted from {name}", f"{d.accepted} of {d.drafted} drafted")
          for name, d in stats.drafts.items() if name != "forced"),
        ("model time per pass", f"{1000 * stats.model_seconds_per_pass:.1f} ms"),
        ("constraint time per pass", f"{1000 * stats.constraint_seconds_per_pass:.2f} ms"),
        ("compile", f"{1000 * stats.compile_seconds:.1f} ms ({stats.compile_source})"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
