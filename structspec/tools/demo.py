"""``structspec demo``: one extraction from a short email on the shipped default model, shown token by token.

Three choices make SmolLM2-135M's greedy output right in float32 and bfloat16 alike: the prompt names the fields
(asked only for "the new hire", bfloat16 copies the whole paragraph into ``name``), the phone pattern ends the
number (without it the model runs on past it: ``'+234 801 555 0199, '``), and the enum is a fact the text states
(the start day; asked for a seniority, the model answers "junior" for "a senior hire" in both dtypes). A model that
small shows the mechanics, not accuracy.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field

import structspec
from structspec.tools.command import DEFAULT_MAX_NEW_TOKENS, load_model

if TYPE_CHECKING:
    from rich.console import Console

    from structspec.models.transformers_lm import LM

DEMO_DOCUMENT = (
    "Hi team, please welcome Dr. Maria Okafor, our new Head of Research, a senior hire who joins us from "
    "Lagos on Monday. She can be reached at maria.okafor@brightlabs.io or +234 801 555 0199."
)
DEMO_NOTE = "SmolLM2-135M shows the mechanics; use qwen2.5-coder-0.5b or your own model (--model) for accuracy."


class NewHire(BaseModel):
    """The demo's extraction schema."""

    name: str
    title: str
    city: str
    email: str
    phone: Annotated[str, Field(pattern=r"^\+[0-9]{1,3}( [0-9]{3,4}){2,3}$")]  # ends where the number ends
    start_day: Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def demo(lm: LM, console: Console, explain: bool = True, html: str | None = None) -> int:
    """Extract `NewHire` from `DEMO_DOCUMENT`; print the object, its stats and (``explain``) its tokens by how they
    were produced, and write that view to ``html`` if given. Returns the exit code (0)."""
    from structspec.decoding.cost import curve_source
    from structspec.tools.explain import explain_html, legend_rich, stats_table, to_rich, token_views

    fields = ", ".join(NewHire.model_fields)
    prompt = [{"role": "user", "content": f"Extract the new hire's {fields} as JSON.\n\n{DEMO_DOCUMENT}"}]
    result = structspec.generate_result(lm, NewHire, prompt, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    console.print(f"[bold]document:[/bold] {DEMO_DOCUMENT}\n")
    console.print(result.value)
    console.print(stats_table(result.stats, title=f"{lm.name}, greedy, stop: {result.stop_reason}"))
    console.print(f"{str(lm.dtype).removeprefix('torch.')}, {curve_source(lm)}", style="dim", highlight=False)
    views = token_views(lm.vocab.token_bytes, result.token_ids, result.sources)
    if explain:
        console.print("\n[bold]output tokens by how they were produced:[/bold]")
        console.print(to_rich(views))
        console.print(legend_rich(views))
    if html:
        Path(html).write_text(explain_html(f"structspec demo: {lm.name}", views), encoding="utf-8")
        console.print(f"token view written to {html}")
    console.print(f"\n{DEMO_NOTE}", style="dim", highlight=False)
    return 0


def run(args: argparse.Namespace) -> int:
    """``structspec demo``: load the model (a status line unless ``--quiet``), then `demo`."""
    from rich.console import Console

    console = Console()
    if args.quiet:
        lm = load_model(args)
    else:
        first = "the first run converts its GGUF: ~20 s for SmolLM2-135M, a minute or two for Qwen2.5-Coder-0.5B"
        with console.status(f"loading {args.model} ({first})"):
            lm = load_model(args)
    return demo(lm, console, args.explain, args.html)
