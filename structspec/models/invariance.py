"""Batch invariance: passes that give each row the logits it gets alone (`make_batch_invariant`), by linear layers
fed rows in measured-invariant chunks (prepacked once for oneDNN on the CPU) and attention one query row at a time
over exactly the keys it sees (a transformers attention implementation, `use_attention_by_row`).

torch's default CPU path for ``nn.Linear`` is MKL's sgemm, which on AMD CPUs
takes a slow route for the few-row products of decoding: measured on a 2-core
AVX2 EPYC with Qwen2.5-Coder-0.5B, a 2-token pass cost 2.2× a 1-token pass and
16 tokens 2.9× (README "Kernels"). oneDNN with the weight reordered once into
its blocked layout runs the same products at 1.4× and 2.25×, and a 1-token step
in 0.73× the time, so a verify pass of a drafted candidate costs far less than
the steps it saves. `load` packs float32 CPU models this way; every pass of
the model (structspec's, and transformers' ``generate`` on the same model)
then runs these kernels. A packed model is for inference only.

Speculative verification is lossless, and a batched row equal to the row decoded
alone, only if a pass computes each row exactly as that row's own one-token step
would, whatever else the pass feeds ("batch invariance"). Few kernels are: torch's
own linear changes a row's sums with the row count (float32 and bfloat16), oneDNN
multiplies one row by a long inner dimension with another kernel than two or more,
and attention over k queries, or over a slot cache with holes and padding, sums in
another order than one query over exactly its keys. So every linear layer becomes
a `RowLinear` that feeds its kernel rows in the chunks `measure_invariance` found
invariant for its weight shape (any count up to 64, so a pass is one call, else up
to 16; a lone row padded to two; or one row per call), and `attention_by_row` runs
one query row per call over exactly the keys it sees, gathered, as the one-token
step does: a pass then equals its steps, and a batch row its row alone, bit for
bit, in every dtype. A prompt's prefill (more than `WHOLE_ROWS` rows) runs whole: every decode path prefills a
prompt the same way. The measurement holds for the thread count it ran under.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from structspec.errors import OptionError
from structspec.models.device import native_bf16


WHOLE_ROWS = 64
"""A call of more rows than this is a prompt's prefill, run whole: every decode path prefills a prompt the same way
(its tokens but the last, in one pass on an empty cache), so no per-row invariance is needed there; passes that
choose tokens are capped below it (`INVARIANT_TOKENS`)."""
SMALL_CALL = 16
"""The largest call a layer is fed where calls of `WHOLE_ROWS` rows are not invariant (`measure_invariance`)."""
INVARIANT_TOKENS = 64
"""Batch-invariant bfloat16 on an AVX-512 BF16 CPU, Qwen2.5-Coder-0.5B: a pass of up to 64 tokens gave each
position the logits of one-token steps bit for bit, one of 65 did not (a lookahead tree of 87 nodes turned a
0.125 margin into a tie)."""
BY_ROW = "structspec_by_row"  # attention by row's name in transformers' registry (`use_attention_by_row`)

Invariance = Literal["any", "pad", "one"]  # every row count agrees / a lone row padded to two / one row per call


class RowLinear(torch.nn.Module):
    """``nn.Linear`` whose every row gets the result it gets alone, whatever shares the call: rows go to the kernel
    in chunks of at most ``most``, as `measure_invariance` found the kernel invariant for this shape. Inference only:
    its forward never records a graph. Subclasses give the kernel (`_product`)."""

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        self.weight = linear.weight if keep_weight else None
        self.invariance: Invariance = "any"  # how rows go to the kernel (`measure_invariance`)
        self.most = SMALL_CALL  # the largest call `measure_invariance` found invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # With autograd on, oneDNN plans a training pass, and for one row it falls back to its reference
        # kernel (seconds per pass); no caller needs a gradient through these layers.
        with torch.no_grad():
            flat = x.reshape(-1, self.in_features)
            if len(flat) > WHOLE_ROWS:
                return self._product(x)
            size = 1 if self.invariance == "one" else self.most
            chunks = [self._chunk(flat[i:i + size]) for i in range(0, len(flat), size)]
            out = chunks[0] if len(chunks) == 1 else torch.cat(chunks)  # one call (a pass, mostly): no copy
            return out.reshape(*x.shape[:-1], self.out_features)

    def _chunk(self, rows: torch.Tensor) -> torch.Tensor:
        if self.invariance == "pad" and len(rows) == 1:  # the many-row kernel, on the row and a zero row
            return self._product(torch.cat([rows, rows.new_zeros(1, self.in_features)]))[:1]
        return self._product(rows)

    kernel_weight: torch.Tensor  # the weight as the kernel reads it (its dtype and device)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PackedLinear(RowLinear):
    """A `RowLinear` on oneDNN, its weight reordered once into oneDNN's blocked layout. ``weight`` stays the
    original (dense) parameter only where other code reads it (the LM head: its rows for a restricted set of
    ids, and tied input embeddings); elsewhere the dense copy is freed."""

    def __init__(self, linear: torch.nn.Linear, keep_weight: bool = False) -> None:
        super().__init__(linear, keep_weight)
        self.packed = self.kernel_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class TorchLinear(RowLinear):
    """A `RowLinear` on torch's own kernel (``F.linear``, the dense weight kept): for a dtype oneDNN would only
    emulate (bfloat16 on a CPU without AVX-512 BF16), or a device it does not serve. It feeds one row per call:
    a measurement does not hold for torch's emulated bfloat16 product (on SmolLM2, a row padded to two and the
    same row beside another parted on real activations where `invariant_by`'s inputs agreed)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__(linear, keep_weight=True)
        self.kernel_weight = linear.weight

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


