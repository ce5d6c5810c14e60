"""The coverage benchmark's report: one row of figures per split and engine, and the table in Markdown.
Pure functions of the rows' records."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

def _quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"{statistics.median(values):.3f} / {p90:.3f} / {values[-1]:.2f}"


def _share(pairs: list[list[int]]) -> str:
    hit, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return f"{100 * hit / total:.1f}% ({hit}/{total})" if total else "-"


def summarize(records: list[dict[str, Any]], engine: str) -> dict[str, str]:
    """One table row: the split's figures for ``engine``, over the records it ran on (the rows column says
    "n of N" where that is a sample)."""
    runs = [r[engine] for r in records if engine in r]
    n = len(runs)
    status = Counter(r["status"] for r in runs)
    keywords = Counter(r["keyword"] for r in runs if r["status"] == "schema_error")
    ok = [r for r in runs if r["status"] == "compiled"]
    generated = [r["generated"] for r in ok if "generated" in r]
    gen_valid, gen_invalid, gen_incomplete = (sum(g[i] for g in generated) for i in range(3))
    return {
        "rows": str(n) if n == len(records) else f"{n} of {len(records)}",
        "compiled": f"{100 * status['compiled'] / n:.1f}%",
        "SchemaError": f"{100 * status['schema_error'] / n:.1f}% "
        + ", ".join(f"{k} {v}" for k, v in keywords.most_common(4)),
        "other": ", ".join(f"{k} {v}" for k, v in status.items() if k not in ("compiled", "schema_error")) or "0",
        "valid accepted": _share([r["valid_accepted"] for r in ok]),
        "invalid rejected": _share([r["invalid_rejected"] for r in ok]),
        "undecided": str(sum(r.get("undecided", 0) for r in ok)),
        "generated valid": f"{gen_valid}/{gen_valid + gen_invalid} ({gen_incomplete} incomplete)"
        if generated else "-",
        "cold s (med/p90/max)": _quantiles([r["compile_s"] for r in ok]),
        "cold + first mask s": _quantiles([r.get("first_mask_s", r["compile_s"]) for r in ok]),
        "cached s": _quantiles([r["cached_s"] for r in ok if "cached_s" in r]),
        "regex s": _quantiles([r["regex_s"] for r in ok]),
        "mask ms/state (med/p90/max)": _quantiles([1000 * t for r in ok for t in r.get("mask_s", [])]),
        "states (med/max)": f"{statistics.median([r['states'] for r in ok]):.0f} / {max(r['states'] for r in ok)}"
        if ok else "-",
    }


def markdown(table: dict[str, dict[str, dict[str, str]]]) -> str:
    """The per-split, per-engine table in Markdown."""
    columns = list(next(iter(next(iter(table.values())).values())))
    lines = ["| split | engine | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for split, engines in table.items():
        for engine, row in engines.items():
            lines.append(f"| {split} | {engine} | " + " | ".join(row[c] for c in columns) + " |")
    return "\n".join(lines)
