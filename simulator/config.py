"""Experiment configuration: one YAML file, validated on load, overridable per key.

Errors name the file, the line, the key path and what is allowed, e.g.::

    configs/x.yaml:14: allocator.block_size: must be a power of two from 1 to 256 (got 3)

A schema that cannot be misread:

- ``allocator`` (by ``kind``), ``scheduler`` (by ``policy``) and ``cost_model`` (by ``kind``)
  are variants, one class each: a key the chosen variant would ignore is an error naming the
  variant that reads it, and a resolved config (``results/.../config.yaml``) holds only the
  keys that act, so it loads again.
- Units are in names where a number could be misread: ``_gib`` (2^30 bytes), ``_s``,
  ``_ms``, ``_tokens``. The model's context window is ``model.context_len_tokens``; the
  contiguous allocator's reservation is ``allocator.reserve_tokens``.
- ``engine`` holds switches that change the simulator's speed, never its results.
- A key of an earlier config (``RENAMED``) is an error that names its new name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvsim.policies.ledger.contiguous_allocator import contiguous_preset
from kvsim.simulator.capacity import MemoryBudget, kv_slots, memory_budget
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS, GiB, GPUSpec, ModelSpec
from kvsim.simulator.cost_model.host_time import HostTime, host_preset
from kvsim.simulator.cost_model.interconnect import (
    INTERCONNECT_RULE,
    LinkSpec,
    check_ranks,
    explicit_link,
    interconnect,
)
from kvsim.simulator.cost_model.layers import (
    KV_DTYPES,
    ChunkedLocal,
    FullAttention,
    LatentAttention,
    LayerKind,
    LayerPatternError,
    NoMixer,
    RecurrentState,
    SharedKV,
    SlidingWindow,
    expand,
    gated_deltanet_state_bytes,
    mamba2_state_bytes,
    mamba_state_bytes,
)
from kvsim.simulator.cost_model.moe import ExpertGroup, MoESpec
from kvsim.simulator.cost_model.roofline import (
    RooflineParams,
    default_efficiencies,
    roofline_preset,
)
from kvsim.simulator.outputs import NAME_PATTERN, NAME_RULE  # run and experiment names are slugs
from kvsim.simulator.outputs import check_name as check_name  # also imported from here
from kvsim.simulator.workload import WorkloadConfig, numbers_are_not_booleans
from kvsim.traces.fields import MAX_SPAN_S


class ConfigError(ValueError):
    """A configuration problem, formatted as one line for the user (any line break or run of
    spaces, e.g. from a value the user typed, becomes one space)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = model_validator(mode="before")(numbers_are_not_booleans)


MAX_CONTEXT_TOKENS = 16 * 2**20
"""Longest ``context_len_tokens`` accepted (16 Mi tokens): beyond any published model's window."""


class MoEShapeConfig(Strict):
    """The mixture-of-experts part of ``model.shape`` (Hugging Face config keys in brackets;
    ``simulator.cost_model.moe``). Every expert's weights count in the memory budget."""

    num_experts: int = Field(gt=0, le=4096)  # num_experts / num_local_experts / n_routed_experts
    experts_per_token: int = Field(gt=0, le=4096)  # num_experts_per_tok
    expert_intermediate_size: int = Field(gt=0, le=2**20)  # moe_intermediate_size
    shared_expert_intermediate_size: int = Field(0, ge=0, le=2**20, description="all shared experts together; "
                                                 "0 = none")
    dense_layers: int = Field(0, ge=0, le=1024, description="first layers with a dense MLP of intermediate_size "
                              "(first_k_dense_replace)")
    expert_bytes_per_param: float | None = Field(None, gt=0, le=8, description="bytes of one expert weight when "
                                                 "the experts are stored otherwise than dtype_bytes (MXFP4: 0.53125)")

    @model_validator(mode="after")
    def _k_of_e(self) -> MoEShapeConfig:
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) is more than num_experts "
                             f"({self.num_experts})")
        return self

    def spec(self) -> MoESpec:
        return MoESpec(self.num_experts, self.experts_per_token, self.expert_intermediate_size,
                       self.shared_expert_intermediate_size, self.dense_layers, self.expert_bytes_per_param)


#: each layer kind of ``model.shape.layers.pattern``: the keys it needs, and those it may take
LAYER_KIND_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "full_attention": ((), ()),
    "sliding_window": (("window_tokens",), ()),  # sliding_window
    "chunked_local": (("chunk_tokens",), ()),  # attention_chunk_size
    "mla": (("latent_dim",), ()),  # kv_lora_rank + qk_rope_head_dim
    "mamba": (("d_inner", "d_state", "d_conv"), ("conv_dtype_bytes", "ssm_dtype_bytes")),
    "mamba2": (("num_heads", "head_dim", "d_state", "n_groups", "d_conv"), ("conv_dtype_bytes", "ssm_dtype_bytes")),
    "gated_deltanet": (("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "d_conv"),
                       ("conv_dtype_bytes", "ssm_dtype_bytes")),
    "state": (("state_bytes",), ()),
    "shared_kv": (("source_layer",), ()),
    "mlp": ((), ()),
}


class LayerRunConfig(Strict):
    """``count`` consecutive layers of one ``kind`` (``simulator.cost_model.layers``); each kind
    reads only its own keys (``LAYER_KIND_KEYS``). Sizes are values (``latent_dim``, heads,
    dims), tokens (``*_tokens``) or bytes (``*_bytes``); a state's dtypes default to 2 bytes
    (bf16: vLLM's mamba cache dtype ``auto`` for a bf16 model)."""

    kind: Literal["full_attention", "sliding_window", "chunked_local", "mla", "mamba", "mamba2", "gated_deltanet",
                  "state", "shared_kv", "mlp"]
    count: int = Field(1, ge=1, le=1024)
    window_tokens: int | None = Field(None, ge=1, le=MAX_CONTEXT_TOKENS)
    chunk_tokens: int | None = Field(None, ge=1, le=MAX_CONTEXT_TOKENS)
    latent_dim: int | None = Field(None, ge=1, le=2**16)
    state_bytes: int | None = Field(None, ge=1, le=2**40)
    source_layer: int | None = Field(None, ge=0, le=1023)
    d_inner: int | None = Field(None, ge=1, le=2**20)
    d_state: int | None = Field(None, ge=1, le=2**16)
    d_conv: int | None = Field(None, ge=1, le=64)
    num_heads: int | None = Field(None, ge=1, le=4096)
    head_dim: int | None = Field(None, ge=1, le=4096)
    n_groups: int | None = Field(None, ge=1, le=4096)
    num_key_heads: int | None = Field(None, ge=1, le=4096)
    num_value_heads: int | None = Field(None, ge=1, le=4096)
    key_head_dim: int | None = Field(None, ge=1, le=4096)
    value_head_dim: int | None = Field(None, ge=1, le=4096)
    conv_dtype_bytes: int | None = Field(None, ge=1, le=8)
    ssm_dtype_bytes: int | None = Field(None, ge=1, le=8)

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> LayerRunConfig:
        needs, may = LAYER_KIND_KEYS[self.kind]
        missing = [k for k in needs if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {', '.join(missing)}")
        for key in type(self).model_fields:
            if key in ("kind", "count") or key in needs or key in may or getattr(self, key) is None:
                continue
            readers = [k for k, (n, m) in LAYER_KIND_KEYS.items() if key in n or key in m]
            raise ValueError(f"{key} is read by kind {' / '.join(readers)}, not {self.kind}: remove it")
        return self

    def kind_spec(self) -> LayerKind:
        conv, ssm = self.conv_dtype_bytes or 2, self.ssm_dtype_bytes or 2
        match self.kind:
            case "full_attention":
                return FullAttention()
            case "sliding_window":
                return SlidingWindow(self.window_tokens)
            case "chunked_local":
                return ChunkedLocal(self.chunk_tokens)
            case "mla":
                return LatentAttention(self.latent_dim)
            case "mamba":
                return RecurrentState(mamba_state_bytes(self.d_inner, self.d_state, self.d_conv, conv, ssm))
            case "mamba2":
                return RecurrentState(mamba2_state_bytes(self.num_heads, self.head_dim, self.d_state, self.n_groups,
                                                         self.d_conv, conv, ssm))
            case "gated_deltanet":
                return RecurrentState(gated_deltanet_state_bytes(self.num_key_heads, self.num_value_heads,
                                                                 self.key_head_dim, self.value_head_dim, self.d_conv,
                                                                 conv, ssm))
            case "state":
                return RecurrentState(self.state_bytes)
            case "shared_kv":
                return SharedKV(self.source_layer)
            case _:
                return NoMixer()


class LayersConfig(Strict):
    """What each layer is: ``pattern``, runs of layers in order, repeated (``repeat``) and cut
    at ``num_layers`` — Gemma 3's five local layers then one global is ``[{kind: sliding_window,
    window_tokens: 1024, count: 5}, {kind: full_attention}]``; with ``repeat: false`` the runs
    list every layer and must add up to ``num_layers``."""

    pattern: list[LayerRunConfig] = Field(min_length=1, max_length=1024)
    repeat: bool = True

    def kinds(self, num_layers: int) -> tuple[LayerKind, ...]:
        return expand([(run.kind_spec(), run.count) for run in self.pattern], num_layers, self.repeat)


class ModelShapeConfig(Strict):
    """Any decoder-only transformer by its shape (its Hugging Face config's key in brackets)."""

    # Bounds: a few times the largest published model's (126 layers, hidden 25,600, 128 heads,
    # FFN 73,728, vocabulary 262,144), so a typo of a few digits is an error, not a huge model.
    num_layers: int = Field(gt=0, le=1024)  # num_hidden_layers
    hidden_size: int = Field(gt=0, le=2**17)
    num_heads: int = Field(gt=0, le=1024)  # num_attention_heads
    num_kv_heads: int | None = Field(None, gt=0, le=1024, description="num_key_value_heads; default num_heads")
    head_dim: int | None = Field(None, gt=0, le=4096, description="default hidden_size // num_heads")
    intermediate_size: int = Field(gt=0, le=2**20)
    vocab_size: int = Field(gt=0, le=2**24)
    context_len_tokens: int = Field(gt=0, le=MAX_CONTEXT_TOKENS)  # max_position_embeddings
    gated_ffn: bool = True  # SwiGLU (gate, up, down) vs a 2-matrix MLP
    dtype_bytes: int = Field(2, ge=1, le=8)
    moe: MoEShapeConfig | None = None  # mixture of experts; None: a dense MLP in every layer
    layers: LayersConfig | None = None  # what each layer stores; None: every layer full attention

    @model_validator(mode="after")
    def _layers_fit(self) -> ModelShapeConfig:
        if self.layers is not None:
            try:
                self.layers.kinds(self.num_layers)
            except LayerPatternError as e:
                raise ValueError(f"layers.pattern: {e}") from None
        return self

    @model_validator(mode="after")
    def _dense_layers_fit(self) -> ModelShapeConfig:
        if self.moe is not None and self.moe.dense_layers >= self.num_layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) leaves no MoE layer of num_layers "
                             f"({self.num_layers}): remove moe, or lower dense_layers")
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShapeConfig:
        """Attention splits the hidden size into heads, and query heads into groups per KV head."""
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) does not divide into num_heads ({self.num_heads}) "
                             "heads: give head_dim, or a hidden_size that is a multiple of num_heads")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({kv}): each KV head "
                             "serves a whole group of query heads")
        return self

    def spec(self, name: str) -> ModelSpec:
        return ModelSpec(name, self.num_layers, self.hidden_size, self.num_heads,
                         self.num_kv_heads or self.num_heads, self.intermediate_size, self.vocab_size,
                         self.context_len_tokens, self.gated_ffn, self.dtype_bytes, self.head_dim,
                         self.moe.spec() if self.moe is not None else None,
                         self.layers.kinds(self.num_layers) if self.layers is not None else ())


