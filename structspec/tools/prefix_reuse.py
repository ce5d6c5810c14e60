"""Seconds per record of an extraction job with and without prefix reuse: the shipped invoices, each prompt the
same instruction and the schema's JSON before the document (what a job's template sends), greedy.

    python -m structspec.tools.prefix_reuse --model qwen2.5-coder-0.5b

Both runs decode the same records on the same loaded model, the second with the model's prefix cache on; the
outputs must be token-identical. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import structspec
from structspec.tools.tasks import example_file

INSTRUCTION = ("You file support tickets for a help desk. Read the ticket below and return it as JSON matching this "
               "schema: the ticket id, the date it was reported (YYYY-MM-DD), the customer, its category and "
               "priority, a one-sentence summary and the components it affects; the product, order number and "
               "whether a refund is asked for only where the ticket says so.\n")


def job_prompts() -> tuple[dict, list[list[dict]]]:
    """The extraction job the benchmarks run: the shipped ticket schema and, for each of the shipped support
    tickets (``examples/tickets.jsonl``), one user message of the same instruction and the schema's JSON before the
    ticket. Reads the files; changes nothing."""
    schema = json.loads(example_file("ticket.schema.json").read_text())
    head = INSTRUCTION + json.dumps(schema, indent=1) + "\n\nTicket:\n"
    lines = example_file("tickets.jsonl").read_text().splitlines()
    return schema, [[{"role": "user", "content": head + json.loads(line)["text"]}] for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Decode the invoices without, then with, prefix reuse; print seconds per record, tokens reused, and whether
    the outputs are identical. Loads and runs a model; prints."""
    parser = argparse.ArgumentParser(prog="python -m structspec.tools.prefix_reuse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a shipped model name or model directory")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    args = parser.parse_args(argv)
    lm = structspec.load(args.model)
    schema, prompts = job_prompts()
    compiled = structspec.compile(schema, lm)
    compiled.result([{"role": "user", "content": "warm-up"}], max_new_tokens=4)
    bound = lm.prefix_cache.max_bytes
    outputs = []
    print(f"{lm.name}, {str(lm.dtype).removeprefix('torch.')}, {len(prompts)} records, "
          f"{sum(len(lm.encode_prompt(p)) for p in prompts)} prompt tokens")
    for label, max_bytes in (("without reuse", 0), ("with reuse", bound)):
        structspec.clear_cache()
        lm.prefix_cache.max_bytes = max_bytes
        start = time.perf_counter()
        results = [compiled.result(p, max_new_tokens=args.max_new_tokens) for p in prompts]
        seconds = (time.perf_counter() - start) / len(prompts)
        outputs.append([r.token_ids for r in results])
        print(f"{label}: {seconds:.2f} s / record, {sum(r.stats.prefix_tokens_reused for r in results)} prompt "
              "tokens reused")
    print(f"token-identical: {outputs[0] == outputs[1]}")
    return 0 if outputs[0] == outputs[1] else 1


if __name__ == "__main__":
    sys.exit(main())
