"""How many KV token slots a replica has: GPU memory minus weights and activations.

Per GPU: ``memory * gpu_memory_utilization - weights / tp - activation_reserve``;
a replica of ``tp`` GPUs holds ``tp`` times that (each GPU stores its share of
the KV heads). Slots = KV bytes / KV bytes per token (all layers, K and V).
"""

from __future__ import annotations

from simulator.cost_model.catalogue import GiB, GPUSpec, ModelSpec


def kv_cache_bytes(model: ModelSpec, gpu: GPUSpec, tensor_parallel: int, utilization: float,
                   activation_reserve_bytes: float) -> float:
    """Bytes left for KV on one replica (may be <= 0 when the model does not fit)."""
    per_gpu = gpu.memory_bytes * utilization - model.weight_bytes / tensor_parallel - activation_reserve_bytes
    return per_gpu * tensor_parallel


def kv_slots(kv_bytes: float, model: ModelSpec) -> int:
    """Token slots in ``kv_bytes`` of KV memory."""
    return int(kv_bytes // model.kv_bytes_per_token)


def swap_slots(swap_space_gb: float, tensor_parallel: int, model: ModelSpec) -> int:
    """Token slots in the CPU swap space (``swap_space_gb`` GiB per GPU)."""
    return int(swap_space_gb * GiB * tensor_parallel // model.kv_bytes_per_token)
