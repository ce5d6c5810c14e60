"""How results are shown: the stats table, and the token view (text per token, split UTF-8 included; colors per
source; HTML and terminal rendering)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from structspec.result import DraftStats, Stats, no_pass_tokens
from structspec.tools.explain import (
    SOURCE_COLORS,
    explain_html,
    legend_html,
    legend_rich,
    source_colors,
    stats_table,
    to_rich,
    token_views,
)

# id → bytes: "é" is b"\xc3\xa9", split over tokens 2 and 3; token 5 has no bytes (a special token).
TOKEN_BYTES = (b"{", b'"a":', b"\xc3", b"\xa9", b"<b>\n", None, b"\xe2\x82")


def test_a_split_character_shows_once_on_the_token_that_completes_it() -> None:
    views = token_views(TOKEN_BYTES, [0, 1, 2, 3, 4], ["forced", "forced", "model", "model", "model"])
    assert [v.text for v in views] == ["{", '"a":', "", "é", "<b>\n"]
    assert "".join(v.text for v in views) == b"".join(TOKEN_BYTES[:5]).decode()
    assert [v.raw for v in views][2:4] == [b"\xc3", b"\xa9"]


def test_a_dangling_partial_character_ends_as_a_replacement_character() -> None:
    views = token_views(TOKEN_BYTES, [0, 6], ["model", "model"])
    assert [v.text for v in views] == ["{", "\ufffd"]


def test_special_tokens_and_missing_sources_do_not_break_the_view() -> None:
    views = token_views(TOKEN_BYTES, [0, 5, 1], ["model"])
    assert [(v.text, v.source) for v in views] == [("{", "model"), ("", "?"), ('"a":', "?")]


def test_known_sources_keep_their_colors_and_unknown_ones_get_distinct_fallbacks() -> None:
    colors = source_colors(["model", "brand_new", "forced", "other_new", "brand_new"])
    assert list(colors) == ["model", "brand_new", "forced", "other_new"]
    assert colors["model"] == SOURCE_COLORS["model"] and colors["forced"] == SOURCE_COLORS["forced"]
    assert colors["brand_new"] != colors["other_new"]
    assert not {colors["brand_new"], colors["other_new"]} & set(SOURCE_COLORS.values())


def test_no_pass_tokens_counts_every_source_but_model() -> None:
    assert no_pass_tokens(["forced", "model", "prompt_lookup", "draft_model", "model", "x"]) == 4
    assert no_pass_tokens([]) == 0


def test_html_has_one_escaped_span_per_token_with_a_tooltip_and_a_legend_of_what_occurs() -> None:
    views = token_views(TOKEN_BYTES, [0, 1, 4], ["forced", "prompt_lookup", "model"])
    page = explain_html("t <1>", views)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    spans = re.findall(r'<span(?: class="partial")? style="background:#\w+" title="([^"]*)">([^<]*)</span>', page)
    assert [text for _, text in spans] == ["{", "&quot;a&quot;:", "&lt;b&gt;\n"]
    assert spans[2][0] == "#2  id 4  model  b&#x27;&lt;b&gt;\\n&#x27;"
    legend = legend_html(views)
    assert "prompt_lookup" in legend and "draft_model" not in legend and "1 (33%)" in legend
    assert "t &lt;1&gt;" in page


def test_adjacent_tokens_of_one_source_alternate_shades() -> None:
    views = token_views(TOKEN_BYTES, [0, 1, 4], ["forced", "forced", "model"])
    text = to_rich(views)
    styles = [str(span.style) for span in text.spans]
    assert styles == [f"black on {SOURCE_COLORS['forced'][0]}", f"black on {SOURCE_COLORS['forced'][1]}",
                      f"black on {SOURCE_COLORS['model'][0]}"]
    assert text.plain == '{"a":<b>↵\n'
    assert "forced" in legend_rich(views).plain and "2 (67%)" in legend_rich(views).plain


def test_the_stats_table_lists_passes_forced_tokens_and_each_drafter_once() -> None:
    stats = Stats(prompt_tokens=12, output_tokens=40, target_forward_passes=10, forced_tokens=18,
                  drafts={"forced": DraftStats(6, 5), "prompt_lookup": DraftStats(20, 12)})
    console = Console(file=io.StringIO(), width=80)
    console.print(stats_table(stats, title="run"))
    out = console.file.getvalue()
    assert "target forward passes" in out and "0.250" in out and "18 (45%)" in out
    assert "accepted from prompt_lookup" in out and "12 of 20 drafted" in out
    assert "accepted from forced" not in out  # forced text is in the forced-tokens row already
