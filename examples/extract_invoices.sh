#!/bin/sh
# An extraction job: every invoice in examples/invoices.jsonl → one JSONL line each, with the
# bounded JSON Schema in examples/invoice.schema.json (examples/schemas.py:Invoice works too).
# Interrupt it (Ctrl-C) and run it again: it skips what is already in the output.
set -e
cd "$(dirname "$0")/.."
.venv/bin/structspec extract \
    --schema examples/invoice.schema.json \
    --input examples/invoices.jsonl \
    --prompt-template examples/invoice_prompt.txt \
    --output invoices.out.jsonl \
    --max-new-tokens 300 "$@"