def invariant_by(layer: RowLinear, most: int, weight: torch.Tensor | None = None) -> Invariance:
    """How ``layer``'s products stay row-invariant (each row's result independent of how many rows share the
    call): ``"any"`` where products of 1 to ``most`` rows agree bit for bit; ``"pad"`` where those of 2 to
    ``most`` agree with a row padded to two; else ``"one"``. Inputs span 24 binary orders of magnitude, so
    another summation order shows after rounding; the kernel is chosen by shape (and thread count), not values.
    In a dtype narrower than float32 the output's rounding hides most order differences, so there, given the
    layer's dense ``weight``, the inputs are `cancelling_rows` instead, whose results show them.
    Runs the layer 2 × ``most`` times, 3 × where one row's kernel differs; changes nothing."""
    generator = torch.Generator().manual_seed(0)
    dtype = layer.kernel_weight.dtype
    if weight is not None and torch.finfo(dtype).bits < 32:
        x = cancelling_rows(weight, most, generator)
    else:
        x = torch.randn(most, layer.in_features, generator=generator)
        x = x * torch.exp2(torch.randint(-12, 12, x.shape, generator=generator).float())
    x = x.to(device=layer.kernel_weight.device, dtype=dtype)
    zero = x.new_zeros(1, layer.in_features)
    with torch.no_grad():
        ones = torch.cat([layer._product(x[i:i + 1]) for i in range(most)])
        many = [layer._product(x[:m]) for m in range(2, most + 1)]
        if all(torch.equal(out, ones[:len(out)]) for out in many):
            return "any"
        pairs = torch.cat([layer._product(torch.cat([x[i:i + 1], zero]))[:1] for i in range(most)])
    return "pad" if all(torch.equal(out, pairs[:len(out)]) for out in many) else "one"


def cancelling_rows(weight: torch.Tensor, rows: int, generator: torch.Generator) -> torch.Tensor:
    """``rows`` inputs [rows, in] (float32, exact in ``weight``'s dtype) for a layer of ``weight`` [out, in] whose
    result, rounded to a narrow dtype, shows the order the kernel sums in: row ``r`` holds two large entries at
    far-apart inputs ``k1``, ``k2`` whose products with output ``j``'s weights cancel exactly (``2^16·w[j,k2]·w[j,k1]``
    and its negative: products of two bfloat16 values are exact in float32), among small ones. Summed one way the
    small products are absorbed by a large partial sum; the other way they survive: the output differs by far more
    than its rounding. Changes nothing."""
    out_features, in_features = weight.shape
    w = weight.detach().float().cpu()
    x = torch.randn(rows, in_features, generator=generator) * 2.0**-8
    x = x.to(weight.dtype).float()  # small entries exact in the kernel's dtype
    big = 2.0**16
    for r in range(rows):
        j = int(torch.randint(out_features, (), generator=generator))
        k1, k2 = torch.randperm(in_features, generator=generator)[:2].tolist()
        x[r, k1], x[r, k2] = big * w[j, k2], -big * w[j, k1]
    return x


