#!/bin/sh
# An extraction job: every invoice in examples/invoices.jsonl → one JSONL line each, with the
# bounded JSON Schema in examples/invoice.schema.json (examples/schemas.py:Invoice works too).
# Documents are decoded together (8 per pass on the CPU, 32 on CUDA; --batch-size N) and each line is
# written as its document finishes. Interrupt it (Ctrl-C) and run it again: it skips what is already
# in the output. Extra options pass through: ./examples/extract_invoices.sh --device cuda --batch-size 16
set -e
cd "$(dirname "$0")/.."
.venv/bin/structspec extract \
    --schema examples/invoice.schema.json \
    --input examples/invoices.jsonl \
    --prompt-template examples/invoice_prompt.txt \
    --output invoices.out.jsonl \
    --max-new-tokens 300 "$@"
