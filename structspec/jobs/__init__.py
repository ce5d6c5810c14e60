"""Extraction jobs: one spec, many documents, one JSONL line per document."""
