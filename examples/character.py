"""The Character example from the guided-generation literature, on SmolLM2-135M (README: on Qwen).

Prints the object and, for plain masked decoding, exact fast-forward and exact
fast-forward with prompt lookup or lookahead decoding, how many target forward passes it took: the field
names, punctuation and the rest of each enum value after its first letters cost no
pass of their own (``exact`` appends single-choice tokens and verifies the rest of
the forced text in the next pass).

    python examples/character.py
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field, constr
from rich.console import Console
from rich.table import Table

import structspec


class Armor(str, Enum):
    leather = "leather"
    chainmail = "chainmail"
    plate = "plate"


class Weapon(str, Enum):
    sword = "sword"
    axe = "axe"
    mace = "mace"
    spear = "spear"
    bow = "bow"
    crossbow = "crossbow"


class Character(BaseModel):
    name: constr(max_length=10)
    age: int = Field(ge=0, le=999)  # bounds: unbounded, small models write 1000000… up to the digit bound
    armor: Armor
    weapon: Weapon
    strength: int = Field(ge=0, le=999)


PROMPT = [{"role": "user", "content": "Give me a character description for a fantasy role-playing game, as JSON."}]


def main() -> None:
    lm = structspec.load("smollm2-135m")
    table = Table("mode", "output tokens", "forced tokens", "target passes", "passes/token")
    modes = {"off": {"fast_forward": "off"}, "exact": {"fast_forward": "exact"},
             "exact + prompt lookup": {"fast_forward": "exact", "draft": "prompt_lookup"},
             "exact + lookahead": {"fast_forward": "exact", "draft": "lookahead"}}
    for label, options in modes.items():
        result = structspec.generate_result(lm, Character, PROMPT, max_new_tokens=80, **options)
        s = result.stats
        table.add_row(label, str(s.output_tokens), str(s.forced_tokens), str(s.target_forward_passes),
                      f"{s.passes_per_token:.2f}")
    console = Console()
    console.print(result.value)
    console.print(result.text)
    console.print(table)


if __name__ == "__main__":
    main()