class ModelConfig(Strict):
    """A model from the catalogue (``simulator.cost_model.catalogue.MODELS``), or any
    model described by ``shape`` (then ``name`` is only its label).

    ``context_len_tokens`` is the model's context window as served (vLLM's ``max_model_len``):
    the longest prompt + output a request may have. It is not the contiguous allocator's
    reservation (``allocator.reserve_tokens``), which defaults to it."""

    shape: ModelShapeConfig | None = None  # before name: name's check reads it
    name: str = "llama-2-7b"
    context_len_tokens: int | None = Field(None, gt=0, le=MAX_CONTEXT_TOKENS,
                                           description="tokens; default: the model's context window")
    #: How the KV cache stores a value: ``auto`` (the model's dtype), ``bf16``, ``fp16``, ``fp8``
    #: (1 byte), ``int4`` (LMDeploy's per-head per-token 4-bit, with a scale and zero point:
    #: ``layers.KV_DTYPES``). Named and valued as vLLM's engine argument ``--kv-cache-dtype``, and
    #: kept here, under ``model``, because in kvsim the model section is what sizes a token's KV
    #: (``ModelSpec``: capacity, swap bytes and the roofline's KV traffic all read it), whatever the
    #: allocator; vLLM's own key sits beside the model on ``vllm serve`` too. It changes the KV cache
    #: only: weights keep ``dtype_bytes``, and a Mamba or linear-attention state its own dtype.
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8", "int4"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _shape_has_its_own_name(cls, data: Any) -> Any:
        """A shape without a name is ``custom``, never the default catalogue model's name."""
        if isinstance(data, dict) and data.get("shape") is not None and "name" not in data:
            return {**data, "name": "custom"}
        return data

    @field_validator("name")
    @classmethod
    def _known(cls, v: str, info: ValidationInfo) -> str:
        if "shape" not in info.data:  # the shape is wrong: its own error says why
            return v
        if info.data["shape"] is not None:
            if isinstance(v, str) and v.lower() in MODELS:
                raise ValueError(f"{v!r} is a catalogue model, but model.shape describes the model: give the shape "
                                 "its own name (or remove shape to use the catalogue's)")
            return v
        if v.lower() not in MODELS:
            raise ValueError(f"unknown model {v!r}; choose one of {', '.join(MODELS)}, or describe it "
                             "with model.shape (num_layers, hidden_size, num_heads, ...)")
        return v.lower()

    @property
    def spec(self) -> ModelSpec:
        spec = self.shape.spec(self.name) if self.shape is not None else MODELS[self.name]
        if self.kv_cache_dtype == "auto":
            return spec
        return replace(spec, kv_dtype=KV_DTYPES[self.kv_cache_dtype])

    @property
    def context_len(self) -> int:
        """The context window in tokens: ``context_len_tokens``, else the model's own."""
        return self.context_len_tokens or self.spec.max_seq_len


def _one_form(value: Any, form: type[BaseModel], what: str) -> Any:
    """A key that is a name or a mapping: the mapping validated here, so that a mistake in it
    is one message about the mapping (not one per form the key could take)."""
    if not isinstance(value, dict):
        return value
    try:
        return form.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(x) for x in first["loc"])
        msg = "required key is missing" if first["type"] == "missing" else first["msg"]
        if "input" in first and first["type"] != "missing" and not isinstance(first["input"], dict):
            msg += f" (got {first['input']!r})"
        raise ValueError(f"{key}: {msg}; the mapping form is {what}") from None


class CollectiveConfig(Strict):
    """A collective's numbers on a link: bus bandwidth as nccl-tests reports it (GB/s: 10^9
    bytes per second) and the seconds each call pays (a small message's time)."""

    bus_bandwidth_gb_s: float = Field(gt=0, le=100_000)
    latency_s: float = Field(ge=0, le=1)


class InterconnectConfig(CollectiveConfig):
    """``hardware.interconnect`` given by its numbers: the all-reduce's, and optionally the
    all-to-all's and send/recv's (default: the all-reduce's)."""

    all_to_all: CollectiveConfig | None = None
    send_recv: CollectiveConfig | None = None


