"""CPU matrix kernels: a model's linear layers with their weights prepacked once for oneDNN.

torch's default CPU path for ``nn.Linear`` is MKL's sgemm, which on AMD CPUs
takes a slow route for the few-row products of decoding: measured on a 2-core
AVX2 EPYC with Qwen2.5-Coder-0.5B, a 2-token pass cost 2.2× a 1-token pass and
16 tokens 2.9× (README "Kernels"). oneDNN with the weight reordered once into
its blocked layout runs the same products at 1.4× and 2.25×, and a 1-token step
in 0.73× the time, so a verify pass of a drafted candidate costs far less than
the steps it saves. `load` packs float32 CPU models this way; every pass of
the model (structspec's, and transformers' ``generate`` on the same model)
then runs these kernels. A packed model is for inference only.
"""

from __future__ import annotations

from typing import Any

import torch

from structspec.errors import OptionError


class PackedLinear(torch.nn.Module):
    """``nn.Linear`` with its weight reordered for oneDNN. Inference only: its forward never records a graph.

    ``weight`` stays the original (dense) parameter only where other code reads it (the LM head: its rows
    for a restricted set of ids, and tied input embeddings); elsewhere the dense copy is freed."""

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        self.weight = linear.weight if keep_weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # With autograd on, oneDNN plans a training pass, and for one row it falls back to its reference
        # kernel (seconds per pass); the packed weight has no gradient anyway.
        with torch.no_grad():
            bias = None if self.bias is None else self.bias.detach()
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


KERNELS = ("auto", "onednn", "torch")


def packable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` applies to a model on ``device`` in ``dtype``: float32 on the CPU with a torch
    built with oneDNN, and bfloat16 too where the CPU has a native bfloat16 path (AVX-512 BF16 or AMX; without
    one oneDNN emulates it, slower than torch's own). Changes nothing."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively in oneDNN (AVX-512 BF16 or AMX). Changes nothing."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def should_pack(kernels: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the ``kernels`` option (one of `KERNELS`) packs a model on ``device`` in ``dtype``: ``"auto"``
    where `packable`, ``"onednn"`` always (an `OptionError` where it cannot), ``"torch"`` never. Changes nothing."""
    if kernels not in KERNELS:
        raise OptionError(f"kernels={kernels!r} is not one of {', '.join(KERNELS)}")
    pack = kernels != "torch" and packable(device, dtype)
    if kernels == "onednn" and not pack:
        raise OptionError("kernels='onednn' needs a float32 model on the CPU (or bfloat16 on a CPU with AVX-512 BF16 "
                          "or AMX) and a torch built with oneDNN")
    return pack


def pack_linears(model: Any) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a `PackedLinear` (changes the model in place; the output
    embeddings keep their dense weight). Returns how many were packed."""
    head = model.get_output_embeddings()
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child, keep_weight=child is head))
                count += 1
    return count
