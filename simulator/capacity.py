"""How many KV blocks a replica has, computed the way vLLM computes it.

vLLM (v1 ``Worker.determine_available_memory`` with ``vllm/utils/mem_utils.py``'s
``memory_profiling``) loads the weights, runs one dummy forward pass of
``max_num_batched_tokens`` tokens spread over ``min(max_num_seqs, tokens)`` requests and the
sampler on one row per request, and gives the KV cache what is left of the memory it may
use. Per GPU, in bytes::

    kv     = total_memory * gpu_memory_utilization
             - weights - peak_activation - non_torch - cuda_graphs
    blocks = floor(kv / (block_size * KV bytes of one token on this GPU))

``total_memory`` is what the CUDA driver reports (``torch.cuda.mem_get_info``), a little
under the datasheet capacity; ``peak_activation`` is the rise of PyTorch's peak allocation
during the dummy pass (given, or estimated by :func:`estimated_peak_activation_bytes`);
``non_torch`` is memory the process gains outside PyTorch's allocator meanwhile (kernel
modules, library workspaces); ``cuda_graphs`` counts only where vLLM is told to estimate it
before sizing the cache (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``; by default it
captures the graphs after, out of the memory above the utilization). A replica of ``tp``
GPUs has the smallest per-GPU count of blocks, each block spanning all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.simulator.cost_model.catalogue import GiB, GPUSpec, ModelSpec
from kvsim.simulator.cost_model.gemm_shapes import kv_heads_per_gpu, layer_gemms, lm_head_gemm
from kvsim.simulator.cost_model.moe import ExpertGroup, moe_weight_bytes_per_gpu

FP32_BYTES = 4


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as vLLM splits it before allocating the KV cache (bytes)."""

    total_bytes: int  # as the CUDA driver reports it
    gpu_memory_utilization: float
    weight_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    block_bytes: int  # one KV block on this GPU: block_size tokens, all layers, K and V

    @property
    def requested_bytes(self) -> float:
        return self.total_bytes * self.gpu_memory_utilization

    @property
    def kv_bytes(self) -> float:
        """Bytes left for the KV cache (<= 0 when the model does not fit)."""
        used = self.weight_bytes + self.peak_activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes
        return self.requested_bytes - used

    @property
    def num_gpu_blocks(self) -> int:
        """Whole KV blocks in :attr:`kv_bytes` (0 when nothing is left)."""
        return max(0, math.floor(self.kv_bytes / self.block_bytes))

    def breakdown_gib(self) -> dict[str, float]:
        """Each term in GiB, for reports."""
        return {
            "requested": self.requested_bytes / GiB,
            "weights": self.weight_bytes / GiB,
            "peak_activation": self.peak_activation_bytes / GiB,
            "non_torch": self.non_torch_bytes / GiB,
            "cuda_graphs": self.cuda_graph_bytes / GiB,
            "kv_cache": self.kv_bytes / GiB,
        }


def block_bytes_per_gpu(model: ModelSpec, tp: int, block_size: int) -> int:
    """Bytes of one KV block on one GPU: ``block_size`` tokens, K and V, every layer, in the KV
    cache's dtype (``ModelSpec.kv_bytes_per_token_with`` this GPU's KV heads; an MLA latent is
    whole on every GPU, as vLLM keeps it)."""
    return block_size * model.kv_bytes_per_token_with(kv_heads_per_gpu(model, tp))


def weight_bytes_per_gpu(model: ModelSpec, tp: int, group: ExpertGroup | None = None) -> int:
    """Weights one GPU holds, as vLLM shards them, plus its position table.

    A mixture-of-experts model's MoE layers hold, instead of a dense MLP, the GPU's share of
    every expert (``moe.moe_weight_bytes_per_gpu`` over ``group``: by default the replica's
    ``tp`` GPUs, experts split by tensor parallelism).

    The layers' matrices as :func:`~simulator.cost_model.gemm_shapes.layer_gemms` splits them
    (KV projections replicated when ``tp`` exceeds the KV heads), the token embedding and the
    LM head split by vocabulary (one matrix when tied, as OPT's), the norms' weights (two per
    layer and a final one, replicated), and the position table: rotary models (the gated-MLP
    families here: Llama, Qwen, Mistral) keep a cos/sin cache of ``max_position_embeddings x
    head_dim``, OPT a learned ``max_position_embeddings x hidden`` table. Biases are ignored.
    """
    gemms = [n * k for n, k in layer_gemms(model, tp)]
    layers = model.num_layers * sum(gemms)
    moe = 0.0
    if model.moe is not None:  # MoE layers: no dense MLP (the last two GEMMs), their experts instead
        layers -= model.moe.moe_layers(model.num_layers) * sum(gemms[2:])
        moe = moe_weight_bytes_per_gpu(model, group or ExpertGroup(tp))
    n, k = lm_head_gemm(model, tp)
    vocab = (1 if model.tied_embeddings else 2) * n * k  # Llama-family heads are untied; OPT ties them
    norms = (2 * model.num_layers + 1) * model.hidden_size
    positions = model.max_seq_len * (model.head_dim if model.gated_ffn else model.hidden_size)
    return round((layers + vocab + norms + positions) * model.dtype_bytes + moe)


