"""The grammar catalogue as package data, installed as ``structspec.grammar_data``; read by `structspec.schema.grammars`."""
