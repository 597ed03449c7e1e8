"""What each decoder layer stores per request: layer kinds, KV dtypes, exact bytes.

A model is a sequence of layers, each of one kind (DESIGN.md "Hybrid models: what each
layer stores"; README, same section):

- :class:`FullAttention`: K and V of every token (``2 x kv_heads x head_dim`` values);
- :class:`SlidingWindow` ``W``: the same per token, for the last ``W`` tokens only;
- :class:`ChunkedLocal` ``C``: the same, for the tokens of the current ``C``-token chunk;
- :class:`LatentAttention` (MLA): one latent of ``latent_dim`` values per token
  (DeepSeek-V3: ``kv_lora_rank + qk_rope_head_dim`` = 512 + 64);
- :class:`RecurrentState`: a fixed state per request, whatever its length (Mamba, Mamba-2,
  Gated DeltaNet: a convolution window and an SSM/recurrent state; :func:`mamba_state_bytes`,
  :func:`mamba2_state_bytes`, :func:`gated_deltanet_state_bytes`);
- :class:`SharedKV`: reuses another layer's KV (cross-layer KV sharing), stores nothing;
- :class:`NoMixer`: no token mixing (Nemotron-H's MLP-only layers), stores nothing.

A pattern is data: runs of ``(kind, count)`` repeated to the model's layer count
(:func:`expand`, e.g. Gemma 3's "5 local : 1 global" as ``((SlidingWindow(1024), 5),
(FullAttention(), 1))`` over 62 layers), or one character a layer (:func:`from_codes`, as
Nemotron-H's ``hybrid_override_pattern``).

Bytes. A request of ``t`` tokens holds, summed over layers (:func:`request_kv_bytes`)::

    full:  t x token_bytes            window W: min(t, W) x token_bytes
    chunk C: ((t - 1) mod C + 1) x token_bytes  (the current chunk; 0 when t = 0)
    MLA:   t x latent bytes           state:    state_bytes (fixed, once t > 0)
    shared, no mixer: 0

``token_bytes`` of an attention layer is ``2 x kv_heads x`` the KV dtype's bytes for
``head_dim`` values (:meth:`KVDtype.vector_bytes`), of an MLA layer the dtype's bytes for
``latent_dim`` values. What today's allocators charge is :func:`naive_bytes_per_token`:
every layer counted as a layer that keeps every token (a state, window, chunked, shared or
MLP-only layer as a full-attention layer of the model's heads): the over-count other
simulators make, kept as the baseline.

Plain Python (no numpy, simpy or pydantic): ``gpu_validation`` may import the cost model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# --- KV dtypes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVDtype:
    """How the KV cache stores one value (vLLM's engine argument ``kv_cache_dtype``).

    ``bits`` per value; ``group``: values sharing one scale and one zero point stored next to
    them (0: no per-group scales in the cache); ``scale_bytes``: bytes of each scale and each
    zero point.

    - ``bf16`` / ``fp16``: 2 bytes a value.
    - ``fp8`` (E4M3/E5M2): 1 byte a value. vLLM keeps per-tensor scales (one K and one V
      scale per attention layer; per-head scales with calibrated checkpoints) with the layer's
      weights, not in the cache blocks (docs.vllm.ai, "Quantized KV Cache": per-tensor
      ``k/v_scale = [1]``, per-attention-head ``[num_kv_heads]``): a few floats per layer,
      not counted.
    - ``int4``: LMDeploy's online KV quantization (lmdeploy.readthedocs.io, "INT4/INT8 KV
      Cache", v0.13: "asymmetric quantization ... applied on a per-head, per-token basis"), so
      a group is one head's ``head_dim`` values of one token (``group = 0``: the whole vector),
      with one scale and one zero point beside the 4-bit values. Their dtype is not stated
      there: taken as fp16, 2 bytes each (an assumption). vLLM has no int4 KV cache.
    """

    name: str
    bits: int
    group: int = 0  # 0: one scale + zero point per vector (per head, per token), if scale_bytes
    scale_bytes: int = 0

    def vector_bytes(self, values: int) -> int:
        """Bytes of one stored vector of ``values`` values (one KV head of one token, or one
        MLA latent): packed values, rounded up to whole bytes, plus each group's scale and zero
        point."""
        packed = math.ceil(values * self.bits / 8)
        if not self.scale_bytes:
            return packed
        groups = 1 if self.group == 0 else math.ceil(values / self.group)
        return packed + groups * 2 * self.scale_bytes


KV_DTYPES: dict[str, KVDtype] = {
    "bf16": KVDtype("bf16", 16),
    "fp16": KVDtype("fp16", 16),
    "fp8": KVDtype("fp8", 8),
    "int4": KVDtype("int4", 4, group=0, scale_bytes=2),
}
"""The KV dtypes kvsim knows (``model.kv_cache_dtype``; ``auto``: the model's own dtype)."""


def model_kv_dtype(dtype_bytes: int) -> KVDtype:
    """The KV dtype ``auto`` means: the model's weights' dtype (vLLM's ``kv_cache_dtype:
    auto``); 2 bytes is bf16/fp16, anything else a plain ``dtype_bytes``-byte value."""
    return KV_DTYPES["bf16"] if dtype_bytes == 2 else KVDtype(f"{8 * dtype_bytes}-bit", 8 * dtype_bytes)


# --- layer kinds ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FullAttention:
    """Keeps K and V of every token."""

    code = "full"


@dataclass(frozen=True)
class SlidingWindow:
    """Attends to (and keeps) the last ``window`` tokens."""

    window: int  # tokens
    code = "window"


@dataclass(frozen=True)
class ChunkedLocal:
    """Attends within ``chunk``-token chunks (Llama 4's local layers): keeps the current chunk."""

    chunk: int  # tokens
    code = "chunked"


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention: one ``latent_dim``-value latent per token (K and V are
    projected from it), in the KV dtype."""

    latent_dim: int  # values per token per layer (kv_lora_rank + qk_rope_head_dim)
    code = "mla"


@dataclass(frozen=True)
class RecurrentState:
    """A fixed state per request (linear attention, Mamba): ``state_bytes`` bytes, any length."""

    state_bytes: int  # bytes per request per layer
    code = "state"


@dataclass(frozen=True)
class SharedKV:
    """Reads layer ``source``'s KV (cross-layer KV sharing); stores nothing of its own."""

    source: int  # index of the layer whose KV it reads
    code = "shared"


@dataclass(frozen=True)
class NoMixer:
    """A layer without token mixing (an MLP-only layer): stores nothing."""

    code = "none"


LayerKind = FullAttention | SlidingWindow | ChunkedLocal | LatentAttention | RecurrentState | SharedKV | NoMixer
PER_TOKEN_KINDS = (FullAttention, SlidingWindow, ChunkedLocal, LatentAttention)


class LayerPatternError(ValueError):
    """A layer pattern that cannot describe a model (one line, says what is allowed)."""


def expand(runs: Sequence[tuple[LayerKind, int]], num_layers: int, repeat: bool = True) -> tuple[LayerKind, ...]:
    """Per-layer kinds from runs of ``(kind, count)``: the runs in order, repeated (``repeat``)
    and cut at ``num_layers`` layers; without ``repeat`` they must add up to ``num_layers``."""
    if not runs:
        raise LayerPatternError("the pattern has no layers: give at least one run of (kind, count)")
    period: list[LayerKind] = []
    for kind, count in runs:
        if count < 1:
            raise LayerPatternError(f"a run of {count} layers: each run has at least 1 layer")
        period += [kind] * count
    if not repeat and len(period) != num_layers:
        raise LayerPatternError(f"the pattern has {len(period)} layers but the model {num_layers}: "
                                "make them equal, or repeat the pattern")
    layers = tuple(period[i % len(period)] for i in range(num_layers))
    validate(layers)
    return layers


def from_codes(codes: str, legend: dict[str, LayerKind]) -> tuple[LayerKind, ...]:
    """Per-layer kinds from one character a layer (Nemotron-H's ``hybrid_override_pattern``:
    ``M`` Mamba-2, ``*`` attention, ``-`` MLP)."""
    unknown = sorted(set(codes) - set(legend))
    if unknown:
        raise LayerPatternError(f"layer codes {unknown} are not in the legend {sorted(legend)}")
    layers = tuple(legend[c] for c in codes)
    validate(layers)
    return layers


def validate(layers: Sequence[LayerKind]) -> None:
    """Windows, chunks, latents and states are positive; a shared layer reads an earlier layer
    that stores per-token KV itself."""
    for i, kind in enumerate(layers):
        if isinstance(kind, SlidingWindow) and kind.window < 1:
            raise LayerPatternError(f"layer {i}: sliding window of {kind.window} tokens; give at least 1")
        if isinstance(kind, ChunkedLocal) and kind.chunk < 1:
            raise LayerPatternError(f"layer {i}: chunk of {kind.chunk} tokens; give at least 1")
        if isinstance(kind, LatentAttention) and kind.latent_dim < 1:
            raise LayerPatternError(f"layer {i}: latent of {kind.latent_dim} values; give at least 1")
        if isinstance(kind, RecurrentState) and kind.state_bytes < 1:
            raise LayerPatternError(f"layer {i}: state of {kind.state_bytes} bytes; give at least 1")
        if isinstance(kind, SharedKV):
            if not 0 <= kind.source < i:
                raise LayerPatternError(f"layer {i} shares the KV of layer {kind.source}: it must be an "
                                        f"earlier layer (0 to {i - 1})")
            if not isinstance(layers[kind.source], PER_TOKEN_KINDS):
                raise LayerPatternError(f"layer {i} shares the KV of layer {kind.source}, which stores no KV "
                                        "of its own (a state, shared or MLP-only layer)")


def counts(layers: Iterable[LayerKind]) -> dict[str, int]:
    """Layers of each kind, by ``code`` (for reports)."""
    out: dict[str, int] = {}
    for kind in layers:
        out[kind.code] = out.get(kind.code, 0) + 1
    return out


# --- state sizes (bytes per request per layer) ----------------------------------------------


def mamba_state_bytes(d_inner: int, d_state: int, d_conv: int, conv_bytes: int = 2, ssm_bytes: int = 2) -> int:
    """Mamba (1): a causal convolution window of ``d_conv - 1`` inputs of ``d_inner`` channels,
    and an SSM state of ``d_inner x d_state`` (Gu & Dao 2023, "Mamba"). Bytes of each in ``conv_bytes`` / ``ssm_bytes`` per value."""
    return (d_conv - 1) * d_inner * conv_bytes + d_inner * d_state * ssm_bytes


def mamba2_state_bytes(num_heads: int, head_dim: int, d_state: int, n_groups: int, d_conv: int,
                       conv_bytes: int = 2, ssm_bytes: int = 2) -> int:
    """Mamba-2: the convolution runs over ``x, B, C`` (``num_heads x head_dim + 2 x n_groups x
    d_state`` channels) for ``d_conv - 1`` inputs; the SSM state is ``num_heads x head_dim x
    d_state`` (Dao & Gu 2024, "Transformers are SSMs")."""
    conv_channels = num_heads * head_dim + 2 * n_groups * d_state
    return (d_conv - 1) * conv_channels * conv_bytes + num_heads * head_dim * d_state * ssm_bytes


def gated_deltanet_state_bytes(num_key_heads: int, num_value_heads: int, key_head_dim: int, value_head_dim: int,
                               d_conv: int, conv_bytes: int = 2, ssm_bytes: int = 2) -> int:
    """Gated DeltaNet (Qwen3-Next's linear attention): the short convolution over ``q, k, v``
    (``2 x key heads x key_head_dim + value heads x value_head_dim`` channels) for ``d_conv - 1``
    inputs, and one ``key_head_dim x value_head_dim`` matrix per value head (Yang et al. 2025,
    "Gated Delta Networks")."""
    conv_channels = 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim
    return ((d_conv - 1) * conv_channels * conv_bytes
            + num_value_heads * key_head_dim * value_head_dim * ssm_bytes)


# --- bytes ----------------------------------------------------------------------------------


def attention_token_bytes(kv_heads: int, head_dim: int, dtype: KVDtype) -> int:
    """Bytes one token's K and V take in one attention layer: ``2 x kv_heads`` vectors of
    ``head_dim`` values in ``dtype``."""
    return 2 * kv_heads * dtype.vector_bytes(head_dim)


def layer_token_bytes(kind: LayerKind, kv_heads: int, head_dim: int, dtype: KVDtype) -> int:
    """Bytes one kept token takes in a layer of ``kind`` (0: the layer keeps no tokens)."""
    if isinstance(kind, LatentAttention):
        return dtype.vector_bytes(kind.latent_dim)
    if isinstance(kind, FullAttention | SlidingWindow | ChunkedLocal):
        return attention_token_bytes(kv_heads, head_dim, dtype)
    return 0


def tokens_kept(kind: LayerKind, tokens: int) -> int:
    """Tokens whose KV a layer of ``kind`` holds for a request of ``tokens`` tokens (the KV the
    next token's attention reads, the last token's own included)."""
    if tokens <= 0:
        return 0
    if isinstance(kind, FullAttention | LatentAttention):
        return tokens
    if isinstance(kind, SlidingWindow):
        return min(tokens, kind.window)
    if isinstance(kind, ChunkedLocal):
        return (tokens - 1) % kind.chunk + 1
    return 0


def request_kv_bytes(layers: Sequence[LayerKind], tokens: int, kv_heads: int, head_dim: int,
                     dtype: KVDtype) -> int:
    """Bytes a request of ``tokens`` tokens holds, exactly, summed over ``layers`` (all KV
    heads; one GPU's share is the same with that GPU's ``kv_heads``)."""
    total = 0
    for kind in layers:
        if isinstance(kind, RecurrentState):
            total += kind.state_bytes if tokens > 0 else 0
        else:
            total += tokens_kept(kind, tokens) * layer_token_bytes(kind, kv_heads, head_dim, dtype)
    return total


def naive_bytes_per_token(layers: Sequence[LayerKind], kv_heads: int, head_dim: int, dtype: KVDtype) -> int:
    """Bytes per token when every layer keeps every token: MLA layers their latent, every other
    layer (window, chunked, state, shared, MLP-only included) a full-attention layer's K and V.
    What kvsim's allocators charge today (``ModelSpec.kv_bytes_per_token``)."""
    full = attention_token_bytes(kv_heads, head_dim, dtype)
    return sum(dtype.vector_bytes(k.latent_dim) if isinstance(k, LatentAttention) else full for k in layers)
