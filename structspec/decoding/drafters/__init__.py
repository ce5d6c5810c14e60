"""The drafters: what proposes tokens for the target to verify, each behind the `Drafter` contracts
(`structspec.decoding.drafter`), and `factory`, which makes one for ``draft=``."""
