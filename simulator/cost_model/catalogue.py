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
    memory_bytes: int  # HBM capacity
    hbm_bandwidth: float  # bytes/s, datasheet peak
    peak_flops: float  # FLOP/s, dense fp16/bf16 tensor core
    nvlink_bandwidth: float  # bytes/s per direction, per GPU
    pcie: str  # host link generation, key of PCIE


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

# NVIDIA datasheets: A100 (2020/2021), H100 SXM5, H200 SXM (2023). NVLink figures are
# per GPU per direction (A100: 600 GB/s total = 300 GB/s each way; H100/H200: 450).
GPUS = {
    "a100-40gb": GPUSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, 300e9, "gen4"),
    "a100-80gb": GPUSpec("A100-80GB", 80 * GiB, 2.039e12, 312e12, 300e9, "gen4"),
    "h100-sxm": GPUSpec("H100-SXM", 80 * GiB, 3.35e12, 989e12, 450e9, "gen5"),
    "h200": GPUSpec("H200", 141 * 10**9, 4.8e12, 989e12, 450e9, "gen5"),
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers (all KV heads)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        """Weights in one decoder layer: QKV + output projection + MLP (biases ignored)."""
        d, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = d * d + 2 * d * kv + d * d
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
}
