"""The engine benchmark's report: one configuration's totals over a task set (`Tally`), the arithmetic on them, and
the Markdown table with the notes under it. Plain values; nothing here runs a model or imports vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    """One configuration's totals over one task set at one batch size."""

    records: int = 0
    seconds: float = 0.0  # wall time of the calls, warm-up excluded
    output_tokens: int = 0  # without the final EOS
    steps: int = 0  # forward passes each record took part in, summed (vLLM: engine steps; own loop: Stats)
    engine_steps: int = 0  # vLLM: steps the engine ran (a batched step counts once); own loop: 0
    forced: int | None = None  # forced tokens (own loop's Stats); None where the configuration does not say
    drafted: int = 0
    accepted: int = 0
    valid: int = 0
    invalid: list[str] = field(default_factory=list)  # each invalid output: its record, why it stopped, its start
    expected_calls: int | None = None  # tool calls: turns whose calls are the expected ones (`judge_calls`)
    prompt_tokens: int = 0  # the prefix job's prompts' tokens
    cached_prompt_tokens: int = 0  # vLLM: prompt tokens its prefix cache supplied
    digests: list[str] = field(default_factory=list)  # vLLM: each output's token ids hashed, in record order


def add(total: Tally, part: Tally) -> None:
    """Count ``part`` into ``total``: its numbers summed (a count one of them does not know stays unknown only
    where neither knows it), its lists appended. Changes ``total``."""
    for name, value in vars(part).items():
        mine = getattr(total, name)
        if isinstance(value, list):
            mine.extend(value)
        elif value is not None:
            setattr(total, name, value if mine is None else mine + value)


def seconds_per_record(t: Tally) -> float:
    return t.seconds / t.records if t.records else float("nan")


def records_per_second(t: Tally) -> float:
    return t.records / t.seconds if t.seconds else float("nan")


def share(part: int | None, whole: int) -> float | None:
    """``part / whole``; None where ``part`` is unknown or ``whole`` is 0."""
    return None if part is None or not whole else part / whole


def speedup(value: float, base: float, lower_is_faster: bool) -> float:
    """How many times faster ``value`` is than ``base``: base / value for seconds, value / base for a rate."""
    return base / value if lower_is_faster else value / base


HEADER = ["configuration", "s / record (B=1)", "× first", "records/s (B={batch})", "× first",
          "steps / output token", "forced share", "draft acceptance", "valid (B=1)", "valid (B={batch})"]


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None or value != value else fmt.format(value)  # (value != value: NaN)


def table_rows(tallies: dict[str, tuple[Tally | None, Tally | None]], skipped: dict[str, str]) -> list[list[str]]:
    """The table's rows: per configuration (label → its B = 1 and batched tallies, None where not run), the
    cells of `HEADER`; ratios against the first configuration with both tallies. ``skipped``: label → why."""
    base = next(((one, many) for one, many in tallies.values() if one and many), (None, None))
    rows = []
    for label, (one, many) in tallies.items():
        if label in skipped:
            rows.append([label, f"skipped: {skipped[label]}", *["–"] * (len(HEADER) - 2)])
            continue
        cells = [label]
        for t, rate, base_t in ((one, seconds_per_record, base[0]), (many, records_per_second, base[1])):
            value = rate(t) if t else None
            cells.append(_cell(value, "{:.3f}"))
            ratio = speedup(value, rate(base_t), rate is seconds_per_record) if value and base_t else None
            cells.append(_cell(ratio, "×{:.2f}"))
        steps_from = one or many
        cells.append(_cell(share(steps_from.steps, steps_from.output_tokens) if steps_from else None, "{:.3f}"))
        cells.append(_cell(share(steps_from.forced, steps_from.output_tokens) if steps_from else None, "{:.1%}"))
        drafted = sum(t.drafted for t in (one, many) if t)
        accepted = sum(t.accepted for t in (one, many) if t)
        cells.append(f"{accepted / drafted:.1%} of {drafted:,}" if drafted else "–")
        cells += [f"{t.valid}/{t.records}" if t else "–" for t in (one, many)]
        rows.append(cells)
    return rows


def markdown(title: str, tallies: dict[str, tuple[Tally | None, Tally | None]], skipped: dict[str, str],
             batch_size: int) -> str:
    """One task set's table in Markdown, under ``title``, then the output tokens and steps behind it."""
    header = [h.format(batch=batch_size) for h in HEADER]
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(tallies, skipped)]
    lines.append("")
    for label, (one, many) in tallies.items():
        if label in skipped:
            continue
        parts = [f"{name}: {t.output_tokens:,} output tokens, {t.steps:,} record-steps"
                 + (f", {t.engine_steps:,} engine steps" if t.engine_steps else "") + f", {t.seconds:.1f} s"
                 + ("" if t.expected_calls is None else f", the expected calls in {t.expected_calls}/{t.records}")
                 for name, t in (("B=1", one), (f"B={batch_size}", many)) if t]
        lines.append(f"- {label}: " + "; ".join(parts))
        lines += [f"    - invalid at {name}: {why}" for name, t in (("B=1", one), (f"B={batch_size}", many)) if t
                  for why in t.invalid]
    return "\n".join(lines + same_outputs(tallies, batch_size))


# (configuration, the one whose outputs it must equal): a proposer or n-gram drafts change no greedy output
SAME_OUTPUTS = (("vLLM + structspec + proposer", "vLLM + structspec"), ("vLLM + xgrammar + ngram", "vLLM + xgrammar"))


def same_outputs(tallies: dict[str, tuple[Tally | None, Tally | None]], batch_size: int) -> list[str]:
    """A line per pair of `SAME_OUTPUTS` run here: how many outputs are token-identical at each batch size."""
    lines = []
    for label, base in SAME_OUTPUTS:
        pairs = zip(tallies.get(label, (None, None)), tallies.get(base, (None, None)), ("B=1", f"B={batch_size}"))
        counts = [f"{sum(a == b for a, b in zip(t.digests, u.digests))}/{len(u.digests)} at {name}"
                  for t, u, name in pairs if t and u and t.digests and u.digests]
        if counts:
            lines.append(f"- {label}: outputs token-identical to {base}'s in " + ", ".join(counts))
    return lines


NOTES = ("Steps / output token: the forward passes each record took part in over its output tokens (EOS not "
         "counted): vLLM's engine steps that scheduled the request (its prefill included), the own loop's target "
         "and prefill passes (from B = 1). Forced share: the own loop's forced tokens; vLLM + structspec + "
         "proposer: the forced text its proposer drafted. Draft acceptance: accepted / drafted tokens over both "
         "runs (vLLM: as its spec-decoding stats count them; own loop: every draft source but forced splices). "
         "Valid: outputs that validate against their JSON Schema (tool calls: every call parses and validates "
         "against its tool; an auto turn may answer in text; vLLM leaves choice=auto unconstrained, as vllm serve "
         "does); the totals say in how many turns the calls were the expected ones. Each distinct schema is "
         "warmed up (two tokens, not timed); prefix caches are emptied before each run. Each configuration runs "
         "in a worker process of its own, all alive at once, and their runs interleave so that a slow spell of "
         "the host falls on each alike: at B = 1 record by record, the configurations in turn and in the "
         "opposite order on every other record; the batched run twice, in opposite orders, its seconds the mean "
         "of the two.")
