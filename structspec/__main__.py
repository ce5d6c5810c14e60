"""Command line: ``python -m structspec demo``."""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from pydantic import BaseModel
from rich.console import Console

import structspec
from structspec.display import stats_table
from structspec.lm import DEFAULT_MODEL

DEMO_DOCUMENT = (
    "Hi team, please welcome Dr. Maria Okafor, our new Head of Research, who joins us from "
    "Lagos on Monday. She can be reached at maria.okafor@brightlabs.io or +234 801 555 0199."
)


class NewHire(BaseModel):
    """The demo's extraction schema."""

    name: str
    title: str
    city: str
    email: str
    phone: str
    seniority: Literal["junior", "mid", "senior", "executive"]


def demo(model: str) -> int:
    """Extract one record with the shipped default model and show the object and its stats."""
    console = Console()
    with console.status(f"loading {model} (the first run converts its GGUF, ~20 s)"):
        lm = structspec.load(model)
    prompt = [{"role": "user", "content": f"Extract the new hire as JSON.\n\n{DEMO_DOCUMENT}"}]
    result = structspec.generate_result(lm, NewHire, prompt, max_new_tokens=200)
    console.print(f"[bold]document:[/bold] {DEMO_DOCUMENT}\n")
    console.print(result.value)
    console.print(stats_table(result.stats, title=f"{model}, greedy, stop: {result.stop_reason}"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="structspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="one extraction on the shipped default model")
    p_demo.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.model)
    return 2


if __name__ == "__main__":
    sys.exit(main())
