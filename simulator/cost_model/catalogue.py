"""Published specifications of GPUs, host links and models.

Every number here is a vendor datasheet or model-card fact (cited per entry),
not a tuning knob. Memory sizes are bytes, bandwidths bytes per second, compute
FLOP per second (dense fp16/bf16 tensor-core peak).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.simulator.cost_model.layers import (
    ChunkedLocal,
    FullAttention,
    KVDtype,
    LatentAttention,
    LayerKind,
    NoMixer,
    RecurrentState,
    SlidingWindow,
    expand,
    from_codes,
    gated_deltanet_state_bytes,
    mamba2_state_bytes,
    mamba_state_bytes,
    model_kv_dtype,
    naive_bytes_per_token,
    request_kv_bytes,
)
from kvsim.simulator.cost_model.moe import (
    FP8_BLOCK128_BYTES,
    MXFP4_BYTES,
    MoESpec,
    block_params,
    expert_bytes,
)

GiB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int  # HBM/GDDR capacity
    hbm_bandwidth: float  # bytes/s, datasheet peak of the GPU's memory (HBM or GDDR)
    peak_flops: float  # FLOP/s, dense fp16/bf16 tensor core (no sparsity)
    nvlink_bandwidth: float  # bytes/s per direction, per GPU, to its peers (0: no NVLink)
    pcie: str  # host link generation, key of PCIE
    #: the GPUs' link for collectives by default (a name of ``interconnect.INTERCONNECTS``;
    #: "": none in the catalogue, so tensor parallelism needs ``hardware.interconnect``)
    interconnect: str = ""
    #: total memory as the CUDA driver reports it (``torch.cuda.mem_get_info()[1]``), measured;
    #: a little under ``memory_bytes`` (the driver keeps some). None: not measured here.
    cuda_total_bytes: int | None = None

    @property
    def reported_memory_bytes(self) -> int:
        """The total vLLM multiplies by ``gpu_memory_utilization``: the driver's figure where
        one was measured, else the datasheet capacity (an overestimate by a few hundred MiB)."""
        return self.memory_bytes if self.cuda_total_bytes is None else self.cuda_total_bytes


@dataclass(frozen=True)
class HostLinkSpec:
    """A GPU<->CPU link: each transfer pays ``latency`` seconds, then bytes at ``bandwidth``."""

    name: str
    bandwidth: float  # bytes/s one direction, achievable with pinned memory
    latency: float  # seconds per transfer (DMA setup + launch)


# PCIe x16 per direction: gen4 32 GB/s, gen5 64 GB/s theoretical (PCI-SIG); pinned-memory
# cudaMemcpy reaches about 80% of it. Per-copy latency ~10 us (CUDA memcpy launch + DMA setup).
PCIE = {
    "gen4": HostLinkSpec("PCIe 4.0 x16", 25.6e9, 10e-6),
    "gen5": HostLinkSpec("PCIe 5.0 x16", 51.2e9, 10e-6),
}

# Peak numbers from vendor datasheets/whitepapers. NVLink figures are per GPU per direction
# (half the "total bandwidth" a datasheet quotes). Compute: dense bf16 tensor FLOP/s (the
# datasheets' sparse figures halved). PCIe: the card's host interface (x16). The last field is the
# GPUs' link for collectives (interconnect.py, measured NCCL figures): NVLink with an NVSwitch
# on SXM parts, a bridge between pairs of PCIe cards, else PCIe (P2P except on GeForce). MI300X
# has none here: no published RCCL figure is in the catalogue, so give hardware.interconnect.
GPUS = {
    # NVIDIA A100 datasheet (2021): 312 TF bf16; 1,555 / 2,039 GB/s; NVLink 600 GB/s; PCIe 4.0.
    "a100-40gb": GPUSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, 300e9, "gen4", "nvlink3"),
    "a100-80gb": GPUSpec("A100-80GB", 80 * GiB, 2.039e12, 312e12, 300e9, "gen4", "nvlink3"),
    # NVIDIA H100 datasheet: SXM5 989 TF bf16, 3.35 TB/s, NVLink 900 GB/s; PCIe 5.0.
    "h100-sxm": GPUSpec("H100-SXM", 80 * GiB, 3.35e12, 989e12, 450e9, "gen5", "nvlink4"),
    # Same datasheet, H100 PCIe: 756 TF bf16, 80 GB HBM2e at 2.0 TB/s, NVLink bridge 600 GB/s
    # (pairs of cards), PCIe 5.0 x16.
    "h100-pcie": GPUSpec("H100-PCIe", 80 * GiB, 2.0e12, 756e12, 300e9, "gen5", "nvlink4-bridge"),
    # NVIDIA H200 datasheet (2023): 141 GB HBM3e, 4.8 TB/s, 989 TF bf16, NVLink 900 GB/s.
    "h200": GPUSpec("H200", 141 * 10**9, 4.8e12, 989e12, 450e9, "gen5", "nvlink4"),
    # NVIDIA H20 (HGX H20 product brief, 2024): 96 GB HBM3, 4.0 TB/s, 148 TF bf16, NVLink 900 GB/s.
    "h20": GPUSpec("H20", 96 * 10**9, 4.0e12, 148e12, 450e9, "gen5", "nvlink4"),
    # NVIDIA HGX B200 datasheet (2024), per GPU: 180 GB HBM3e, 8 TB/s, bf16 36 PF sparse per 8
    # GPUs -> 2.25 PF dense each; NVLink 5 1.8 TB/s; PCIe 5.0.
    "b200": GPUSpec("B200", 180 * 10**9, 8.0e12, 2250e12, 900e9, "gen5", "nvlink5"),
    # AMD Instinct MI300X datasheet (2023): 192 GB HBM3, 5.3 TB/s, 1,307.4 TF bf16 dense;
    # Infinity Fabric: 7 peer links of 128 GB/s (both directions) -> 448 GB/s each way; PCIe 5.0.
    "mi300x": GPUSpec("MI300X", 192 * 10**9, 5.3e12, 1307.4e12, 448e9, "gen5"),
    # NVIDIA Ada whitepaper (2022), GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, bf16 with fp32
    # accumulate 165.2 TF dense; no NVLink; PCIe 4.0 x16; peer-to-peer disabled on GeForce.
    # The driver reports 25,250,627,584 bytes (device_total_memory_bytes of the vLLM 0.19 run
    # in shared/validation/vllm-0.19-rtx4090-llama-3.1-8b/vllm/meta.json).
    "rtx4090": GPUSpec("RTX 4090", 24 * GiB, 1.008e12, 165.2e12, 0.0, "gen4", "pcie-gen4",
                       cuda_total_bytes=25_250_627_584),
    # NVIDIA L40S datasheet (2023): 48 GB GDDR6, 864 GB/s, bf16 362.05 TF dense (733 sparse);
    # no NVLink; PCIe 4.0 x16.
    "l40s": GPUSpec("L40S", 48 * GiB, 864e9, 362.05e12, 0.0, "gen4", "pcie-gen4-p2p"),
    # NVIDIA RTX PRO 6000 Blackwell (Server Edition) datasheet (2025): 96 GB GDDR7, 1,792 GB/s,
    # 4 PF FP4 sparse -> bf16 dense 1/8 of it = 500 TF; no NVLink; PCIe 5.0 x16.
    "rtx-pro-6000": GPUSpec("RTX PRO 6000 Blackwell", 96 * GiB, 1.792e12, 500e12, 0.0, "gen5", "pcie-gen5-p2p"),
    # AWS EC2 G5 (NVIDIA A10G): 24 GB GDDR6, 600 GB/s; 70 TF bf16 dense (Baseten, "NVIDIA A10
    # vs A10G", 2023: the A10's 125 TF is not reached by the A10G's clocks); no NVLink; PCIe 4.0.
    "a10g": GPUSpec("A10G", 24 * GiB, 600e9, 70e12, 0.0, "gen4", "pcie-gen4-p2p"),
}


@dataclass(frozen=True)
class ModelSpec:
    """Transformer shapes (from each model's published config)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    max_seq_len: int  # tokens: the model's context window
    gated_ffn: bool  # SwiGLU (3 matrices) vs GELU/ReLU MLP (2)
    dtype_bytes: int = 2  # fp16/bf16
    #: attention head size when it is not hidden / heads (Qwen3-32B: 128, not 5120 / 64 = 80)
    explicit_head_dim: int | None = None
    #: mixture-of-experts layers (``simulator.cost_model.moe``); None: every layer a dense MLP
    moe: MoESpec | None = None
    #: what each layer is (``simulator.cost_model.layers``), one kind a layer; (): every layer
    #: full attention
    layers: tuple[LayerKind, ...] = ()
    #: how the KV cache stores a value (``layers.KV_DTYPES``); None: the model's dtype (vLLM's
    #: ``kv_cache_dtype: auto``)
    kv_dtype: KVDtype | None = None
    #: the LM head is the token embedding (one matrix); None: tied when the MLP is not gated
    #: (OPT), untied otherwise (Llama, Qwen, Mistral)
    tie_word_embeddings: bool | None = None

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def tied_embeddings(self) -> bool:
        return (not self.gated_ffn) if self.tie_word_embeddings is None else self.tie_word_embeddings

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """One kind a layer: ``layers``, or full attention everywhere."""
        return self.layers or (FullAttention(),) * self.num_layers

    @property
    def kv_cache_dtype(self) -> KVDtype:
        """The KV cache's dtype: ``kv_dtype``, else the model's own (``dtype_bytes``)."""
        return self.kv_dtype or model_kv_dtype(self.dtype_bytes)

    def kv_bytes_per_token_with(self, kv_heads: int) -> int:
        """Bytes per token the paged and contiguous allocators charge, with ``kv_heads`` KV heads
        a layer (one GPU's share under tensor parallelism; an MLA latent is not split): every
        layer counted as keeping every token, a window, chunked, state, shared or MLP-only layer
        as a full-attention layer (``layers.naive_bytes_per_token``). Exact for models whose
        every layer keeps every token (full attention, MLA) in any KV dtype; for hybrids the
        over-count that :meth:`request_kv_bytes` measures, until the hybrid allocators."""
        return naive_bytes_per_token(self.layer_kinds, kv_heads, self.head_dim, self.kv_cache_dtype)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token slot is charged across all layers (all KV heads), as above:
        ``2 x layers x kv_heads x head_dim x 2`` for a bf16 full-attention model."""
        return self.kv_bytes_per_token_with(self.num_kv_heads)

    def request_kv_bytes(self, tokens: int) -> int:
        """Bytes a request of ``tokens`` tokens holds, exactly, by layer kind (all KV heads):
        ``layers.request_kv_bytes``."""
        return request_kv_bytes(self.layer_kinds, tokens, self.num_kv_heads, self.head_dim, self.kv_cache_dtype)

    def naive_request_kv_bytes(self, tokens: int) -> int:
        """Bytes a request of ``tokens`` tokens is charged counting every layer as full attention
        (``tokens x kv_bytes_per_token``): today's allocators, and other simulators."""
        return tokens * self.kv_bytes_per_token

    @property
    def layer_params(self) -> int:
        """Weights in one decoder layer: QKV + output projection + MLP (biases and norms ignored)."""
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = d * q + 2 * d * kv + q * d
        mlp = (3 if self.gated_ffn else 2) * d * self.ffn_size
        return attention + mlp

    @property
    def dense_params(self) -> int:
        """Weights of the decoder layers outside their MoE blocks: every layer's attention and
        the dense MLPs (all layers of a dense model: ``num_layers x layer_params``)."""
        if self.moe is None:
            return self.num_layers * self.layer_params
        mlp = (3 if self.gated_ffn else 2) * self.hidden_size * self.ffn_size
        return self.num_layers * (self.layer_params - mlp) + self.moe.dense_layers * mlp

    @property
    def num_params(self) -> int:
        """All weights: layers (every expert of a MoE block) + token embedding + LM head
        (counted once when tied)."""
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tied_embeddings else embed  # OPT ties embeddings; Llama does not
        moe = 0 if self.moe is None else self.moe.moe_layers(self.num_layers) * block_params(self)
        return self.dense_params + moe + embed + lm_head

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights; routed experts in their own format where it differs."""
        if self.moe is None or self.moe.expert_bytes_per_param is None:
            return self.num_params * self.dtype_bytes
        experts = self.moe.moe_layers(self.num_layers) * self.moe.num_experts
        routed = experts * (3 if self.gated_ffn else 2) * self.hidden_size * self.moe.expert_ffn_size
        return round((self.num_params - routed) * self.dtype_bytes + experts * expert_bytes(self))


# Shapes from the Hugging Face configs of facebook/opt-*, meta-llama/Llama-2-*, Llama-3-*
# (Zhang et al. 2022; Touvron et al. 2023; Meta 2024). "llama-13b" is LLaMA-1 (Fig. 16).
MODELS = {
    "opt-13b": ModelSpec("OPT-13B", 40, 5120, 40, 40, 20480, 50272, 2048, False),
    "opt-66b": ModelSpec("OPT-66B", 64, 9216, 72, 72, 36864, 50272, 2048, False),
    "opt-175b": ModelSpec("OPT-175B", 96, 12288, 96, 96, 49152, 50272, 2048, False),
    "llama-13b": ModelSpec("LLaMA-13B", 40, 5120, 40, 40, 13824, 32000, 2048, True),
    "llama-2-7b": ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096, True),
    "llama-2-13b": ModelSpec("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, 4096, True),
    "llama-2-70b": ModelSpec("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096, True),
    "llama-3-8b": ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192, True),
    "llama-3-70b": ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192, True),
    # meta-llama/Llama-3.1-8B and -70B configs (2024): Llama 3 shapes, 131,072-token context.
    "llama-3.1-8b": ModelSpec("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 131072, True),
    "llama-3.1-70b": ModelSpec("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, 131072, True),
    # Qwen/Qwen3-8B, -14B, -32B configs (2025): GQA with 8 KV heads, head_dim 128 whatever the
    # hidden size, untied embeddings, max_position_embeddings 40,960.
    "qwen3-8b": ModelSpec("Qwen3-8B", 36, 4096, 32, 8, 12288, 151936, 40960, True, explicit_head_dim=128),
    "qwen3-14b": ModelSpec("Qwen3-14B", 40, 5120, 40, 8, 17408, 151936, 40960, True, explicit_head_dim=128),
    "qwen3-32b": ModelSpec("Qwen3-32B", 64, 5120, 64, 8, 25600, 151936, 40960, True, explicit_head_dim=128),
    # mistralai/Mistral-7B-v0.3 config (2024): GQA 8 KV heads, vocab 32,768, 32,768-token context.
    "mistral-7b": ModelSpec("Mistral-7B", 32, 4096, 32, 8, 14336, 32768, 32768, True),
    # --- mixture of experts (MoESpec: experts, active per token, expert size, shared size, dense
    # layers first, bytes per expert weight); layers by kind where a model has them (layers.py).
    # Qwen/Qwen3-30B-A3B config.json (2025): 48 layers, hidden 2048, 32 heads, 4 KV heads of 128,
    # intermediate_size 6144 (no dense layer uses it: mlp_only_layers []), 128 experts, 8 per
    # token, moe_intermediate_size 768, no shared expert, vocab 151,936, untied, 40,960
    # positions. 30.5B parameters, 3.3B active (model card). Qwen/Qwen3-30B-A3B-Instruct-2507
    # (the RTX PRO 6000 profile's model): the same shapes, max_position_embeddings 262,144.
    "qwen3-30b-a3b": ModelSpec("Qwen3-30B-A3B", 48, 2048, 32, 4, 6144, 151936, 40960, True,
                               explicit_head_dim=128, moe=MoESpec(128, 8, 768)),
    "qwen3-30b-a3b-instruct-2507": ModelSpec("Qwen3-30B-A3B-Instruct-2507", 48, 2048, 32, 4, 6144, 151936,
                                             262144, True, explicit_head_dim=128, moe=MoESpec(128, 8, 768)),
    # Qwen/Qwen3-235B-A22B config.json (2025): 94 layers, hidden 4096, 64 heads, 4 KV heads of 128,
    # intermediate_size 12288 (unused), 128 experts, 8 per token, moe_intermediate_size 1536,
    # vocab 151,936, untied, 40,960 positions. 235B parameters, 22B active (model card).
    "qwen3-235b-a22b": ModelSpec("Qwen3-235B-A22B", 94, 4096, 64, 4, 12288, 151936, 40960, True,
                                 explicit_head_dim=128, moe=MoESpec(128, 8, 1536)),
    # mistralai/Mixtral-8x7B-v0.1 config.json (2023): 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # 8 local experts of intermediate_size 14336, 2 per token, vocab 32,000, untied, 32,768
    # positions (sliding_window null: full attention). 46.7B parameters, 12.9B active (Jiang et
    # al., "Mixtral of Experts", 2024).
    "mixtral-8x7b": ModelSpec("Mixtral-8x7B", 32, 4096, 32, 8, 14336, 32000, 32768, True,
                              moe=MoESpec(8, 2, 14336)),
    # openai/gpt-oss-20b and -120b config.json (2025): hidden 2880, 64 heads, 8 KV heads of 64,
    # experts of intermediate_size 2880 (SwiGLU), 4 per token, vocab 201,088, untied, 131,072
    # positions; 24 layers and 32 experts (20b), 36 layers and 128 experts (120b). Expert weights
    # are MXFP4 (quantization_config; attention, router, embeddings bf16), so 4.25 bits each.
    # 20.9B / 116.8B parameters (model card). layer_types: "sliding_attention", "full_attention"
    # alternating from layer 0, sliding_window 128. Attention biases and sinks are ignored.
    "gpt-oss-20b": ModelSpec("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, 131072, True,
                             explicit_head_dim=64, moe=MoESpec(32, 4, 2880, expert_bytes_per_param=MXFP4_BYTES),
                             layers=expand(((SlidingWindow(128), 1), (FullAttention(), 1)), 24)),
    "gpt-oss-120b": ModelSpec("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 131072, True,
                              explicit_head_dim=64, moe=MoESpec(128, 4, 2880, expert_bytes_per_param=MXFP4_BYTES),
                              layers=expand(((SlidingWindow(128), 1), (FullAttention(), 1)), 36)),
    # deepseek-ai/DeepSeek-V3 config.json (2024): 61 layers, hidden 7168, 128 heads, intermediate
    # 18432 in the first 3 layers (first_k_dense_replace), then 256 routed experts, 8 per token, of
    # moe_intermediate_size 2048, plus 1 shared expert of 2048; vocab 129,280, untied, 163,840
    # positions; weights FP8 E4M3 in 128x128 blocks (quantization_config). 671B parameters, 37B
    # active (model card; the 14B multi-token-prediction module is not served here).
    # Multi-head latent attention in every layer: one latent of kv_lora_rank 512 + qk_rope_head_dim
    # 64 = 576 values per token per layer (layers), whole on every tensor-parallel GPU as vLLM keeps
    # it. The attention WEIGHTS are APPROXIMATED: 48 query heads and one KV head of 288, so that
    # they, 202M per layer, are near MLA's low-rank projections (187M); attention FLOPs are
    # approximate. Non-expert weights are counted at bf16 (FP8 in the checkpoint: about 16 GB, 2%,
    # overcounted over the whole model) until weights get a dtype of their own.
    "deepseek-v3": ModelSpec("DeepSeek-V3", 61, 7168, 48, 1, 18432, 129280, 163840, True,
                             explicit_head_dim=288,
                             moe=MoESpec(256, 8, 2048, shared_ffn_size=2048, dense_layers=3,
                                         expert_bytes_per_param=FP8_BLOCK128_BYTES),
                             layers=expand(((LatentAttention(512 + 64), 1),), 61)),
    # --- hybrid models (README "Hybrid models: what each layer stores"). Their Mamba and linear-
    # attention layers' WEIGHTS are APPROXIMATED as attention projections of the model's heads
    # (layer_params); their state is exact (layers.py).
    # google/gemma-3-12b-it and -27b-it config.json text_config (2025; read from a text-only copy,
    # OpenPipe/gemma-3-12b-it-text-only, for 12B): 12B: 48 layers, hidden 3840, 16 heads, 8 KV
    # heads, head_dim 256, intermediate 15360; 27B: 62 layers, hidden 5376, 32 heads, 16 KV heads,
    # head_dim 128, intermediate 21504; both vocab 262,208, 131,072 positions, GeGLU (gated),
    # sliding_window 1024, sliding_window_pattern 6 (layer i global when (i + 1) % 6 == 0: five
    # local layers, then one global, repeated), embeddings tied (Gemma3TextConfig's default).
    "gemma-3-12b": ModelSpec("Gemma-3-12B", 48, 3840, 16, 8, 15360, 262208, 131072, True, explicit_head_dim=256,
                             layers=expand(((SlidingWindow(1024), 5), (FullAttention(), 1)), 48),
                             tie_word_embeddings=True),
    "gemma-3-27b": ModelSpec("Gemma-3-27B", 62, 5376, 32, 16, 21504, 262208, 131072, True, explicit_head_dim=128,
                             layers=expand(((SlidingWindow(1024), 5), (FullAttention(), 1)), 62),
                             tie_word_embeddings=True),
    # meta-llama/Llama-4-Scout-17B-16E config.json text_config (2025): 48 layers, hidden 5120, 40
    # heads, 8 KV heads of 128, 16 local experts of intermediate_size 8192, 1 per token, and a
    # shared expert of the same size (Llama 4's MoE block), interleave_moe_layer_step 1 (every
    # layer MoE; intermediate_size_mlp 16384 unused), vocab 202,048, untied, 10,485,760 positions.
    # attention_chunk_size 8192 with no_rope_layer_interval 4: every 4th layer (3, 7, ...) is a
    # global NoPE layer (full attention), the other three attend within 8,192-token chunks.
    "llama-4-scout": ModelSpec("Llama-4-Scout-17B-16E", 48, 5120, 40, 8, 16384, 202048, 10485760, True,
                               explicit_head_dim=128, moe=MoESpec(16, 1, 8192, shared_ffn_size=8192),
                               layers=expand(((ChunkedLocal(8192), 3), (FullAttention(), 1)), 48)),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json (2025): 48 layers, hidden 2048, 16 heads, 2 KV
    # heads, head_dim 256, 512 experts, 10 per token, moe_intermediate_size 512, shared expert 512,
    # decoder_sparse_step 1 (every layer MoE; intermediate_size 5120 unused), vocab 151,936, untied,
    # 262,144 positions. full_attention_interval 4: layers 3, 7, ... gated full attention, the
    # others Gated DeltaNet with linear_num_key_heads 16, linear_num_value_heads 32, key and value
    # head dims 128, linear_conv_kernel_dim 4. State in bf16 (vLLM's mamba cache dtype "auto": the
    # model's dtype): 24,576 conv + 524,288 recurrent values = 1,097,728 bytes a layer.
    "qwen3-next-80b-a3b": ModelSpec("Qwen3-Next-80B-A3B", 48, 2048, 16, 2, 5120, 151936, 262144, True,
                                    explicit_head_dim=256, moe=MoESpec(512, 10, 512, shared_ffn_size=512),
                                    layers=expand(((RecurrentState(gated_deltanet_state_bytes(16, 32, 128, 128, 4)), 3),
                                                   (FullAttention(), 1)), 48)),
    # Nemotron-H-8B (nvidia/Nemotron-H-8B-Base-8K), the Nemotron-H shape whose Mamba dimensions are
    # published where we could read them (NVIDIA Megatron-Bridge docs, "Nemotron H and Nemotron Nano
    # v2", Nemotron H 8B: 52 layers, hybrid pattern M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-
    # (M Mamba-2, * attention, - MLP), hidden 4096, FFN 21504, 32 query heads, 8 KV groups, KV
    # channels 128, Mamba heads 128 of 64, state 128; mamba_num_groups 8 (its provider page); conv
    # kernel 4, vocab 131,072, untied (NemotronHConfig defaults), 8,192 tokens). The 47B's Mamba
    # dimensions were not found in a source we could read, so it is not in the catalogue. The MLP
    # is squared-ReLU (2 matrices). State in bf16 (vLLM's "auto").
    "nemotron-h-8b": ModelSpec("Nemotron-H-8B", 52, 4096, 32, 8, 21504, 131072, 8192, False,
                               tie_word_embeddings=False,
                               layers=from_codes("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                                                 {"M": RecurrentState(mamba2_state_bytes(128, 64, 128, 8, 4)),
                                                  "*": FullAttention(), "-": NoMixer()})),
    # ai21labs/AI21-Jamba-1.5-Mini (Jamba-1.5 paper, arXiv 2408.12570: the Jamba architecture,
    # 12B active / 52B total, 256K context), with the Jamba config.json fields (ai21labs/Jamba-v0.1:
    # 32 layers, hidden 4096, 32 heads, 8 KV heads, attn_layer_period 8, attn_layer_offset 4,
    # expert_layer_period 2 and offset 1, 16 experts, 2 per token, intermediate 14336, Mamba
    # mamba_expand 2 (d_inner 8192), mamba_d_state 16, mamba_d_conv 4, vocab 65,536, untied),
    # 262,144 positions. Mamba (1) state in bf16 (vLLM's "auto"). MoE in every other layer is
    # not a MoESpec form ("the first k layers dense"), so the MoE is left out: weights undercounted.
    "jamba-1.5-mini": ModelSpec("Jamba-1.5-Mini", 32, 4096, 32, 8, 14336, 65536, 262144, True,
                                layers=expand(((RecurrentState(mamba_state_bytes(8192, 16, 4)), 4),
                                               (FullAttention(), 1),
                                               (RecurrentState(mamba_state_bytes(8192, 16, 4)), 3)), 32)),
}