def measure_invariance(layer: RowLinear, whole: bool = True,
                       weight: torch.Tensor | None = None) -> tuple[Invariance, int]:
    """How ``layer`` is fed (`RowLinear.invariance`, `RowLinear.most`): in calls of up to `WHOLE_ROWS` rows
    where `invariant_by` finds those invariant (``whole``), so a pass of any size is one call, else of up to
    `SMALL_CALL`. Few large calls read the weight less often than many small ones: on a 2-core AVX2 EPYC,
    Qwen2.5-0.5B's MLP layers ran 40–64 rows 1.3–1.45× faster in one call than in chunks of 16. Runs the
    layer; changes nothing."""
    if whole:
        way = invariant_by(layer, WHOLE_ROWS, weight)
        if way != "one":
            return way, WHOLE_ROWS
    return invariant_by(layer, SMALL_CALL, weight), SMALL_CALL


def attention_by_row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None) -> torch.Tensor:
    """Scaled dot-product attention one query row at a time in float32, each as a one-token step computes it:
    query [batch, heads, q, d], key and value [batch, kv heads, t, d] (grouped heads repeat), ``mask`` [batch, 1,
    q, t] (boolean or additive) or None for causal attention over the last ``q`` positions. Returns [batch,
    heads, q, d]; changes nothing.

    Each row of each sequence attends to exactly the keys it sees, gathered and unmasked: a token tree's node
    sees its path's keys, in order, as the one-token steps along that path did, and a batch row its own kept
    slots, without the holes and padding of a slot cache, as the row decoded alone does."""
    q, t = query.shape[2], key.shape[2]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = query.shape[1] != key.shape[1]
    # In float32: on the CPU, SDPA of one bfloat16 query row costs 8× the same row in float32 (0.8 against 0.1 ms
    # over 512 keys, Qwen's 14 heads), so the upcast pays for itself; the result is rounded back.
    out_dtype, query, key, value = query.dtype, query.float(), key.float(), value.float()
    out = []
    for b, seen in enumerate(_seen(mask, query.shape[0], q, t)):
        gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per key group: its keys and values, gathered once
        rows = []
        for i, keys in enumerate(seen):
            if isinstance(keys, slice):
                k, v = key[b:b + 1, :, keys], value[b:b + 1, :, keys]
            else:  # (a group's indices, how many of them): a prefix of keys gathered once for the whole group
                group, n = keys
                if id(group) not in gathered:
                    gathered[id(group)] = key[b:b + 1, :, group], value[b:b + 1, :, group]
                k, v = (x[:, :, :n] for x in gathered[id(group)])
            rows.append(sdpa(query[b:b + 1, :, i:i + 1], k, v, scale=scale, enable_gqa=gqa))
        out.append(rows[0] if q == 1 else torch.cat(rows, dim=2))
    return (out[0] if len(out) == 1 else torch.cat(out)).to(out_dtype)


# the last mask read and its answer, as one tuple (threads swap it whole): every layer of a pass gets the same mask
_LAST_SEEN: list[tuple[Any, Any]] = [(None, None)]


