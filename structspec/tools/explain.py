"""How results are shown: the stats table, and the token view (each output token in the color of how it
was produced).

A source is a name from `Result.sources`: ``forced`` (fast-forward, no model
call), ``model`` (the target chose it after a forward pass), and the drafters
whose accepted proposals needed no pass of their own (``prompt_lookup``,
``draft_model``, ``self_draft``, ``threshold``). Unknown names get a color from a
fallback palette, so a new drafter shows up without changes here.

Typical use::

    console.print(stats_table(result.stats))
    views = token_views(lm.vocab.token_bytes, result.token_ids, result.sources)
    console.print(to_rich(views)); console.print(legend_rich(views))
    Path("out.html").write_text(html_page("explain", tokens_html(views)))

Adjacent tokens alternate between two shades of their source's color, so token
boundaries stay visible inside a run of one source.
"""

from __future__ import annotations

import codecs
import html
from collections import Counter
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

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


# source → (shade, alternate shade), light enough for black text on top.
SOURCE_COLORS: dict[str, tuple[str, str]] = {
    "forced": ("#b2f2bb", "#8ce99a"),
    "prompt_lookup": ("#a5d8ff", "#74c0fc"),
    "draft_model": ("#d0bfff", "#b197fc"),
    "self_draft": ("#99e9f2", "#66d9e8"),
    "threshold": ("#ffec99", "#ffe066"),
    "model": ("#ffd8a8", "#ffc078"),
}
_FALLBACK_COLORS = [("#fcc2d7", "#faa2c1"), ("#e9ecef", "#ced4da"), ("#c0eb75", "#a9e34b")]
SOURCE_MEANINGS: dict[str, str] = {
    "forced": "forced by the schema (no forward pass)",
    "prompt_lookup": "drafted from the prompt, accepted",
    "draft_model": "drafted by the draft model, accepted",
    "self_draft": "self-drafted, accepted",
    "threshold": "drafted by threshold, accepted",
    "model": "chosen by the target model (a forward pass)",
}


@dataclass(frozen=True)
class TokenView:
    """One output token: its id, how it was produced, its bytes and the text it shows."""

    token_id: int
    source: str
    raw: bytes
    text: str  # "" for a token that only starts a multi-byte character; the token that completes it shows it


def token_views(token_bytes: tuple[bytes | None, ...], token_ids: list[int], sources: list[str]) -> list[TokenView]:
    """Pair each token with its source and text (``token_bytes`` is ``lm.vocab.token_bytes``).

    Text is decoded incrementally, so a character split over several tokens is
    shown once, on the token that completes it; invalid bytes show as U+FFFD.
    Tokens past the end of ``sources`` get the source ``"?"``.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    views = []
    for i, t in enumerate(token_ids):
        raw = token_bytes[t] or b""
        final = i == len(token_ids) - 1  # flush a dangling partial character onto the last token
        source = sources[i] if i < len(sources) else "?"
        views.append(TokenView(t, source, raw, decoder.decode(raw, final=final)))
    return views


def source_colors(sources: list[str]) -> dict[str, tuple[str, str]]:
    """Colors for the sources that occur: fixed ones for known names, the fallback palette in turn for others."""
    unknown = [s for s in dict.fromkeys(sources) if s not in SOURCE_COLORS]
    colors = {s: _FALLBACK_COLORS[i % len(_FALLBACK_COLORS)] for i, s in enumerate(unknown)}
    return {s: SOURCE_COLORS.get(s) or colors[s] for s in dict.fromkeys(sources)}


def _ordered_counts(views: list[TokenView]) -> list[tuple[str, int]]:
    """(source, count) for the sources that occur: known ones in `SOURCE_COLORS` order, then the rest."""
    counts = Counter(v.source for v in views)
    order = [s for s in SOURCE_COLORS if s in counts] + [s for s in counts if s not in SOURCE_COLORS]
    return [(s, counts[s]) for s in order]


def _shade(colors: dict[str, tuple[str, str]], views: list[TokenView]) -> list[str]:
    return [colors[v.source][i % 2] for i, v in enumerate(views)]


def to_rich(views: list[TokenView]) -> Text:
    """The tokens as rich `Text`, each on its source's background; a newline shows as ↵ before the break."""
    colors = source_colors([v.source for v in views])
    text = Text()
    for v, shade in zip(views, _shade(colors, views)):
        text.append(v.text.replace("\n", "↵\n") or "·", style=f"black on {shade}")  # "·": a partial character
    return text


def legend_rich(views: list[TokenView]) -> Text:
    """One line: each source that occurs, its color, its meaning and its share of the tokens."""
    colors = source_colors([v.source for v in views])
    text = Text()
    for source, n in _ordered_counts(views):
        text.append(f" {source} ", style=f"black on {colors[source][0]}")
        text.append(f" {SOURCE_MEANINGS.get(source, source)}: {n} ({n / len(views):.0%})   ")
    return text


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #212529; max-width: 80em; }
.tokens { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-all;
          line-height: 1.9; padding: .6em; border: 1px solid #dee2e6; border-radius: 4px; background: #fff; }
.tokens span { padding: .15em 0; border-radius: 2px; }
.tokens span.partial { display: inline-block; min-width: .35em; }
.legend { margin: .4em 0 1em; font-size: .9em; }
.legend span.swatch { display: inline-block; padding: .1em .5em; margin-right: .3em; border-radius: 3px;
                      font-family: ui-monospace, monospace; }
.legend span.entry { margin-right: 1.6em; }
table { border-collapse: collapse; margin: 1em 0; font-size: .9em; }
th, td { border: 1px solid #dee2e6; padding: .3em .6em; }
th { background: #f1f3f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #868e96; font-size: .9em; }
"""


def tokens_html(views: list[TokenView]) -> str:
    """The tokens as one ``<div class="tokens">`` of spans with a tooltip: position, token id, source, bytes."""
    colors = source_colors([v.source for v in views])
    spans = []
    for i, (v, shade) in enumerate(zip(views, _shade(colors, views))):
        tip = html.escape(f"#{i}  id {v.token_id}  {v.source}  {v.raw!r}", quote=True)
        cls = ' class="partial"' if not v.text else ""
        spans.append(f'<span{cls} style="background:{shade}" title="{tip}">{html.escape(v.text)}</span>')
    return f'<div class="tokens">{"".join(spans)}</div>'


def legend_html(views: list[TokenView]) -> str:
    """The legend for ``views``: the sources that occur, with meaning, count and share."""
    colors = source_colors([v.source for v in views])
    entries = [
        f'<span class="entry"><span class="swatch" style="background:{colors[s][0]}">{html.escape(s)}</span>'
        f"{html.escape(SOURCE_MEANINGS.get(s, s))}: {n} ({n / len(views):.0%})</span>"
        for s, n in _ordered_counts(views)
    ]
    return f'<div class="legend">{"".join(entries)}</div>'


def html_page(title: str, body: str) -> str:
    """A self-contained HTML document (inline CSS, no scripts) around ``body``."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def explain_html(title: str, views: list[TokenView]) -> str:
    """A page with one output: the title, the legend and the colored tokens."""
    return html_page(title, f"<h1>{html.escape(title)}</h1>\n{legend_html(views)}\n{tokens_html(views)}")