def estimated_peak_activation_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                                    max_num_seqs: int) -> int:
    """The largest set of tensors alive at once in vLLM's profiling pass, on one GPU.

    ``T = max_num_batched_tokens`` tokens in ``R = min(max_num_seqs, T)`` requests
    (``GPUModelRunner._dummy_run``); ``d`` the model dtype's bytes; ``H`` hidden size, ``I``
    the MLP's intermediate size, ``V`` the vocabulary. Two candidates; the larger counts:

    - inside a decoder layer's MLP: the residual and the normed input (``2 T H``), the fused
      gate/up output (``2 T I/tp``) and the activation's output (``T I/tp``), all in ``d``
      (a 2-matrix MLP: ``fc1``'s output and the activation's, ``2 T I/tp``);
    - sampling (``_dummy_sampler_run``): logits are computed for the last token of each request
      only, ``R x V`` in ``d`` (gathered to the full vocabulary under TP), then the sampler's
      float32 copy, the probabilities and the exponential noise of random sampling (three
      ``R x V`` float32 tensors), while the pass's output ``T x H`` and the ``R`` sampled
      hidden rows are still held.

    Not counted: the sort-based top-k/top-p filter some vLLM versions run in this pass on the
    dummy requests (sorted logits, int64 indices, masks: about ``R V x 18`` bytes more), and
    buffers torch.compile allocates while it compiles and autotunes in the same pass.
    """
    t = max_num_batched_tokens
    r = min(max_num_seqs, t)
    d, h = model.dtype_bytes, model.hidden_size
    ffn = math.ceil(model.ffn_size / tp)
    mlp = t * (2 * h + (3 if model.gated_ffn else 2) * ffn) * d
    sampler = t * h * d + r * h * d + r * model.vocab_size * (d + 3 * FP32_BYTES)
    return max(mlp, sampler)


def memory_budget(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    total_bytes: int | None = None,
    peak_activation_bytes: int | None = None,
    non_torch_bytes: int = 0,
    cuda_graph_bytes: int = 0,
    expert_group: ExpertGroup | None = None,
) -> MemoryBudget:
    """One GPU's budget; ``total_bytes`` None: what the driver reports for this GPU where the
    catalogue knows it, else the datasheet capacity; ``peak_activation_bytes`` None: estimated;
    ``expert_group``: how a MoE model's experts are split (None: over the ``tensor_parallel`` GPUs)."""
    if peak_activation_bytes is None:
        peak_activation_bytes = estimated_peak_activation_bytes(
            model, tensor_parallel, max_num_batched_tokens, max_num_seqs
        )
    return MemoryBudget(
        total_bytes=gpu.reported_memory_bytes if total_bytes is None else total_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_bytes=weight_bytes_per_gpu(model, tensor_parallel, expert_group),
        peak_activation_bytes=peak_activation_bytes,
        non_torch_bytes=non_torch_bytes,
        cuda_graph_bytes=cuda_graph_bytes,
        block_bytes=block_bytes_per_gpu(model, tensor_parallel, block_size),
    )


def kv_slots(kv_bytes: float, model: ModelSpec) -> int:
    """Token slots in ``kv_bytes`` of KV memory (all GPUs of a replica, all KV heads)."""
    return int(kv_bytes // model.kv_bytes_per_token)


def swap_slots(swap_space_gib: float, tensor_parallel: int, model: ModelSpec) -> int:
    """Token slots in the CPU swap space (``swap_space_gib`` GiB per GPU)."""
    return int(swap_space_gib * GiB * tensor_parallel // model.kv_bytes_per_token)
