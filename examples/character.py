"""The Character example from the guided-generation literature, on SmolLM2-135M.

Prints the object and, for each fast-forward mode, how many target forward passes
it took: the field names, punctuation and the rest of each enum value after its
first letters cost no pass of their own (``exact`` verifies them in the next pass,
``canonical`` appends them unconditionally).

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
    age: int = Field(json_schema_extra={"maxDigits": 3})  # outlines-core's digit bound: SmolLM2
    armor: Armor                                            # otherwise writes 1000000… forever
    weapon: Weapon
    strength: int = Field(json_schema_extra={"maxDigits": 3})


PROMPT = [{"role": "user", "content": "Give me a character description for a fantasy role-playing game, as JSON."}]


def main() -> None:
    lm = structspec.load("smollm2-135m")
    table = Table("fast_forward", "output tokens", "forced tokens", "target passes", "passes/token")
    for mode in ("off", "exact", "canonical"):
        result = structspec.generate_result(lm, Character, PROMPT, max_new_tokens=80, fast_forward=mode)
        s = result.stats
        table.add_row(mode, str(s.output_tokens), str(s.forced_tokens), str(s.target_forward_passes),
                      f"{s.passes_per_token:.2f}")
    console = Console()
    console.print(result.value)
    console.print(result.text)
    console.print(table)


if __name__ == "__main__":
    main()
