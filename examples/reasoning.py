"""Reasoning, then an answer in a schema, on the shipped Qwen2.5-Coder-0.5B-Instruct: the model thinks in free
text for at most 64 tokens; once the budget is spent, ``</think>`` (or the rest of it) is the only way on and
fast-forward writes it without a model call; then the answer must match ``Verdict``.

    python examples/reasoning.py
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

import structspec


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=100)


QUESTION = ("A train leaves at 14:10 and the trip takes 95 minutes. The meeting starts at 15:50, a 5-minute walk "
            "from the station. Does the traveller arrive on time?")


def main() -> None:
    lm = structspec.load("qwen2.5-coder-0.5b")
    prompt = [{"role": "system", "content": "Think step by step inside <think>...</think>, then answer as JSON "
                                            '{"answer": "yes" or "no", "confidence": 0-100}.'},
              {"role": "user", "content": QUESTION}]
    spec = structspec.Reasoning(Verdict, begin="<think>\n", max_thinking_tokens=64)
    result = structspec.generate_result(lm, spec, prompt, max_new_tokens=200)
    forced = sum(s == "forced" for s in result.sources)
    print(f"thinking ({len(lm.tokenizer.encode(result.thinking or ''))} tokens):\n{result.thinking}\n")
    print(f"answer: {result.value!r}")
    print(f"{result.stats.output_tokens} output tokens, {forced} forced, "
          f"{result.stats.target_forward_passes} forward passes, stop: {result.stop_reason}")


if __name__ == "__main__":
    main()