def _seen(mask: torch.Tensor | None, batch: int, q: int, t: int) -> list[list[Any]]:
    """Per sequence and query row, the keys it sees (``mask`` [batch or 1, 1, q or 1, t], boolean or additive, or
    None for causal): a slice where they are a prefix of the cache, else ``(group, n)``: the first ``n`` of a
    group's key indices, where a group is the keys of a run of query rows each seeing the keys of the one before
    and keys after those (a chain's tokens in a row of a packed batch), gathered once per pass and layer.
    Remembers the last mask's answer, so each pass reads its mask once, not once per layer (holds a reference to
    that mask, nothing else)."""
    if mask is None:  # causal over the last q positions
        return [[slice(0, t - q + i + 1) for i in range(q)]] * batch
    last, answer = _LAST_SEEN[0]
    if last is mask:
        return answer
    visible = (mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0).expand(batch, q, t)
    counts = visible.sum(-1)
    prefix = (visible == (torch.arange(t, device=visible.device) < counts[..., None])).all(-1)
    # one read-back for the whole mask; only rows with holes (a tree's nodes, a batch row's rejected drafts, other
    # rows' slots) look up their keys
    seen = []
    for b, (row_counts, row_prefix) in enumerate(zip(counts.tolist(), prefix.tolist())):
        keys: list[Any] = [None] * q
        group = None  # the indices of the run the query after this one belongs to
        for i in reversed(range(q)):  # a run's last query sees all its keys: its indices are the group's
            if row_prefix[i]:
                keys[i], group = slice(0, row_counts[i]), None
                continue
            mine = visible[b, i].nonzero().squeeze(-1)
            n = len(mine)
            if group is None or n > len(group) or not torch.equal(group[:n], mine):
                group = mine
            keys[i] = (group, n)
        seen.append(keys)
    _LAST_SEEN[0] = (mask, seen)
    return seen


KERNELS = ("auto", "onednn", "torch")


def packable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` applies to a model on ``device`` in ``dtype``: float32 on the CPU with a torch
    built with oneDNN, and bfloat16 too where the CPU has a native bfloat16 path (AVX-512 BF16 or AMX; without
    one oneDNN emulates it, slower than torch's own). Changes nothing."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())


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


def pack_linears(model: Any, packed: bool = True) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a `PackedLinear` (``packed``; the output embeddings keep their
    dense weight; each fed rows as its shape's `measure_invariance` says) or a `TorchLinear` (one row per call). Changes
    the model in place; returns how many were replaced."""
    head = model.get_output_embeddings()
    count = 0
    ways: dict[tuple[int, int, torch.dtype], tuple[Invariance, int]] = {}  # per weight shape: the kernel's choice
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                layer = PackedLinear(child, keep_weight=child is head) if packed else TorchLinear(child)
                shape = (layer.in_features, layer.out_features, child.weight.dtype)
                if shape not in ways:
                    # the head (vocabulary-wide) is measured on small calls only: measuring it up to 64 rows
                    # would add seconds to every load (Qwen2.5: 136M weights a row)
                    ways[shape] = (measure_invariance(layer, child is not head, child.weight) if packed
                                   else ("one", 1))
                layer.invariance, layer.most = ways[shape]
                setattr(module, name, layer)
                count += 1
    return count


def make_batch_invariant(model: Any, packed: bool = False) -> None:
    """Make every pass of ``model`` give each row the logits it gets alone (`LM.batch_invariant`), in any dtype:
    each linear layer a `RowLinear` (packed for oneDNN with ``packed``, else on torch's own kernel) and attention
    by row (`use_attention_by_row`), so that a verify pass equals its one-token steps and a batched row the row
    decoded alone, bit for bit. Changes the model in place (inference only); a second call changes nothing."""
    if not any(isinstance(m, RowLinear) for m in model.modules()):
        pack_linears(model, packed)
    use_attention_by_row(model)


def pack_for_cpu(model: Any) -> None:
    """`make_batch_invariant` with ``model``'s linear layers packed for oneDNN. Changes the model in place."""
    make_batch_invariant(model, packed=True)


def use_attention_by_row(model: Any) -> None:
    """Make ``model``'s attention run one query row per call (changes the model): a verify pass over k tokens
    then computes each position as a one-token step does, bit for bit, where SDPA over k rows would not
    (bfloat16 on the CPU)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(BY_ROW, _attention_by_row)
    AttentionMaskInterface.register(BY_ROW, sdpa_mask)  # the masks SDPA gets: None where causal suffices
    model.set_attn_implementation(BY_ROW)


def _attention_by_row(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over `attention_by_row`; a prefill of more than `WHOLE_ROWS` rows goes
    to transformers' SDPA attention whole. Returns [batch, q, heads, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] > WHOLE_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return attention_by_row(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None
