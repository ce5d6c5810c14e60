"""Does speculative sampling keep the target's constrained distribution? Thousands of samples per drafter.

    python -m lab.bench_sampling [--samples 5000]

On a tiny random-weight model with a small language, the exact distribution of
complete outputs under plain masked sampling is enumerated over the token tree;
each method's empirical distribution is compared with it (Pearson chi-square
p-value and total variation distance). Plain masked sampling is the control:
its p-value shows what a correct sampler scores at this sample size.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

import structspec
from structspec.decoding.drafters.factory import SelfDraft, make_drafter
from structspec.decoding.sampling import SamplingConfig
from structspec.testing import chi_square_pvalue, exact_output_distribution, sample_outputs, tiny_lm

SPEC = structspec.Regex(r"(ab|ba|a|b)c{0,2}")
PROMPT = "pick one of ab, bacc, abc, b:"
TEMPERATURE = 1.5


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.bench_sampling",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    args = parser.parse_args(argv)

    target = tiny_lm("byte_level", seed=0)
    fsm = structspec.compile(SPEC, target).fsm
    config = SamplingConfig(do_sample=True, temperature=TEMPERATURE)
    exact = exact_output_distribution(target, fsm, target.encode_prompt(PROMPT), config)
    drafts = {
        "plain masked (control)": None,
        "draft model (other random weights)": tiny_lm("byte_level", seed=7),
        "self-draft, threshold": SelfDraft(threshold=True),
        "prompt lookup": "prompt_lookup",
    }
    table = Table(title=f"{args.samples} samples per method, {len(exact)} possible outputs, T={TEMPERATURE}",
                  title_justify="left")
    for header in ("method", "chi-square p", "total variation", "drafted", "accepted"):
        table.add_column(header, justify="left" if header == "method" else "right")
    for name, draft in drafts.items():
        counts, drafted, accepted = sample_outputs(target, SPEC, PROMPT, make_drafter(draft, target), args.samples,
                                                   TEMPERATURE)
        tv = 0.5 * sum(abs(counts.get(k, 0) / args.samples - p) for k, p in exact.items())
        table.add_row(name, f"{chi_square_pvalue(counts, exact):.3f}", f"{tv:.4f}", f"{drafted:,}", f"{accepted:,}")
    Console().print(table)


if __name__ == "__main__":
    main()
