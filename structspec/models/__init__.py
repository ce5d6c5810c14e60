"""The model wing: what the decode loop needs of a language model, and the transformers model that provides it.

The loop and the drafters talk to the `protocol.LanguageModel` protocol only; `transformers_lm.LM` is the
Hugging Face adapter. Its KV slot cache for batches, loading, shipped models, devices and the CPU's batch-invariant
passes are modules of their own here.
"""
