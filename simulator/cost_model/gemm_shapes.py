"""The matrix shapes of a model's linear layers: what the calibration bench times and what
the calibrated cost model looks up, so the two use one list.

Plain Python (no torch, simpy or pydantic): ``gpu_validation`` imports it on a GPU machine
that has none of the simulator's dependencies (DESIGN.md "Layout and layering"). The models
are the catalogue's (``simulator.cost_model.catalogue``); there is no second table.
"""

from __future__ import annotations

import math

from kvsim.simulator.cost_model.catalogue import MODELS, ModelSpec

TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each of ``tp`` GPUs holds: its share, rounded up, so one replicated head when
    ``tp`` exceeds them (vLLM's ``max(1, kv_heads // tp)`` on every split it accepts)."""
    return math.ceil(model.num_kv_heads / tp)


def layer_gemms(model: ModelSpec, tp: int = 1) -> list[tuple[int, int]]:
    """``(n, k)`` of each GEMM one decoder layer runs on one of ``tp`` GPUs (Megatron split).

    ``y[m, n] = x[m, k] @ w[k, n]`` with ``m`` the tokens of the step. Column-parallel
    layers (fused QKV, fused gate+up) split ``n``; row-parallel ones (output projection,
    down projection) split ``k``. Heads that do not divide evenly round up (KV heads are
    replicated when ``tp`` exceeds them), as engines shard them.
    """
    q_heads = math.ceil(model.num_heads / tp)
    kv_heads = kv_heads_per_gpu(model, tp)
    ffn = math.ceil(model.ffn_size / tp)
    d, head_dim = model.hidden_size, model.head_dim
    return [
        ((q_heads + 2 * kv_heads) * head_dim, d),  # fused QKV projection
        (d, q_heads * head_dim),  # attention output projection
        ((2 if model.gated_ffn else 1) * ffn, d),  # (gate+)up projection / fc1
        (d, ffn),  # down projection / fc2
    ]


def lm_head_gemm(model: ModelSpec, tp: int = 1) -> tuple[int, int]:
    """``(n, k)`` of the LM head (vocabulary split over ``tp`` GPUs), run on sampled tokens."""
    return (math.ceil(model.vocab_size / tp), model.hidden_size)


def model_gemms(model: ModelSpec, tp: int = 1) -> list[tuple[int, int]]:
    """All distinct GEMM shapes of one model at one tensor-parallel degree."""
    return list(dict.fromkeys([*layer_gemms(model, tp), lm_head_gemm(model, tp)]))


def catalogue_gemms(tp_degrees: tuple[int, ...] = TENSOR_PARALLEL_DEGREES) -> list[tuple[int, int]]:
    """Every distinct ``(n, k)`` the catalogue's dense models run at the given TP degrees, sorted
    (the calibrated model times no mixture-of-experts block: MoE models are not benched)."""
    return sorted({g for m in MODELS.values() if m.moe is None for tp in tp_degrees for g in model_gemms(m, tp)})
