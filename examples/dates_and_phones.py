"""Regex specs: dates and phone numbers pulled out of free text, on SmolLM2-135M.

``structspec.Regex(pattern)`` constrains the output to the pattern and returns the
matched ``str``. Fixed parts of a pattern (the dashes of a date, the ``+`` of a
phone number) are forced without asking the model.

    python examples/dates_and_phones.py
"""

from __future__ import annotations

import structspec

DATE = structspec.Regex(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")  # ISO 8601 calendar date
PHONE = structspec.Regex(r"\+[1-9][0-9]{0,2} [0-9]{2,4}( [0-9]{2,4}){1,3}")  # international, space-grouped

NOTE = ("Reminder: the supplier audit moved to 14 March 2025. If anything changes, call Jonas at "
        "+49 30 1234 5678 before noon.")


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{NOTE}\n\n{question}"}]


def main() -> None:
    lm = structspec.load("smollm2-135m")
    for label, spec, question in [
        ("date", DATE, "When is the audit? Answer with the date as YYYY-MM-DD."),
        ("phone", PHONE, "Which phone number should I call?"),
    ]:
        result = structspec.generate_result(lm, spec, ask(question), max_new_tokens=30)
        s = result.stats
        print(f"{label:6} {result.value!r:22} {s.output_tokens} tokens, {s.target_forward_passes} forward passes, "
              f"{s.forced_tokens} forced")
    print("the date regex, as another engine would take it:", structspec.to_regex(DATE))


if __name__ == "__main__":
    main()
