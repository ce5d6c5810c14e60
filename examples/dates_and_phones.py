"""Regex specs: dates and phone numbers pulled out of free text, on SmolLM2-135M.

``structspec.Regex(pattern)`` constrains the output to the pattern and returns the
matched ``str``. Fixed parts of a pattern (the dashes of a date, the ``+`` of a
phone number) are forced without asking the model.

    python examples/dates_and_phones.py
"""

from __future__ import annotations

import structspec

DATE = structspec.Regex(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")  # ISO 8601 calendar date
# International, country code and three space-separated groups: with a variable number of groups
# a small model tends to stop after the second one.
PHONE = structspec.Regex(r"\+[1-9][0-9]{0,2}( [0-9]{2,4}){3}")

NOTE = ("Reminder: the supplier audit moved from 2025-02-28 to 2025-03-14. If anything changes, call Jonas "
        "at +49 30 1234 5678 before noon.")


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{NOTE}\n\n{question}"}]


def main() -> None:
    lm = structspec.load("smollm2-135m")
    for label, spec, question in [
        ("date", DATE, "What is the new date of the audit?"),
        ("phone", PHONE, "What is Jonas's phone number?"),
    ]:
        result = structspec.generate_result(lm, spec, ask(question), max_new_tokens=30)
        s = result.stats
        print(f"{label:6} {result.value!r:22} {s.output_tokens} tokens, {s.target_forward_passes} forward passes, "
              f"{s.forced_tokens} forced")
    print("the date regex, as another engine would take it:", structspec.to_regex(DATE))


if __name__ == "__main__":
    main()
