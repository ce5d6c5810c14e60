"""Quickstart: one extraction with a Pydantic model on the shipped SmolLM2-135M.

    python examples/quickstart.py
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from rich.console import Console

import structspec
from structspec.tools.explain import legend_rich, to_rich, token_views


class Contact(BaseModel):
    name: str = Field(max_length=40)  # bounds keep a small model from rambling inside a string
    company: str = Field(max_length=40)
    city: str = Field(max_length=30)
    email: str


DOCUMENT = ("Thanks for stopping by our booth! Priya Raman, Solutions Architect at Northwind Analytics, "
            "Toronto. Write to priya.raman@northwind.ai any time.")


def main() -> None:
    lm = structspec.load("smollm2-135m")
    prompt = [{"role": "user", "content": "Extract the following fields from the document as JSON: "
                                          f"name, company, city, email.\n\nDocument:\n{DOCUMENT}"}]

    contact = structspec.generate(lm, Contact, prompt, max_new_tokens=100)  # a validated Contact
    print(contact)

    result = structspec.generate_result(lm, Contact, prompt, max_new_tokens=100)  # the same, with its tokens
    s = result.stats
    print(f"{s.output_tokens} output tokens, {s.target_forward_passes} forward passes, "
          f"{s.forced_tokens} tokens forced by the schema, stop: {result.stop_reason}")
    console = Console()
    views = token_views(lm.vocab.token_bytes, result.token_ids, result.sources)
    console.print(to_rich(views))
    console.print(legend_rich(views))


if __name__ == "__main__":
    main()
