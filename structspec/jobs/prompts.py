"""A job's prompt: the template (``--prompt-template``, or one made from the spec) and one document's prompt."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from structspec.jobs.errors import JobConfigError

if TYPE_CHECKING:  # (these import torch)
    from structspec.models.protocol import Prompt
    from structspec.models.transformers_lm import LM


def default_template(spec: Any) -> str:
    """The instruction used without ``--prompt-template``: name the fields (if any), ask for JSON or the value."""
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        fields = list(spec.model_fields)
    elif isinstance(spec, dict):
        fields = list(spec.get("properties", {}))
    else:
        return "Extract the value from the document.\n\nDocument:\n{document}"
    return f"Extract the following fields from the document as JSON: {', '.join(fields)}.\n\nDocument:\n{{document}}"


def read_template(path: str) -> str:
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise JobConfigError(f"cannot read the prompt template {path}: {e}") from None
    if "{document}" not in template:
        raise JobConfigError(f"the prompt template {path} has no {{document}} placeholder")
    return template


def build_prompt(lm: LM, template: str, document: str) -> Prompt:
    """The template with the document in; one user message when the tokenizer has a chat template."""
    content = template.replace("{document}", document)  # not str.format: templates may hold JSON braces
    return [{"role": "user", "content": content}] if getattr(lm.tokenizer, "chat_template", None) else content
