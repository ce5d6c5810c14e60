"""What a generation returns: the value, its tokens, why it stopped, and typed stats."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from structspec.errors import ToolError

StopReason = Literal["eos", "fsm_complete", "max_new_tokens", "max_context", "invalid", "error"]
"""``eos``: the model chose EOS in a final state; ``fsm_complete``: the FSM allowed nothing but EOS;
``max_new_tokens``: the budget ran out first; ``max_context``: the model's context filled up first (in
both, the output is a valid prefix, not a value); ``invalid``: the output is complete but its validator
rejected it (`InvalidOutput` in ``Result.error``); ``error``: the output could not go on or the row could not run
(``Result.error``: the `UnspellableError` of a state the vocabulary cannot spell on from, alone or in a batch,
or a batch row's bad prompt or spec)."""


@dataclass
class DraftStats:
    """One source of draft tokens: a drafter by name, or "forced" for forced text the target verified."""

    drafted: int = 0  # tokens proposed and sent to verification
    accepted: int = 0
    verify_passes: int = 0  # target passes that verified at least one of its tokens
    draft_passes: int = 0  # the drafter's own forward passes (0 for prompt lookup and forced text)
    seconds: float = 0.0  # inside the drafter

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)

    @property
    def mean_accepted(self) -> float:
        """Accepted tokens per target pass that verified some of this source's tokens."""
        return self.accepted / max(self.verify_passes, 1)