class HardwareConfig(Strict):
    """GPUs of one replica (``tensor_parallel`` of them) and how many replicas.

    Memory sizes are GiB (2^30 bytes, as vLLM and ``nvidia-smi`` count them), and every key
    that holds one ends in ``_gib``."""

    gpu: str = "a100-80gb"
    tensor_parallel: int = Field(1, ge=1, le=64)
    num_replicas: int = Field(1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_gib: float | None = Field(None, gt=0, description="GiB of KV per replica; overrides the computed value")
    num_gpu_blocks: int | None = Field(None, gt=0, le=2**31, description="KV blocks of allocator.block_size tokens "
                                       "per replica (vLLM's num_gpu_blocks, e.g. from its log); overrides "
                                       "kv_cache_gib")
    # Otherwise the blocks are computed as vLLM does (simulator/capacity.py), per GPU, from:
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096, description="total GiB per GPU as the CUDA driver "
                                         "reports it; default: the catalogue's measured figure, else the datasheet's")
    peak_activation_gib: float | None = Field(None, ge=0, le=4096, description="GiB per GPU of vLLM's profiled "
                                              "activation peak; default: estimated from the model shape and "
                                              "scheduler.max_num_batched_tokens")
    non_torch_memory_gib: float = Field(0.1, ge=0, le=4096, description="GiB per GPU the engine gains outside "
                                        "PyTorch's allocator while profiling (vLLM logs print it: 0.04-0.26 on one GPU)")
    cuda_graph_memory_gib: float = Field(0.0, ge=0, le=4096, description="GiB per GPU of CUDA graphs counted before "
                                         "sizing the cache (vLLM: only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)")
    swap_space_gib: float = Field(4.0, ge=0, le=4096, description="GiB of CPU swap space per GPU")
    pcie: Literal["gen4", "gen5"] | None = None
    data_parallel: bool = Field(False, description="the num_replicas replicas are the data-parallel engines of one "
                                "deployment (vLLM --data-parallel-size num_replicas): each its own scheduler and KV "
                                "pool behind one front end (router default least_outstanding_tokens); a MoE model's "
                                "expert layers span all of them (simulator.cost_model.moe)")
    expert_parallel: bool = Field(False, description="split a MoE model's experts whole over the expert group "
                                  "(vLLM --enable-expert-parallel), not each expert by tensor parallelism")
    interconnect: str | InterconnectConfig | None = Field(
        None, description="the link between a replica's GPUs for collectives: nvlink3/4/5, nvlink4-bridge, "
        "pcie-gen4|gen5[-x16|-x8|-x4][-p2p], none, or {bus_bandwidth_gb_s, latency_s}; default: the GPU's "
        "(simulator.cost_model.interconnect, measured NCCL figures)")

    @field_validator("gpu")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.lower() not in GPUS:
            raise ValueError(f"unknown GPU {v!r}; choose one of {', '.join(GPUS)}")
        return v.lower()

    @field_validator("interconnect", mode="before")
    @classmethod
    def _numbers(cls, v: Any) -> Any:
        return _one_form(v, InterconnectConfig, "{bus_bandwidth_gb_s, latency_s} (optionally all_to_all, send_recv)")

    @field_validator("interconnect")
    @classmethod
    def _known_link(cls, v: str | InterconnectConfig | None) -> str | InterconnectConfig | None:
        if isinstance(v, str):
            interconnect(v)  # a ValueError names what is allowed
            return v.lower()
        return v

    @property
    def spec(self) -> GPUSpec:
        return GPUS[self.gpu]

    @property
    def link(self) -> str | LinkSpec | None:
        """The GPUs' link for the cost model: a name, a spec, or None (the GPU's own)."""
        v = self.interconnect
        if isinstance(v, InterconnectConfig):
            return explicit_link(v.bus_bandwidth_gb_s, v.latency_s,
                                 *((c.bus_bandwidth_gb_s, c.latency_s) if c else None for c in (v.all_to_all, v.send_recv)))
        return v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "activation_reserve_gb" in data:
            raise ValueError("activation_reserve_gb is gone: KV capacity is computed as vLLM does; set "
                             "peak_activation_gib (and non_torch_memory_gib) instead")
        return data

    @model_validator(mode="after")
    def _link_joins_the_gpus(self) -> HardwareConfig:
        if self.tensor_parallel > 1:
            name = self.interconnect if isinstance(self.interconnect, str) else self.spec.interconnect
            if not name and self.interconnect is None:
                raise ValueError(f"interconnect: the catalogue has no measured link for {self.gpu}, and "
                                 f"tensor_parallel {self.tensor_parallel} needs one: set hardware.interconnect "
                                 f"({INTERCONNECT_RULE})")
            if not isinstance(self.interconnect, InterconnectConfig):
                try:
                    check_ranks(interconnect(name) if name else None, self.tensor_parallel, name or self.gpu)
                except ValueError as e:
                    where = "" if self.interconnect else f" (the default for {self.gpu})"
                    raise ValueError(f"interconnect{where}: {e}") from None
        return self

    @model_validator(mode="after")
    def _kv_fits(self) -> HardwareConfig:
        physical = self.spec.memory_bytes / GiB
        if self.gpu_memory_gib is not None and self.gpu_memory_gib > physical:
            raise ValueError(f"gpu_memory_gib: {self.gpu_memory_gib:g} GiB is more than one {self.gpu} holds "
                             f"({physical:g} GiB; the driver reports a little less): lower it, or change hardware.gpu")
        if self.kv_cache_gib is not None:
            total = self.tensor_parallel * self.spec.memory_bytes / GiB
            if self.kv_cache_gib > total:
                raise ValueError(f"kv_cache_gib {self.kv_cache_gib:g} GiB does not fit in {self.tensor_parallel} x "
                                 f"{self.gpu} ({total:g} GiB in all)")
        return self


# --- variants: a section whose keys depend on one key's value ------------------------------
#
# The allocator (by ``kind``), the scheduler (by ``policy``) and the cost model (by ``kind``)
# are each one of several classes. A key is a field of the variants that read it and of no
# other, so a key the chosen variant would ignore is an error naming the variant that reads
# it (``_format_errors``), and a resolved config holds only the keys that act and loads again.


def _picker(key: str, default: str) -> Discriminator:
    """The discriminator of a variant section: the value of ``key``, ``default`` if unset."""

    def pick(value: Any) -> str:
        tag = value.get(key, default) if isinstance(value, dict) else getattr(value, key, default)
        return tag if isinstance(tag, str) else repr(tag)  # never unhashable: an unknown tag is an error

    return Discriminator(pick)


