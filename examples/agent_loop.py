"""An agent's loop on the shipped Qwen2.5-Coder-0.5B-Instruct: the model calls a tool, the call runs against its
Python function, the result goes back as a ``tool`` message, and the model answers the user in text.

The call is asked for with ``choice="required"``: under ``"auto"`` this small model often answers in text, or
writes the call as JSON without Qwen's ``<tool_call>`` markers (shown last). A turn that opens with such a call
(bare or in a ```json block) is a call all the same (``ToolCalls(bare_calls=True)``, the default); one written
after some text lands in ``unmarked_calls``, with a warning, and is not run.

    python examples/agent_loop.py
"""

from __future__ import annotations

import warnings
from typing import Literal

import structspec

Currency = Literal["EUR", "USD", "GBP"]
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85}


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict[str, object]:
    """The weather in a city now."""
    return {"city": city, "temperature": 18 if unit == "C" else 64, "unit": unit, "sky": "sunny"}


def convert(amount: float, currency: Currency, to: Currency) -> float:
    """Convert an amount of money from one currency to another."""
    return round(amount / RATES[currency] * RATES[to], 2)


TOOLS = [get_weather, convert]


def main() -> None:
    lm = structspec.load("qwen2.5-coder-0.5b")
    messages = [{"role": "user", "content": "What is the weather in Lisbon, in C?"}]
    turn = structspec.generate(lm, structspec.ToolCalls(TOOLS, choice="required"), messages, max_new_tokens=80)
    for call in turn.calls:
        print(f"call:      {call.name}({call.keywords()})")
    answers = turn.run(TOOLS)  # each call's function, its validated arguments as keywords
    print(f"tool:      {[m['content'] for m in answers]}")
    messages += [turn.assistant_message(), *answers]
    reply = structspec.generate(lm, structspec.ToolCalls(TOOLS, choice="none"), messages, max_new_tokens=60)
    print(f"assistant: {reply.text}")

    question = [{"role": "user", "content": "Convert 250 USD to EUR."}]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        auto = structspec.generate_result(lm, structspec.ToolCalls(TOOLS, choice="auto"), question,
                                          max_new_tokens=120)
    if auto.complete:
        print(f"\nauto:      calls {auto.value.calls}, unmarked_calls {auto.value.unmarked_calls}")
    else:
        print(f"\nauto:      stopped on {auto.stop_reason}: {auto.text!r}")
    for w in warned:
        print(f"warning:   {w.message}")


if __name__ == "__main__":
    main()