@dataclass
class Stats:
    """Exact counts of one generation; benchmarks and reports read these, nothing else."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    target_forward_passes: int = 0  # passes that chose output tokens (a batched row's prefill is apart)
    # the pass that fed the prompt before the first choosing pass (batched rows; single rows where LM.prefills_apart)
    prefill_passes: int = 0
    # prompt tokens whose KV was reused: whole chunks held from earlier prompts (`structspec.models.prefix_cache`),
    # or a batch's shared prefix of one spec's prompts (models that are not batch-invariant)
    prefix_tokens_reused: int = 0
    tokens_fed: list[int] = field(default_factory=list)  # tokens fed to the target, per pass
    tree_nodes: int = 0  # drafted tokens fed in token-tree passes, every branch counted (in tokens_fed too)
    model_seconds: float = 0.0  # inside the target's forward passes
    constraint_seconds: float = 0.0  # masking, token choice, FSM bookkeeping
    compile_seconds: float = 0.0
    compile_source: str = ""  # "compiled", "memory" or "disk"
    forced_tokens: int = 0  # forced text: appended by fast-forward or spliced into a draft and accepted
    forced_bytes: int = 0
    model_tokens: int = 0  # chosen by the target itself: neither forced nor an accepted draft
    drafts: dict[str, DraftStats] = field(default_factory=dict)  # per draft source
    dtype: str = ""  # the target model's dtype ("float32", "bfloat16", ...)
    # whether the model's passes give each row the logits it gets alone (`LM.batch_invariant`): then batched and
    # accelerated decoding are token-identical to plain masked decoding; else up to near-ties in float rounding
    batch_invariant: bool = False

    @property
    def draft_passes(self) -> int:
        return sum(d.draft_passes for d in self.drafts.values())

    @property
    def draft_seconds(self) -> float:
        return sum(d.seconds for d in self.drafts.values())

    @property
    def model_token_share(self) -> float:
        """Share of output tokens the target chose itself (1.0 without fast-forward or drafting)."""
        return self.model_tokens / max(self.output_tokens, 1)

    @property
    def passes_per_token(self) -> float:
        """Target forward passes per output token (1.0 for one pass per token)."""
        return self.target_forward_passes / max(self.output_tokens, 1)

    @property
    def constraint_seconds_per_pass(self) -> float:
        return self.constraint_seconds / max(self.target_forward_passes, 1)

    @property
    def model_seconds_per_pass(self) -> float:
        return self.model_seconds / max(self.target_forward_passes, 1)


@dataclass
class Result:
    """A finished generation: ``value`` is the parsed, validated output, or None when ``stop_reason``
    says the output is incomplete (``text``, ``token_ids`` and ``stats`` are kept either way)."""

    value: Any
    text: str
    token_ids: list[int]
    stop_reason: StopReason
    stats: Stats
    sources: list[str] = field(default_factory=list)  # per token: "forced", "model" or a drafter's name
    error: Exception | None = None  # the `StructspecError` of stop_reason "invalid" or "error"
    logprobs: list[float] | None = None  # per token, with output_logprobs=True: see `generate_result`
    thinking: str | None = None  # a `Reasoning` spec's thinking text (the value is the answer's)

    @property
    def complete(self) -> bool:
        """Whether the output is a whole value of the spec (``value`` is set)."""
        return self.stop_reason in ("eos", "fsm_complete")


def no_pass_tokens(sources: list[str]) -> int:
    """How many tokens needed no forward pass of their own: every source but ``model``."""
    return sum(s != "model" for s in sources)


@dataclass(frozen=True)
class TextChunk:
    """Tokens one turn accepted (a forced or drafted run arrives as one chunk) and their text.

    ``text`` ends at the last complete character; bytes of a character split
    across tokens arrive with the next chunk (``text`` may be empty), so the
    chunks' texts concatenate to ``Result.text``. When the budget cuts a
    character short, a last chunk without tokens carries its replacement
    character, as ``Result.text`` does.
    """

    text: str
    token_ids: list[int]
    sources: list[str]  # per token: "forced", "model" or a drafter's name


@dataclass(frozen=True)
class FieldDone:
    """A top-level JSON object member whose value just closed: its name, its value as parsed JSON (before the
    spec's validator), and the output text up to and including the ``,`` or ``}`` that closed it."""

    name: str
    value: Any
    text_so_far: str


@dataclass(frozen=True)
class ToolCall:
    """A finished call: the tool's name and its arguments, validated (a Pydantic instance where the tool was a
    model or a function, a dict for a JSON Schema tool)."""

    name: str
    arguments: Any

    def keywords(self) -> dict[str, Any]:
        """The arguments as keyword arguments for the tool's Python function: a Pydantic instance's fields by
        their aliases (so a typed function's parameters by their own names, ``_x`` and ``model_config`` too),
        values as validated (nested models stay models); a dict as it is. Changes nothing."""
        fields = getattr(type(self.arguments), "model_fields", None)
        if fields is None:
            return dict(self.arguments)
        return {info.alias or name: getattr(self.arguments, name) for name, info in fields.items()}

    def json_arguments(self) -> dict[str, Any]:
        """The arguments as JSON values (a Pydantic instance dumped by alias), as a chat message carries them.
        Changes nothing."""
        dump = getattr(self.arguments, "model_dump", None)
        return dump(mode="json", by_alias=True) if dump is not None else dict(self.arguments)


@dataclass(frozen=True)
class ToolCallsValue:
    """`ToolCalls`' value: the free text before the calls and the calls, in order (an ``auto`` turn's bare calls,
    written without the markers where the turn opens, among them: ``bare_calls``). ``unmarked_calls``: calls to
    the given tools that an ``auto`` turn wrote in its free text without the markers (JSON after some text, or
    any with ``bare_calls=False``); they are not in ``calls``, and parsing such a turn warns (`UserWarning`).

    The next turn of the conversation::

        messages.append(turn.assistant_message())
        messages += turn.run([get_weather, send_email])   # the tool messages, one per call
    """

    text: str
    calls: list[ToolCall] = field(default_factory=list)
    unmarked_calls: list[ToolCall] = field(default_factory=list)

    def call_ids(self) -> list[str]:
        """An id per call (``call_`` and 9 hex digits of the turn's text and the call's place): the same turn gets
        the same ids, and `tool_messages` links each result to its call by it. Changes nothing."""
        return [f"call_{hashlib.sha256(f'{i}:{self.text}:{c}'.encode()).hexdigest()[:9]}"
                for i, c in enumerate(self.calls)]

    def assistant_message(self) -> dict[str, Any]:
        """The turn as the assistant message of the next prompt, in the OpenAI shape chat templates take:
        ``content`` (the text) and ``tool_calls`` (each ``{"id", "type": "function", "function": {"name",
        "arguments"}}``, the arguments a dict as transformers' templates read them; ``json.dumps`` them for
        OpenAI's API, which takes a string). Changes nothing."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.calls:
            message["tool_calls"] = [{"id": i, "type": "function", "function": {
                "name": c.name, "arguments": c.json_arguments()}} for i, c in zip(self.call_ids(), self.calls)]
        return message

    def tool_messages(self, results: list[Any]) -> list[dict[str, Any]]:
        """The ``tool`` messages that answer the calls, ``results[i]`` answering ``calls[i]``: a str as it is,
        anything else as JSON (a Pydantic instance dumped; what JSON cannot hold, as its str). Changes nothing."""
        if len(results) != len(self.calls):
            raise ToolError(f"{len(results)} results for {len(self.calls)} calls: pass one result per call")
        return [{"role": "tool", "tool_call_id": i, "name": c.name, "content": _content(r)}
                for i, c, r in zip(self.call_ids(), self.calls, results)]

    def run(self, functions: Mapping[str, Callable[..., Any]] | Iterable[Callable[..., Any]]) -> list[dict[str, Any]]:
        """Call each call's Python function with its validated arguments as keywords (`ToolCall.keywords`), in
        order, and return the `tool_messages` of what they return. ``functions``: a dict of tool name to
        function, or functions named as their tools (the list given to `ToolCalls`; its models and dicts are
        skipped). Runs the functions, which may change anything; an exception of a function propagates.
        `ToolError` before any call runs where a call's tool has no function."""
        named = dict(functions) if isinstance(functions, Mapping) else {
            f.__name__: f for f in functions if inspect.isfunction(f) or inspect.ismethod(f)}
        if missing := sorted({c.name for c in self.calls} - set(named)):
            raise ToolError(f"no function for the tool {missing[0]!r}: pass it in functions, by name "
                            f"({{{missing[0]!r}: function}}) or as a function of that name")
        return self.tool_messages([named[c.name](**c.keywords()) for c in self.calls])


def _content(result: Any) -> str:
    """A tool's result as a message's content: a str as it is, anything else as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, default=lambda o: o.model_dump(mode="json") if hasattr(
        o, "model_dump") else str(o))


@dataclass(frozen=True)
class CallDone:
    """A stream event of a `ToolCalls` spec: a tool call whose end marker was just written, its arguments
    validated, and the output text up to that marker."""

    call: ToolCall
    text_so_far: str


@dataclass(frozen=True)
class Finished:
    """The last event of a stream, whatever the stop reason."""

    result: Result


StreamEvent = Union[TextChunk, FieldDone, CallDone, Finished]
"""What `structspec.stream` yields: chunks and field events as they happen, then one `Finished`."""
