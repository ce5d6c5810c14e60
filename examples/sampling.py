"""Sampling: several different outputs that all match the schema, reproducible with a seed.

``temperature``, ``top_k`` and ``top_p`` switch from greedy decoding to sampling
(as in transformers' ``GenerationConfig``); ``seed`` makes a sample repeatable.
Forced tokens never draw from the random generator.

    python examples/sampling.py
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

import structspec


class Pet(BaseModel):
    name: str
    species: Literal["cat", "dog", "rabbit", "parrot"]
    age: int


PROMPT = [{"role": "user", "content": "Invent a pet for a children's story. Answer as JSON with name, species, age."}]


def main() -> None:
    lm = structspec.load("smollm2-135m")
    for seed in range(4):
        pet = structspec.generate(lm, Pet, PROMPT, temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=60)
        print(f"seed {seed}: {pet!r}")
    again = structspec.generate(lm, Pet, PROMPT, temperature=0.9, top_p=0.95, seed=0, max_new_tokens=60)
    print(f"seed 0 again: {again!r}")


if __name__ == "__main__":
    main()