class Variant(Strict):
    """One variant of a section (``SECTION`` in ``VARIANTS``). A key of another variant given
    as ``null`` means "not set" and is dropped, so a sweep can zip a key with the variant that
    reads it (``allocator.preset: [orca-max, null]`` with ``allocator.kind: [contiguous,
    paged]``); any other value of such a key is an error naming the variant that reads it."""

    SECTION: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _drop_unset_keys_of_other_variants(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        others = {k for c in VARIANTS[cls.SECTION][1].values() for k in c.model_fields} - set(cls.model_fields)
        return {k: v for k, v in data.items() if not (v is None and k in others)}


PRESETS = ("orca-max", "orca-pow2", "orca-oracle", "fastertransformer")

CAPACITY_BLOCK_TOKENS = 16
"""Tokens per block in the capacity arithmetic of an allocator without blocks (contiguous):
``hardware.num_gpu_blocks`` and the KV budget computed as vLLM does count blocks of vLLM's
default 16 tokens, so a contiguous run gets the capacity of the paged run it is compared with."""


TIER_LINKS = {
    # (bytes/s one direction, seconds per transfer). PCIe: the catalogue's host links
    # (cost_model.catalogue.PCIE). NVMe: sequential read of a PCIe 4.0 x4 / 5.0 x4 SSD
    # (Samsung 990 Pro datasheet: 7.45 GB/s; Crucial T705: 14.5 GB/s), rounded down; the
    # per-transfer latency is an assumption (a few queued 4 KiB reads: ~60-80 us).
    "pcie-gen4": (25.6e9, 10e-6),
    "pcie-gen5": (51.2e9, 10e-6),
    "nvme-gen4": (7.0e9, 80e-6),
    "nvme-gen5": (14.0e9, 60e-6),
}
"""Named links a cache tier can sit behind (``allocator.tiers[].link``)."""


class TierLinkConfig(Strict):
    """A link given by its numbers: each transfer pays ``latency_s``, then bytes at
    ``bandwidth_gb_s`` (GB/s: 10^9 bytes per second, one direction)."""

    bandwidth_gb_s: float = Field(ge=0.01, le=10_000, description="from 0.01 (10 MB/s: slower than any disk "
                                  "or network a cache sits behind) to 10,000")
    latency_s: float = Field(0.0, ge=0, le=1)


class TierConfig(Strict):
    """One cache tier below the GPU pool (DESIGN.md "Cache tiers"; the rules:
    ``policies.tiers.tier_stack``). ``capacity_gib``: GiB of KV it holds per replica (0: it
    keeps nothing, the sweep's baseline)."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", description="label in the summary: tier_<name>_hit_ratio, ...")
    capacity_gib: float = Field(ge=0, le=1_000_000)
    link: Literal["pcie-gen4", "pcie-gen5", "nvme-gen4", "nvme-gen5"] | TierLinkConfig = "pcie-gen4"
    eviction_policy: Literal["lru", "lfu", "fifo", "arc", "priority"] = "lru"
    write_policy: Literal["write-through", "write-through-after-hits", "write-back"] = "write-through"
    write_after_hits: int | None = Field(None, ge=1, le=1_000_000, description="GPU hits (uses of the tier above) "
                                         "before a block is written; only with write-through-after-hits")

    @field_validator("link", mode="before")
    @classmethod
    def _one_link(cls, v: Any) -> Any:
        """A link's name or its numbers, checked here: one message, not one per form it could take."""
        if isinstance(v, str) and v in TIER_LINKS:
            return v
        if isinstance(v, dict):
            return _one_form(v, TierLinkConfig, "{bandwidth_gb_s, latency_s}")
        raise ValueError(f"must be one of {', '.join(TIER_LINKS)} or {{bandwidth_gb_s, latency_s}}")

    @model_validator(mode="after")
    def _hits_with_their_policy(self) -> TierConfig:
        if (self.write_after_hits is None) == (self.write_policy == "write-through-after-hits"):
            if self.write_after_hits is None:
                raise ValueError("write_policy write-through-after-hits needs write_after_hits (>= 1)")
            raise ValueError(f"write_after_hits is read only with write_policy write-through-after-hits, not "
                             f"{self.write_policy!r}: remove it")
        return self

    @property
    def link_bandwidth(self) -> float:
        """Bytes per second."""
        return TIER_LINKS[self.link][0] if isinstance(self.link, str) else self.link.bandwidth_gb_s * 1e9

    @property
    def link_latency(self) -> float:
        """Seconds per transfer."""
        return TIER_LINKS[self.link][1] if isinstance(self.link, str) else self.link.latency_s


class PagedAllocatorConfig(Variant):
    """``kind: paged`` (vLLM): blocks of ``block_size`` tokens taken on demand."""

    SECTION: ClassVar[str] = "allocator"

    kind: Literal["paged"] = "paged"
    block_size: int = Field(16, description="tokens per block")
    watermark: float = Field(0.01, ge=0, lt=0.5, description="share of KV slots kept free at admission")
    prefix_caching: bool = False
    eviction_policy: Literal["lru", "lfu", "fifo", "arc", "priority"] = Field(
        "lru", description="order the prefix cache evicts cached blocks in (policies.indexes.eviction_order); "
        "lru = the engine's own (vLLM v1's free queue, SGLang's radix LRU)")
    tiers: list[TierConfig] = Field(default_factory=list, description="cache tiers below the GPU pool, top "
                                    "first (CPU, then disk): policies.tiers.tier_stack")

    @field_validator("tiers")
    @classmethod
    def _distinct_names(cls, v: list[TierConfig]) -> list[TierConfig]:
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct, got {names}")
        return v

    @field_validator("block_size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if not (1 <= v <= 256 and v & (v - 1) == 0):
            raise ValueError("must be a power of two from 1 to 256")
        return v


class ContiguousAllocatorConfig(Variant):
    """``kind: contiguous`` (Orca / FasterTransformer baselines): one region per sequence,
    placed by ``placement`` and sized by ``reservation``; ``reserve_tokens`` is the region of
    ``reservation: max`` (Orca-Max) and the cap of ``pow2``, in tokens (default: the model's
    context window)."""

    SECTION: ClassVar[str] = "allocator"
    kind: Literal["contiguous"] = "contiguous"
    preset: Literal["orca-max", "orca-pow2", "orca-oracle", "fastertransformer"] | None = None
    placement: Literal["buddy", "buddy_exact", "first_fit", "best_fit"] = "buddy"
    reservation: Literal["max", "pow2", "oracle"] = "max"
    reserve_tokens: int | None = Field(None, gt=0, description="tokens reserved under 'max' (the cap of 'pow2'); "
                                       "default: model.context_len_tokens")
    watermark: float = Field(0.01, ge=0, lt=0.5, description="share of KV slots kept free at admission")

    @field_validator("reserve_tokens")
    @classmethod
    def _read_by_the_reservation(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("reservation") == "oracle":
            raise ValueError("allowed only with reservation max or pow2 (reservation 'oracle' reserves exactly "
                             "prompt + output)")
        return v

    @property
    def block_size(self) -> int:
        """Not a key: the capacity arithmetic's block (``CAPACITY_BLOCK_TOKENS``)."""
        return CAPACITY_BLOCK_TOKENS

    @property
    def prefix_caching(self) -> bool:
        """Not a key: contiguous regions are never shared."""
        return False

    @model_validator(mode="after")
    def _preset_agrees(self) -> ContiguousAllocatorConfig:
        """A preset's own values are accepted (a resolved config carries them and loads again)."""
        if self.preset is not None:
            p = contiguous_preset(self.preset)
            for key, wanted in (("placement", p.placement), ("reservation", p.reservation)):
                if getattr(self, key) != wanted:
                    raise ValueError(f"{key} {getattr(self, key)!r} conflicts with preset {self.preset!r}, which "
                                     f"uses {wanted!r}: remove {key} or the preset")
        return self


AllocatorConfig = Annotated[
    Annotated[PagedAllocatorConfig, Tag("paged")] | Annotated[ContiguousAllocatorConfig, Tag("contiguous")],
    _picker("kind", "paged"),
]
"""``allocator:``, by ``kind`` (default ``paged``)."""

V1_ONLY_KEYS = ("long_prefill_token_threshold", "max_num_partial_prefills", "reserve_full_isl")
"""Scheduler keys only ``policy: vllm-v1`` reads."""
SGLANG_ONLY_KEYS = ("schedule_policy", "chunked_prefill_size", "enable_mixed_chunk",
                    "schedule_conservativeness")
"""Scheduler keys only ``policy: sglang`` reads (see ``simulator.sched.sglang``)."""


MAX_STEP_TOKENS = 2**30
"""Most tokens (or sequences) a scheduler limit may allow in one step: far beyond any GPU's
batch, and small enough that a step's token sums stay exact in 64 bits."""


class _SchedulerLimits(Variant):
    """Limits every scheduler policy reads."""

    SECTION: ClassVar[str] = "scheduler"
    policy: str = "vllm-v0"  # each policy's class narrows it to its own name (first key when written out)
    max_num_seqs: int = Field(256, ge=1, le=MAX_STEP_TOKENS)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_STEP_TOKENS, description="tokens per step; default: vllm-v0 "
                                               "max(2048, context_len_tokens), vllm-v1 2048, sglang 16384")
    #: which replica gets a request: round robin, or the least loaded by outstanding tokens,
    #: outstanding requests (llm-d's queue-depth scorer) or the share of KV cache allocated
    #: (llm-d's KV-cache utilization scorer; llm-d EPP "Request Scheduler" docs)
    router: Literal["round_robin", "least_outstanding_tokens", "least_outstanding_requests",
                    "least_kv_usage"] = "round_robin"

    OWN_KEYS: ClassVar[tuple[str, ...]] = ()
    """The keys only this policy reads; its settings beyond the shared limits."""

    def policy_keys(self) -> dict[str, Any]:
        """This policy's own settings by name (empty for vllm-v0), for the scheduler's settings."""
        return {k: getattr(self, k) for k in self.OWN_KEYS}


class VllmV0SchedulerConfig(_SchedulerLimits):
    """``policy: vllm-v0`` (the paper's system): prefill-only admission steps, swap or
    recompute. ``batching: request`` is FasterTransformer's request-level batching."""

    policy: Literal["vllm-v0"] = "vllm-v0"
    batching: Literal["iteration", "request"] = "iteration"


class VllmV1SchedulerConfig(_SchedulerLimits):
    """``policy: vllm-v1``: a per-step token budget, chunked prefills mixed with decodes,
    recompute only (``simulator.sched.vllm_v1``)."""

    policy: Literal["vllm-v1"] = "vllm-v1"
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_STEP_TOKENS, description="most tokens a request computes per step; "
                                              "0 = no cap")
    max_num_partial_prefills: int | None = Field(None, ge=1, le=MAX_STEP_TOKENS, description="most requests left mid-prefill by a "
                                                 "step; null = no limit")
    reserve_full_isl: bool = Field(True, description="admit only when blocks for the whole sequence are free "
                                   "(vLLM's scheduler_reserve_full_isl)")
    OWN_KEYS: ClassVar[tuple[str, ...]] = V1_ONLY_KEYS

    @property
    def batching(self) -> str:
        """Not a key: vLLM v1 batches per iteration."""
        return "iteration"


class SGLangSchedulerConfig(_SchedulerLimits):
    """``policy: sglang``: SGLang's radix-cache scheduler (``simulator.sched.sglang``);
    its keys keep SGLang's server-argument names (``chunked_prefill_size`` is in tokens)."""

    policy: Literal["sglang"] = "sglang"
    schedule_policy: Literal["lpm", "dfs-weight", "fcfs"] = Field("lpm", description="waiting-queue order")
    chunked_prefill_size: int | None = Field(8192, ge=1, le=MAX_STEP_TOKENS, description="most prompt tokens per step in chunks; "
                                             "null = no chunking (SGLang's default depends on GPU memory)")
    enable_mixed_chunk: bool = Field(False, description="running requests decode in prefill steps")
    schedule_conservativeness: float = Field(1.0, gt=0, le=100, description="scales the initial new_token_ratio")
    OWN_KEYS: ClassVar[tuple[str, ...]] = SGLANG_ONLY_KEYS

    @property
    def batching(self) -> str:
        """Not a key: SGLang batches per iteration."""
        return "iteration"


SchedulerConfig = Annotated[
    Annotated[VllmV0SchedulerConfig, Tag("vllm-v0")] | Annotated[VllmV1SchedulerConfig, Tag("vllm-v1")]
    | Annotated[SGLangSchedulerConfig, Tag("sglang")],
    _picker("policy", "vllm-v0"),
]
"""``scheduler:``, by ``policy`` (default ``vllm-v0``)."""

SCHEDULER_POLICIES = ("vllm-v0", "vllm-v1", "sglang")


class PreemptionConfig(Strict):
    """``auto`` is vLLM's default: recompute single-sequence groups, swap multi-sequence ones.

    ``overlap_swap`` models the serving engine, not the simulator's speed: with it a step's
    swaps run on the PCIe link while the GPU computes (the step lasts the longer of the two),
    without it they add to the step (vLLM v0 copies on the compute stream). It changes
    latencies, so it is an experiment setting and lives here, next to the swap it times."""

    mode: Literal["recompute", "swap", "auto"] = "auto"
    swap_fallback: Literal["recompute", "abort"] = "recompute"
    overlap_swap: bool = False


class DecodingConfig(Strict):
    """How parallel samples and beams behave (see ``simulator.decoding``)."""

    sample_lengths: Literal["same", "independent"] = "same"
    beam_concentration: float = Field(1.0, ge=0, le=1e6, description="0 = parents chosen uniformly")


class EngineConfig(Strict):
    """How the simulator computes, not what it simulates: switches here change speed, never a
    request's times or the memory classes. ``macro_steps`` advances a run of identical decode
    steps at once (one step-table row per run instead of per iteration: set it false for
    per-iteration rows, e.g. ``kvsim validate``'s per-second curves)."""

    macro_steps: bool = True


class HostTimeConfig(Strict):
    """The engine's work outside the kernels (``simulator.cost_model.host_time``): seconds per
    step and per scheduled sequence, and the part of each that is sampling (dropped when an
    operator profile times the sampler)."""

    per_step_s: float = Field(ge=0, le=10)
    per_seq_s: float = Field(0.0, ge=0, le=10)
    sampling_per_step_s: float = Field(0.0, ge=0, le=10)
    sampling_per_seq_s: float = Field(0.0, ge=0, le=10)

    @model_validator(mode="after")
    def _share(self) -> HostTimeConfig:
        HostTime(self.per_step_s, self.per_seq_s, self.sampling_per_step_s, self.sampling_per_seq_s)
        return self


MAX_STEP_OVERHEAD_S = 1.0
"""Longest fixed time per engine step (real engines: 1-30 ms of scheduling and launches)."""


class _CostModelBase(Variant):
    SECTION: ClassVar[str] = "cost_model"
    kind: str = "roofline"  # each kind's class narrows it to its own name (first key when written out)
    swap_batched: bool = False  # a swap moves all its blocks in one transfer per layer (not one per block)
    host: str | HostTimeConfig | None = Field(
        None, description="host time per step: a preset (none, vllm-2023-a100) or {per_step_s, per_seq_s}; "
        "default none (simulator.cost_model.host_time)")

    @field_validator("host", mode="before")
    @classmethod
    def _host_numbers(cls, v: Any) -> Any:
        return _one_form(v, HostTimeConfig, "{per_step_s, per_seq_s, sampling_per_step_s, sampling_per_seq_s}")

    @field_validator("host")
    @classmethod
    def _known_host(cls, v: str | HostTimeConfig | None) -> str | HostTimeConfig | None:
        if isinstance(v, str):
            host_preset(v)  # a ValueError names the presets
        return v

    @property
    def host_time(self) -> HostTime:
        """The host time this section resolves to (none when unset)."""
        v = self.host
        if v is None:
            return host_preset("none")
        if isinstance(v, str):
            return host_preset(v)
        return HostTime(v.per_step_s, v.per_seq_s, v.sampling_per_step_s, v.sampling_per_seq_s)


class RooflineCostConfig(_CostModelBase):
    """``kind: roofline`` needs no GPU. ``efficiencies`` names a set of fitted constants
    (``simulator.cost_model.roofline.ROOFLINE_PRESETS``, e.g. measured-rtx4090): it sets the
    three below, which may then not be given otherwise. Given neither, a config takes its GPU's
    fit (``ExperimentConfig._roofline_fit``; the field defaults are the RTX 4090's)."""

    kind: Literal["roofline"] = "roofline"
    efficiencies: str | None = None
    # shares of the datasheet's peaks: below 1% no kernel is that slow (fits give 0.5-1)
    compute_efficiency: float = Field(RooflineParams.compute_efficiency, ge=0.01, le=1)
    memory_efficiency: float = Field(RooflineParams.memory_efficiency, ge=0.01, le=1)
    step_overhead_s: float = Field(RooflineParams.step_overhead_s, ge=0, le=MAX_STEP_OVERHEAD_S)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("efficiencies") is None:
            return data
        name = data["efficiencies"]
        if not isinstance(name, str):
            raise ValueError(f"efficiencies: expected a preset name, got {name!r}")
        preset = roofline_preset(name)
        # the preset's own values are accepted: a resolved config (results/.../config) reloads
        clash = sorted(k for k, v in preset.items() if k in data and data[k] != v)
        if clash:
            raise ValueError(f"efficiencies {name!r} sets {', '.join(clash)}: give one or the other")
        return {**data, **preset}

    def params(self) -> RooflineParams:
        """The roofline's constants this section resolves to."""
        return RooflineParams(compute_efficiency=self.compute_efficiency, memory_efficiency=self.memory_efficiency,
                              step_overhead_s=self.step_overhead_s, swap_batched=self.swap_batched)


class CalibratedCostConfig(_CostModelBase):
    """``kind: calibrated`` reads a profile written by ``kvsim calibrate``."""

    kind: Literal["calibrated"] = "calibrated"
    profile: str | None = None
    step_overhead_s: float = Field(RooflineParams.step_overhead_s, ge=0, le=MAX_STEP_OVERHEAD_S)

    @model_validator(mode="after")
    def _profile_given(self) -> CalibratedCostConfig:
        if not self.profile:
            raise ValueError("kind 'calibrated' needs profile: PATH (a YAML written by kvsim calibrate)")
        return self


class ProfiledCostConfig(_CostModelBase):
    """``kind: profiled`` reads measured operator tables (``kvsim calibrate --import``), e.g.
    ``profile: rtx4090-llama-3.1-8b``. Its step overhead is 0 (the tables are the GPU's work
    only) unless ``step_overhead_s`` is set."""

    kind: Literal["profiled"] = "profiled"
    profile: str | None = None
    step_overhead_s: float | None = Field(None, ge=0, le=MAX_STEP_OVERHEAD_S, description="seconds per step; "
                                          "null = 0")

    @model_validator(mode="after")
    def _profile_given(self) -> ProfiledCostConfig:
        if not self.profile:
            raise ValueError("kind 'profiled' needs profile: NAME or PATH (an operator profile, e.g. "
                             "rtx4090-llama-3.1-8b, written by kvsim calibrate --import)")
        return self


CostModelConfig = Annotated[
    Annotated[RooflineCostConfig, Tag("roofline")] | Annotated[CalibratedCostConfig, Tag("calibrated")]
    | Annotated[ProfiledCostConfig, Tag("profiled")],
    _picker("kind", "roofline"),
]
"""``cost_model:``, by ``kind`` (default ``roofline``)."""

VARIANTS: dict[str, tuple[str, dict[str, type[BaseModel]]]] = {
    "allocator": ("kind", {"paged": PagedAllocatorConfig, "contiguous": ContiguousAllocatorConfig}),
    "scheduler": ("policy", {"vllm-v0": VllmV0SchedulerConfig, "vllm-v1": VllmV1SchedulerConfig,
                             "sglang": SGLangSchedulerConfig}),
    "cost_model": ("kind", {"roofline": RooflineCostConfig, "calibrated": CalibratedCostConfig,
                            "profiled": ProfiledCostConfig}),
}
"""Each variant section: its discriminating key and its classes by tag (for error messages)."""

RENAMED = {
    ("hardware", "kv_cache_gb"): "hardware.kv_cache_gib",
    ("hardware", "swap_space_gb"): "hardware.swap_space_gib",
    ("model", "max_seq_len"): "model.context_len_tokens",
    ("model", "shape", "max_seq_len"): "model.shape.context_len_tokens",
    ("allocator", "max_seq_len"): "allocator.reserve_tokens",
    ("scheduler", "macro_steps"): "engine.macro_steps",
    ("scheduler", "eviction_policy"): "allocator.eviction_policy",
}
"""Keys of earlier configs and their new names (same value, same unit): the ``_gb`` keys
always held GiB, and the two ``max_seq_len`` keys meant different things."""


def renamed_key(raw: Any) -> tuple[tuple[str, ...], str] | None:
    """The first key of a raw config (a dict) that was renamed, and its new name; else None."""
    for old, new in RENAMED.items():
        node = raw
        for k in old[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and old[-1] in node:
            return old, new
    return None


class MetricsConfig(Strict):
    """SLOs for goodput, and the window memory classes are averaged over.

    ``window``: ``busy`` (all engine steps), ``saturated`` (for each replica, from its
    first to its last step with a request waiting: steady state under load), or set ``window_start_s`` /
    ``window_end_s`` (seconds of simulated time) for an explicit interval.
    """

    slo_ttft_ms: float | None = Field(None, gt=0, le=MAX_SPAN_S * 1000)
    slo_tpot_ms: float | None = Field(None, gt=0, le=MAX_SPAN_S * 1000)
    window: Literal["busy", "saturated"] = "busy"
    window_start_s: float | None = Field(None, ge=0, le=MAX_SPAN_S)
    window_end_s: float | None = Field(None, gt=0, le=MAX_SPAN_S)
    step_table: bool = True  # write the per-step table (Parquet)

    @model_validator(mode="after")
    def _ordered(self) -> MetricsConfig:
        s, e = self.window_start_s, self.window_end_s
        if s is not None and e is not None and e <= s:
            raise ValueError(f"window_end_s ({e:g}) must be after window_start_s ({s:g})")
        return self

    @property
    def measurement_window(self) -> str | tuple[float | None, float | None]:
        if self.window_start_s is not None or self.window_end_s is not None:
            return (self.window_start_s, self.window_end_s)
        return self.window


class ExperimentConfig(Strict):
    name: str = "experiment"
    seed: int = Field(0, ge=0, le=2**63 - 1)
    model: ModelConfig = ModelConfig()
    hardware: HardwareConfig = HardwareConfig()
    workload: WorkloadConfig
    allocator: AllocatorConfig = PagedAllocatorConfig()
    scheduler: SchedulerConfig = VllmV0SchedulerConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    decoding: DecodingConfig = DecodingConfig()
    cost_model: CostModelConfig = RooflineCostConfig()
    metrics: MetricsConfig = MetricsConfig()
    engine: EngineConfig = EngineConfig()
    output_dir: str = "results"

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise ValueError(f"must be a plain folder name: {NAME_RULE}")
        return v

    @field_validator("output_dir")
    @classmethod
    def _a_folder(cls, v: str) -> str:
        if not v.strip() or "\0" in v:
            raise ValueError("must be a folder path, e.g. results")
        return v

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_keys(cls, data: Any) -> Any:
        """An earlier config's key is an error naming its new name (``validate_config`` says
        so first, with the line; this catches a dict validated directly)."""
        found = renamed_key(data)
        if found:
            raise ValueError(f"{'.'.join(found[0])} was renamed {found[1]}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _resolve_preset(cls, data: Any) -> Any:
        """Write a preset's settings into the config (where not given), so the resolved config
        says what runs; a given value that differs is an error (see the checks below)."""
        alloc = data.get("allocator") if isinstance(data, dict) else None
        if not isinstance(alloc, dict) or alloc.get("kind") != "contiguous" or alloc.get("preset") not in PRESETS:
            return data
        p = contiguous_preset(alloc["preset"])
        data = {**data, "allocator": {"placement": p.placement, "reservation": p.reservation, **alloc}}
        sched = data.get("scheduler", {})
        if isinstance(sched, dict) and sched.get("policy", "vllm-v0") == "vllm-v0":  # (batching is v0's key)
            wanted = "request" if p.request_level_batching else "iteration"
            data["scheduler"] = {"batching": wanted, **sched}
        return data

    @model_validator(mode="before")
    @classmethod
    def _roofline_fit(cls, data: Any) -> Any:
        """A roofline without given constants takes the fit for ``hardware.gpu``
        (``simulator.cost_model.roofline.GPU_FITS``: the GPU's own measured profile's, else the
        fit across every profile). None given: the resolved config names the preset
        (``efficiencies``); some given: each one given wins and the others come from the fit."""
        if not isinstance(data, dict):
            return data
        cost = data.get("cost_model", {})
        if isinstance(cost, RooflineCostConfig):
            cost = cost.model_dump(exclude_unset=True)
        if not isinstance(cost, dict) or cost.get("kind", "roofline") != "roofline" or cost.get("efficiencies"):
            return data
        hw = data.get("hardware", {})
        gpu = hw.get("gpu", HardwareConfig().gpu) if isinstance(hw, dict) else getattr(hw, "gpu", None)
        if not isinstance(gpu, str):
            return data  # (the hardware section's own error)
        name = default_efficiencies(gpu)
        preset = roofline_preset(name)
        given = {k: v for k, v in cost.items() if k in preset and v is not None}
        rest = {k: v for k, v in cost.items() if k not in preset and k != "efficiencies"}
        filled = {"efficiencies": name} if not given else {**preset, **given}
        return {**data, "cost_model": {**rest, **filled}}

    @model_validator(mode="before")
    @classmethod
    def _data_parallel_router(cls, data: Any) -> Any:
        """Data-parallel engines (``hardware.data_parallel``) sit behind vLLM's front end, which
        sends each request to its least-loaded engine: an unset ``scheduler.router`` is
        least_outstanding_tokens there (the resolved config says so)."""
        if not isinstance(data, dict):
            return data
        hw, sched = data.get("hardware"), data.get("scheduler", {})
        if not isinstance(hw, dict) or hw.get("data_parallel") is not True or not isinstance(sched, dict):
            return data
        if "router" not in sched:
            data = {**data, "scheduler": {**sched, "router": "least_outstanding_tokens"}}
        return data

    @model_validator(mode="after")
    def _check_moe(self) -> ExperimentConfig:
        """Expert parallelism needs experts; the calibrated cost model times no MoE block."""
        spec, hw = self.model.spec, self.hardware
        if spec.moe is None and hw.expert_parallel:
            raise ValueError(f"hardware.expert_parallel: model {self.model.name} has no experts (remove the key, or "
                             "describe them in model.shape.moe)")
        if spec.moe is not None and self.cost_model.kind == "calibrated":
            raise ValueError(f"cost_model.kind 'calibrated' does not time mixture-of-experts layers (model "
                             f"{self.model.name}): use roofline, or profiled with a profile that has moe tables")
        group = self.expert_group
        if spec.moe is not None and hw.expert_parallel and spec.moe.num_experts % group.size:
            raise ValueError(f"hardware.expert_parallel: {spec.moe.num_experts} experts do not split evenly over "
                             f"{group.size} GPUs (tensor_parallel x data-parallel replicas)")
        if spec.moe is not None and group.data_parallel > 1 and not isinstance(hw.interconnect, InterconnectConfig):
            name = hw.interconnect or hw.spec.interconnect
            if not name or interconnect(name) is None:
                raise ValueError(f"hardware.interconnect: {group.data_parallel} data-parallel engines of a MoE model "
                                 f"exchange tokens in every MoE layer, and {name or hw.gpu + ' (no default)'!r} joins "
                                 "no GPUs: set a link")
        return self

    @model_validator(mode="before")
    @classmethod
    def _v1_defaults(cls, data: Any) -> Any:
        """Under ``scheduler.policy: vllm-v1`` an unset ``allocator.watermark`` is 0 and an
        unset ``preemption.mode`` is recompute (vLLM v1 has no watermark and never swaps),
        so the resolved config says what runs and loads again; other values are errors
        (``_check_v1``)."""
        if not isinstance(data, dict):
            return data
        sched = data.get("scheduler")
        if not isinstance(sched, dict) or sched.get("policy") != "vllm-v1":
            return data
        alloc, pre = data.get("allocator", {}), data.get("preemption", {})
        if isinstance(alloc, dict) and "watermark" not in alloc:
            data = {**data, "allocator": {**alloc, "watermark": 0}}
        if isinstance(pre, dict) and "mode" not in pre:
            data = {**data, "preemption": {**pre, "mode": "recompute"}}
        return data

    @model_validator(mode="after")
    def _check_v1(self) -> ExperimentConfig:
        """What vLLM v1 cannot do is an error under ``policy: vllm-v1``, naming the key."""
        if self.scheduler.policy != "vllm-v1":
            return self
        why = "with scheduler.policy vllm-v1"
        if self.allocator.kind != "paged":
            raise ValueError(f"allocator.kind {self.allocator.kind!r} is not allowed {why}: vLLM v1 allocates "
                             "paged blocks (set kind: paged)")
        if self.allocator.watermark != 0:
            raise ValueError(f"allocator.watermark ({self.allocator.watermark:g}) is not allowed {why}: vLLM v1 "
                             "keeps no watermark (remove the key: it runs with 0)")
        if self.preemption.mode != "recompute":
            raise ValueError(f"preemption.mode {self.preemption.mode!r} is not allowed {why}: vLLM v1 preempts by "
                             "recompute only (remove the key or set recompute)")
        if self.preemption.swap_fallback != "recompute":
            raise ValueError(f"preemption.swap_fallback {self.preemption.swap_fallback!r} is not allowed {why}: "
                             "vLLM v1 never swaps (remove the key)")
        if self.preemption.overlap_swap:
            raise ValueError(f"preemption.overlap_swap true is not allowed {why}: vLLM v1 never swaps, so there is "
                             "no swap to overlap (remove the key)")
        for key in ("n", "beam_width"):
            value = getattr(self.workload, key)
            if value > 1:
                raise ValueError(f"workload.{key} ({value}) is not allowed {why}: it runs one sequence per "
                                 "request (vLLM v1 fans samples out into separate requests and has no beam search)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _sglang_defaults(cls, data: Any) -> Any:
        """Under ``scheduler.policy: sglang`` an unset ``allocator.block_size`` is 1 (SGLang's
        page size), ``allocator.prefix_caching`` true (the radix cache), ``allocator.watermark``
        0 and ``preemption.mode`` recompute (SGLang retracts and recomputes); other values of
        the last three are errors (``_check_sglang``)."""
        if not isinstance(data, dict):
            return data
        sched = data.get("scheduler")
        if not isinstance(sched, dict) or sched.get("policy") != "sglang":
            return data
        alloc, pre = data.get("allocator", {}), data.get("preemption", {})
        if isinstance(alloc, dict) and alloc.get("kind", "paged") == "paged":  # (else _check_sglang says why)
            data = {**data, "allocator": {"block_size": 1, "prefix_caching": True, "watermark": 0, **alloc}}
        if isinstance(pre, dict) and "mode" not in pre:
            data = {**data, "preemption": {**pre, "mode": "recompute"}}
        return data

    @model_validator(mode="after")
    def _check_sglang(self) -> ExperimentConfig:
        """What SGLang's policies cannot do is an error under ``policy: sglang``, naming the key."""
        if self.scheduler.policy != "sglang":
            return self
        why = "with scheduler.policy sglang"
        a, p = self.allocator, self.preemption
        if a.kind != "paged":
            raise ValueError(f"allocator.kind {a.kind!r} is not allowed {why}: SGLang pages its KV pool (set kind: "
                             "paged; allocator.block_size is the page size)")
        if not a.prefix_caching:
            raise ValueError(f"allocator.prefix_caching false is not allowed {why}: kvsim models SGLang with its "
                             "radix cache on (remove the key)")
        if a.watermark != 0:
            raise ValueError(f"allocator.watermark ({a.watermark:g}) is not allowed {why}: SGLang reserves "
                             "new_token_ratio x output instead (remove the key)")
        if p.mode != "recompute" or p.swap_fallback != "recompute":
            raise ValueError(f"preemption.mode {p.mode!r} / swap_fallback {p.swap_fallback!r} is not allowed {why}: "
                             "SGLang retracts requests and recomputes them (remove the keys)")
        if p.overlap_swap:
            raise ValueError(f"preemption.overlap_swap true is not allowed {why}: SGLang never swaps, so there is "
                             "no swap to overlap (remove the key)")
        for key in ("n", "beam_width"):
            value = getattr(self.workload, key)
            if value > 1:
                raise ValueError(f"workload.{key} ({value}) is not allowed {why}: it runs one sequence per request")
        chunk = self.scheduler.chunked_prefill_size
        if chunk is not None and chunk < a.block_size:
            raise ValueError(f"scheduler.chunked_prefill_size ({chunk}) is below the page size "
                             f"allocator.block_size ({a.block_size}) {why}: chunks are cut to whole pages, so a "
                             "chunked prompt would never advance (raise it, or null to never chunk)")
        return self

    @model_validator(mode="after")
    def _check_eviction(self) -> ExperimentConfig:
        """An eviction policy other than the default needs a prefix cache that evicts by it
        (every scheduler policy's cache does, vllm-v0's by all but ``priority``)."""
        a = self.allocator
        policy = getattr(a, "eviction_policy", "lru")
        if policy == "lru":
            return self
        if not a.prefix_caching:
            raise ValueError(f"allocator.eviction_policy {policy!r} needs a prefix cache: set "
                             "allocator.prefix_caching true (or remove the key)")
        if self.scheduler.policy == "vllm-v0" and policy == "priority":
            raise ValueError("allocator.eviction_policy 'priority' is not modelled with scheduler.policy vllm-v0 "
                             "(its allocator is not told request priorities): use lru, lfu, fifo or arc")
        return self

    @model_validator(mode="after")
    def _check_tiers(self) -> ExperimentConfig:
        """Cache tiers extend a prefix cache, under every scheduler policy: vLLM v0's and v1's
        (an offloading connector, LMCache) and SGLang's radix cache (HiCache)."""
        if getattr(self.allocator, "tiers", None) and not self.allocator.prefix_caching:
            raise ValueError("allocator.tiers needs allocator.prefix_caching true (tiers keep prefix blocks)")
        return self

    @model_validator(mode="after")
    def _fits(self) -> ExperimentConfig:
        if self.kv_bytes <= 0:
            b = self.memory_budget
            raise ValueError(
                f"model {self.model.name} leaves no KV memory on {self.hardware.gpu}: of its "
                f"{b.requested_bytes / GiB:,.1f} GiB (hardware.gpu_memory_utilization), weights take "
                f"{b.weight_bytes / GiB:,.1f} GiB per GPU at tensor_parallel {self.hardware.tensor_parallel} and the "
                f"activation peak {b.peak_activation_bytes / GiB:,.1f} GiB (hardware.peak_activation_gib, else "
                f"estimated from scheduler.max_num_batched_tokens {self.max_num_batched_tokens:,}): raise "
                "hardware.tensor_parallel or hardware.gpu_memory_utilization, lower the token budget, or set "
                "hardware.kv_cache_gib"
            )
        if self.kv_slots < self.allocator.block_size:
            raise ValueError(f"KV cache of {self.kv_slots} slots holds less than one block")
        self._check_parallelism()
        self._check_lengths()
        self._check_group_size()
        trace = self.workload.trace
        if self.allocator.prefix_caching and trace is not None and trace.hash_block_tokens % self.allocator.block_size:
            raise ValueError(
                f"allocator.block_size {self.allocator.block_size} must divide the trace's hash block of "
                f"{trace.hash_block_tokens} tokens (workload.trace.hash_block_tokens) for prefix caching"
            )
        if self.max_num_batched_tokens < self.model.context_len and self.scheduler.policy == "vllm-v0":
            # (vllm-v1 chunks a long prompt into the budget instead)
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= the model's "
                f"context window ({self.model.context_len} tokens, model.context_len_tokens), or long prompts "
                "could never be scheduled"
            )
        if self.max_num_batched_tokens < self.scheduler.max_num_seqs:  # as vLLM: a decode step is a token a sequence
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"scheduler.max_num_seqs ({self.scheduler.max_num_seqs}), or a decode step would exceed the token budget"
            )
        return self

    def _check_parallelism(self) -> None:
        """Tensor parallelism splits attention heads across GPUs (vLLM's rule): the query heads
        must divide evenly, and the KV heads too, or be replicated evenly when fewer than GPUs."""
        tp, m = self.hardware.tensor_parallel, self.model.spec
        if m.num_heads % tp or (m.num_kv_heads % tp if tp <= m.num_kv_heads else tp % m.num_kv_heads):
            ok = [d for d in range(1, 65) if m.num_heads % d == 0
                  and (m.num_kv_heads % d == 0 if d <= m.num_kv_heads else d % m.num_kv_heads == 0)]
            raise ValueError(f"hardware.tensor_parallel {tp} does not split {self.model.name}'s {m.num_heads} "
                             f"attention heads ({m.num_kv_heads} KV heads) evenly; use one of "
                             f"{', '.join(map(str, ok))}")

    def _check_lengths(self) -> None:
        """An explicit max length longer than the whole KV cache could never be used (vLLM refuses
        to start then), and a preset's batching must not be overridden silently."""
        for key, value in (("model.context_len_tokens", self.model.context_len_tokens),
                           ("allocator.reserve_tokens", getattr(self.allocator, "reserve_tokens", None))):
            if value is not None and value > self.kv_slots:
                raise ValueError(f"{key} ({value}) is larger than the KV cache ({self.kv_slots} token slots "
                                 "per replica): lower it or give more KV memory")
        if getattr(self.allocator, "preset", None) is not None:
            request = contiguous_preset(self.allocator.preset).request_level_batching
            if (self.scheduler.batching == "request") != request:
                raise ValueError(f"scheduler.batching {self.scheduler.batching!r} conflicts with allocator.preset "
                                 f"{self.allocator.preset!r}, which uses {'request' if request else 'iteration'}"
                                 " batching: remove one of them")

    def _check_group_size(self) -> None:
        """A request's samples (or beams) are one group, scheduled together: a group larger than
        ``max_num_seqs`` could never run (vLLM v0 would leave it waiting forever)."""
        size = max(self.workload.n, self.workload.beam_width)
        if size > self.scheduler.max_num_seqs:
            key = "workload.n" if self.workload.n >= self.workload.beam_width else "workload.beam_width"
            raise ValueError(f"{key} ({size}) is more than scheduler.max_num_seqs ({self.scheduler.max_num_seqs}): "
                             "a request's sequences run together, so it could never be scheduled")

    @property
    def kv_bytes(self) -> float:
        hw = self.hardware
        if hw.num_gpu_blocks is not None:  # exactly that many blocks (vLLM: KV memory // block bytes)
            return hw.num_gpu_blocks * self.allocator.block_size * self.model.spec.kv_bytes_per_token
        if hw.kv_cache_gib is not None:
            return hw.kv_cache_gib * GiB
        return self.memory_budget.num_gpu_blocks * self.allocator.block_size * self.model.spec.kv_bytes_per_token

    @property
    def memory_budget(self) -> MemoryBudget:
        """One GPU's memory as vLLM splits it (``simulator.capacity``), from the hardware section;
        what ``kv_bytes`` uses unless ``num_gpu_blocks`` or ``kv_cache_gib`` is given."""
        hw = self.hardware

        def gib(value: float | None) -> int | None:
            return None if value is None else round(value * GiB)

        return memory_budget(
            self.model.spec, hw.spec, tensor_parallel=hw.tensor_parallel,
            gpu_memory_utilization=hw.gpu_memory_utilization, block_size=self.allocator.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.scheduler.max_num_seqs,
            total_bytes=gib(hw.gpu_memory_gib), peak_activation_bytes=gib(hw.peak_activation_gib),
            non_torch_bytes=gib(hw.non_torch_memory_gib), cuda_graph_bytes=gib(hw.cuda_graph_memory_gib),
            expert_group=self.expert_group,
        )

    @property
    def expert_group(self) -> ExpertGroup:
        """How a MoE model's expert layers are spread (``simulator.cost_model.moe``): over this
        replica's GPUs, or over every replica's when they are data-parallel engines."""
        hw = self.hardware
        return ExpertGroup(hw.tensor_parallel, hw.num_replicas if hw.data_parallel else 1, hw.expert_parallel)

    @property
    def kv_slots(self) -> int:
        return kv_slots(self.kv_bytes, self.model.spec)

    @property
    def max_num_batched_tokens(self) -> int:
        """The per-step token budget. Default: vllm-v0 admits whole prompts, so
        max(2048, the context window); vllm-v1 chunks them, so 2048 (vLLM's API-server default
        on GPUs under 70 GiB and the A100; 8192 on larger ones, e.g. H100: set it there)."""
        if self.scheduler.max_num_batched_tokens:
            return self.scheduler.max_num_batched_tokens
        if self.scheduler.policy == "sglang":  # SGLang's max_prefill_tokens default
            return 16384
        return 2048 if self.scheduler.policy == "vllm-v1" else max(2048, self.model.context_len)


# --- loading -------------------------------------------------------------------------

MAX_YAML_BYTES = 1 << 20
"""Largest YAML file read (1 MiB): configs and sweeps are a few KB; more is a mistake."""
MAX_YAML_NODES = 100_000
"""Most values a YAML document may hold once its aliases are expanded (the "billion laughs"
bomb: nested aliases of 8-fold lists reach 10^8 values from a few hundred bytes)."""


def check_document(node: yaml.Node) -> tuple[int | None, str] | None:
    """What is wrong with a composed YAML document (its 1-based line, or None, and what), or
    None: too many values once aliases are expanded, a key given twice in one mapping, or a
    key that is not a plain scalar."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:  # values after alias expansion, memoized (aliases share nodes)
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = MAX_YAML_NODES + 1  # a node reached again while being counted: a cycle
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        sizes[id(n)] = min(total, MAX_YAML_NODES + 1)
        return sizes[id(n)]

    if size(node) > MAX_YAML_NODES:
        return None, f"more than {MAX_YAML_NODES} values once aliases are expanded (an alias bomb?)"
    for n in _mappings(node):
        seen: dict[Any, int] = {}
        for k, _ in n.value:
            line = k.start_mark.line + 1
            if not isinstance(k, yaml.ScalarNode):
                return line, f"a key must be a plain name, not a {k.id}"
            if k.value == "<<":
                continue
            if k.value in seen:
                return line, f"key {k.value!r} given twice (first on line {seen[k.value]})"
            seen[k.value] = line
    return None


def _mappings(node: yaml.Node) -> Iterator[yaml.MappingNode]:
    """Every distinct mapping node of a document (each alias target once)."""
    stack, visited = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in visited:
            continue
        visited.add(id(n))
        if isinstance(n, yaml.MappingNode):
            yield n
            stack.extend(v for kv in n.value for v in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def line_map(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line (check it first with
    :func:`check_document`: the map has one entry per value after alias expansion)."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (k.value,)
            out[p] = k.start_mark.line + 1
            line_map(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[path + (i,)] = v.start_mark.line + 1
            line_map(v, path + (i,), out)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY.PATH=VALUE, e.g. allocator.block_size=32")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {text}: empty key")
    try:
        value = parse_yaml(raw, f"--set {key.strip()}")[0] if raw.strip() else None
    except ConfigError as e:
        raise ConfigError(str(e).replace(": not valid YAML", ": value is not valid YAML", 1)) from None
    return key.strip().split("."), value


def apply_override(raw: dict, keys: list[str], value: Any) -> None:
    """``raw[k1][k2]... = value``, creating missing sections. A number steps into a list the
    config already has (``allocator.tiers.0.capacity_gib``: the first tier's size), so a sweep
    can vary one key of a list item; an override never creates or extends a list."""
    node: Any = raw
    for i, k in enumerate(keys):
        key: str | int = k
        if isinstance(node, list):
            if not (k.isascii() and k.isdigit() and int(k) < len(node)):
                raise ConfigError(f"--set {'.'.join(keys)}: {keys[i - 1]} is a list of {len(node)} "
                                  f"items; {k} is not an index (0..{len(node) - 1})")
            key = int(k)
        elif not isinstance(node, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: {keys[i - 1]} is not a section")
        if i == len(keys) - 1:
            node[key] = value
        else:
            if isinstance(node, dict) and node.get(key) is None:
                node[key] = {}
            node = node[key]


def _format_errors(err: ValidationError, source: str, lines: dict[tuple, int], overridden: set[tuple]) -> str:
    msgs = []
    for e in err.errors():
        raw_loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        loc, model = _key_path(raw_loc)
        key = ".".join(str(x) for x in loc)  # empty: a check across sections names its keys itself
        msg = e["msg"].removeprefix("Value error, ")
        word, sep, rest = msg.partition(": ")
        if e["type"] == "value_error" and sep and word.isidentifier():  # a section's check about one key
            longer, holder = _key_path((*raw_loc, word))
            if holder is not None and word in holder.model_fields:
                loc, msg = longer, rest
                key = ".".join(str(x) for x in loc)
        if e["type"] == "extra_forbidden":
            msg = _unknown_key(loc, model)
        elif e["type"] == "union_tag_invalid" and len(loc) == 1 and loc[0] in VARIANTS:
            disc, classes = VARIANTS[loc[0]]
            loc = (loc[0], disc)
            key = ".".join(loc)
            msg = f"must be one of {', '.join(classes)} (got {e['ctx'].get('tag')})"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(e["input"], dict):
            msg += f" (got {_short(e['input'])})"
        msgs.append(f"{_where(loc, source, lines, overridden)}: {key}: {msg}" if key
                    else f"{_where(loc, source, lines, overridden)}: {msg}")
    return "; ".join(" ".join(m.split()) for m in msgs)  # one line, however many problems


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error line must stay a line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(loc: tuple, source: str, lines: dict[tuple, int], overridden: set[tuple]) -> str:
    """``--set``, ``file:line`` of the innermost key of ``loc`` that has one, or ``file``; a
    check of a whole section names the ``--set`` keys inside it too (the file alone may be fine)."""
    under = sorted(".".join(map(str, k)) for k in overridden if k[:len(loc)] == loc)
    also = f" (with --set {', '.join(under)})" if under else ""
    if any(loc[:n] in overridden for n in range(len(loc), 0, -1)):
        return "--set"  # (the file's lines below an overridden key are no longer what is checked)
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return f"{source}:{lines[loc[:n]]}{also}"
    return source + also


def _key_path(loc: tuple) -> tuple[tuple, type[BaseModel] | None]:
    """An error location as the user's key path (a variant's tag, which pydantic puts after a
    variant section's name, removed), and the model that holds the last key (None if unknown)."""
    path: list = []
    model: type[BaseModel] | None = ExperimentConfig
    holder: type[BaseModel] | None = None
    i = 0
    while i < len(loc):
        k = loc[i]
        path.append(k)
        holder = model
        if len(path) == 1 and k in VARIANTS:
            tag = loc[i + 1] if i + 1 < len(loc) else None
            model = VARIANTS[k][1].get(tag) if isinstance(tag, str) else None
            i += 2 if model is not None else 1
            continue
        if isinstance(k, int):  # an item of a list: its model holds the keys below
            i += 1
            continue
        field = model.model_fields.get(str(k)) if model is not None else None
        models = _models_in(getattr(field, "annotation", None))
        member = _union_member(models, loc[i + 1]) if len(models) > 1 and i + 1 < len(loc) else None
        if member is not None:  # pydantic's tag of a union's member (workload.arrivals' kind): not a key
            model = member
            i += 2
            continue
        model = models[0] if models else None  # a section, or an optional one (model.shape)
        i += 1
    return tuple(path), holder


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds: itself, an optional one, a list's items, a union's members."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def _union_member(models: list[type[BaseModel]], tag: Any) -> type[BaseModel] | None:
    """The member of a union of models that pydantic's location element ``tag`` names (its class
    name, or its discriminator's value, e.g. ``poisson``), or None if ``tag`` is a user's key."""
    for m in models:
        if tag == m.__name__ or any(get_origin(f.annotation) is Literal and get_args(f.annotation) == (tag,)
                                    for f in m.model_fields.values()):
            return m
    return None


def _unknown_key(loc: tuple, holder: type[BaseModel] | None) -> str:
    """Why a key is refused: another variant of its section reads it (say which), or no one does
    (list the keys allowed here)."""
    if len(loc) == 2 and loc[0] in VARIANTS and holder is not None:
        disc, classes = VARIANTS[loc[0]]
        readers = [tag for tag, cls in classes.items() if loc[1] in cls.model_fields]
        here = holder.model_fields[disc].default
        if readers:
            return f"allowed only with {disc} {' or '.join(readers)} ({loc[0]}.{disc} is {here})"
    if holder is None:
        return "unknown key"
    return f"unknown key; allowed here: {', '.join(holder.model_fields)}"


def read_yaml(path: str | Path, what: str = "config", error: type[Exception] = ConfigError) -> tuple[Any, dict]:
    """Parse a YAML file; return its data and a map from key paths to 1-based lines.

    Unreadable files and YAML syntax errors raise ``error`` with the file and line.
    """
    path = Path(path)
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise error(f"{path}: {what} file larger than {MAX_YAML_BYTES >> 20} MiB; not a {what}?")
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    return parse_yaml(text, str(path), error)


def parse_yaml(text: str, where: str, error: type[Exception] = ConfigError) -> tuple[Any, dict]:
    """Parse one YAML document (``where`` names it in errors); return its data and line map."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        problem = check_document(node) if node is not None else None
        if problem:
            line, what = problem
            raise error(f"{where}{'' if line is None else f':{line}'}: {what}")
        raw = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark else where
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e)
        raise error(f"{at}: not valid YAML ({' '.join(str(problem).split())})") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply") from None
    except ValueError as e:  # a scalar PyYAML's constructors cannot convert
        line, digits = _longest_number(node)
        if digits > sys.get_int_max_str_digits():
            raise error(f"{where}:{line}: a number of {digits} digits; at most {sys.get_int_max_str_digits()} "
                        "are read (no key takes one this large)") from None
        raise error(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
    finally:
        if loader is not None:
            loader.dispose()
    return raw, (line_map(node) if node else {})


def _longest_number(node: yaml.Node) -> tuple[int, int]:
    """(1-based line, digits) of the scalar with the most digits in a document (each value once)."""
    best = (0, 0)
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            digits = sum(c.isdigit() for c in n.value)
            if digits > best[1]:
                best = (n.start_mark.line + 1, digits)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(v for kv in n.value for v in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return best


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[ExperimentConfig, Path]:
    """Read, override and validate a YAML experiment; return it and its folder."""
    path = Path(path)
    raw, lines = read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, hardware, workload, ...)")
    return validate_config(raw, source=str(path), lines=lines, overrides=overrides), path.parent


def validate_config(raw: dict, source: str = "<config>", lines: dict | None = None,
                    overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Validate a config dict (after applying ``--set`` overrides)."""
    overridden: set[tuple] = set()
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(raw, keys, value)
        overridden.add(tuple(int(k) if k.isascii() and k.isdigit() else k for k in keys))  # list items by index
    found = renamed_key(raw)
    if found:
        old, new = found
        raise ConfigError(f"{_where(old, source, lines or {}, overridden)}: {'.'.join(old)} was renamed {new}")
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, lines or {}, overridden)) from None
