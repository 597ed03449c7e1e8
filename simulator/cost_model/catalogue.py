"""Published specifications of GPUs, host links and models.

Every number here is a vendor datasheet or model-card fact (cited per entry),
not a tuning knob. Memory sizes are bytes, bandwidths bytes per second, compute
FLOP per second (dense fp16/bf16 tensor-core peak).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int  # HBM/GDDR capacity
    hbm_bandwidth: float  # bytes/s, datasheet peak of the GPU's memory (HBM or GDDR)
    peak_flops: float  # FLOP/s, dense fp16/bf16 tensor core (no sparsity)
    nvlink_bandwidth: float  # bytes/s per direction, per GPU, to its peers (0: no NVLink)
    pcie: str  # host link generation, key of PCIE
    p2p: bool = True  # without NVLink: PCIe peer-to-peer between GPUs (False: through host memory)
    #: total memory as the CUDA driver reports it (``torch.cuda.mem_get_info()[1]``), measured;
    #: a little under ``memory_bytes`` (the driver keeps some). None: not measured here.
    cuda_total_bytes: int | None = None

    @property
    def reported_memory_bytes(self) -> int:
        """The total vLLM multiplies by ``gpu_memory_utilization``: the driver's figure where
        one was measured, else the datasheet capacity (an overestimate by a few hundred MiB)."""
        return self.memory_bytes if self.cuda_total_bytes is None else self.cuda_total_bytes

    @property
    def link_bandwidth(self) -> float:
        """Bytes/s per direction between two GPUs of a replica (tensor-parallel traffic).

        NVLink where the GPU has it; otherwise its PCIe link, peer to peer, or at half the
        rate when peer-to-peer is disabled and every transfer is staged in host memory
        (device -> host -> device: two crossings of the same link).
        """
        if self.nvlink_bandwidth > 0:
            return self.nvlink_bandwidth
        return PCIE[self.pcie].bandwidth * (1.0 if self.p2p else 0.5)

    @property
    def link_latency_s(self) -> float:
        """Seconds one all-reduce call pays before its bytes (small-message latency)."""
        if self.nvlink_bandwidth > 0:
            return NVLINK_ALLREDUCE_LATENCY_S
        return PCIE_ALLREDUCE_LATENCY_S * (1.0 if self.p2p else 2.0)


# Small-message all-reduce latency (s): NCCL over NVLink about 8 us; across PCIe switches
# and the root complex about 2-3x that. Assumptions, not datasheet facts (DESIGN.md "Cost model").
NVLINK_ALLREDUCE_LATENCY_S = 8e-6
PCIE_ALLREDUCE_LATENCY_S = 20e-6


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
# datasheets' sparse figures halved). PCIe: the card's host interface (x16).
GPUS = {
    # NVIDIA A100 datasheet (2021): 312 TF bf16; 1,555 / 2,039 GB/s; NVLink 600 GB/s; PCIe 4.0.
    "a100-40gb": GPUSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, 300e9, "gen4"),
    "a100-80gb": GPUSpec("A100-80GB", 80 * GiB, 2.039e12, 312e12, 300e9, "gen4"),
    # NVIDIA H100 datasheet: SXM5 989 TF bf16, 3.35 TB/s, NVLink 900 GB/s; PCIe 5.0.
    "h100-sxm": GPUSpec("H100-SXM", 80 * GiB, 3.35e12, 989e12, 450e9, "gen5"),
    # Same datasheet, H100 PCIe: 756 TF bf16, 80 GB HBM2e at 2.0 TB/s, NVLink bridge 600 GB/s
    # (pairs of cards), PCIe 5.0 x16.
    "h100-pcie": GPUSpec("H100-PCIe", 80 * GiB, 2.0e12, 756e12, 300e9, "gen5"),
    # NVIDIA H200 datasheet (2023): 141 GB HBM3e, 4.8 TB/s, 989 TF bf16, NVLink 900 GB/s.
    "h200": GPUSpec("H200", 141 * 10**9, 4.8e12, 989e12, 450e9, "gen5"),
    # NVIDIA H20 (HGX H20 product brief, 2024): 96 GB HBM3, 4.0 TB/s, 148 TF bf16, NVLink 900 GB/s.
    "h20": GPUSpec("H20", 96 * 10**9, 4.0e12, 148e12, 450e9, "gen5"),
    # NVIDIA HGX B200 datasheet (2024), per GPU: 180 GB HBM3e, 8 TB/s, bf16 36 PF sparse per 8
    # GPUs -> 2.25 PF dense each; NVLink 5 1.8 TB/s; PCIe 5.0.
    "b200": GPUSpec("B200", 180 * 10**9, 8.0e12, 2250e12, 900e9, "gen5"),
    # AMD Instinct MI300X datasheet (2023): 192 GB HBM3, 5.3 TB/s, 1,307.4 TF bf16 dense;
    # Infinity Fabric: 7 peer links of 128 GB/s (both directions) -> 448 GB/s each way; PCIe 5.0.
    "mi300x": GPUSpec("MI300X", 192 * 10**9, 5.3e12, 1307.4e12, 448e9, "gen5"),
    # NVIDIA Ada whitepaper (2022), GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, bf16 with fp32
    # accumulate 165.2 TF dense; no NVLink; PCIe 4.0 x16; peer-to-peer disabled on GeForce.
    # The driver reports 25,250,627,584 bytes (device_total_memory_bytes of the vLLM 0.19 run
    # in shared/validation/vllm-0.19-rtx4090-llama-3.1-8b/vllm/meta.json).
    "rtx4090": GPUSpec("RTX 4090", 24 * GiB, 1.008e12, 165.2e12, 0.0, "gen4", p2p=False,
                       cuda_total_bytes=25_250_627_584),
    # NVIDIA L40S datasheet (2023): 48 GB GDDR6, 864 GB/s, bf16 362.05 TF dense (733 sparse);
    # no NVLink; PCIe 4.0 x16.
    "l40s": GPUSpec("L40S", 48 * GiB, 864e9, 362.05e12, 0.0, "gen4"),
    # NVIDIA RTX PRO 6000 Blackwell (Server Edition) datasheet (2025): 96 GB GDDR7, 1,792 GB/s,
    # 4 PF FP4 sparse -> bf16 dense 1/8 of it = 500 TF; no NVLink; PCIe 5.0 x16.
    "rtx-pro-6000": GPUSpec("RTX PRO 6000 Blackwell", 96 * GiB, 1.792e12, 500e12, 0.0, "gen5"),
    # AWS EC2 G5 (NVIDIA A10G): 24 GB GDDR6, 600 GB/s; 70 TF bf16 dense (Baseten, "NVIDIA A10
    # vs A10G", 2023: the A10's 125 TF is not reached by the A10G's clocks); no NVLink; PCIe 4.0.
    "a10g": GPUSpec("A10G", 24 * GiB, 600e9, 70e12, 0.0, "gen4"),
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

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers (all KV heads)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        """Weights in one decoder layer: QKV + output projection + MLP (biases and norms ignored)."""
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = d * q + 2 * d * kv + q * d
        mlp = (3 if self.gated_ffn else 2) * d * self.ffn_size
        return attention + mlp

    @property
    def num_params(self) -> int:
        """All weights: layers + token embedding + LM head (counted once when tied)."""
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if not self.gated_ffn else embed  # OPT ties embeddings; Llama does not
        return self.num_layers * self.layer_params + embed + lm_head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


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
}
