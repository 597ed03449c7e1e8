"""The matrix shapes of the catalogue models' linear layers, as the benchmark times them.

Plain Python (no torch): the simulator's calibrated cost model asks the same function
which GEMMs a layer runs, so the shapes it looks up are exactly the shapes measured.

The models are the simulator's catalogue (``simulator/cost_model/catalogue.py``, plain
Python with no simpy or pydantic: the one direction ``gpu_validation -> simulator.cost_model``
DESIGN.md allows), so the two lists cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.cost_model.catalogue import MODELS


@dataclass(frozen=True)
class ModelShape:
    """Transformer dimensions from each model's published Hugging Face config."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    gated_ffn: bool  # SwiGLU: gate and up projections (fused), then down
    head_dim: int = 0  # 0: hidden_size // num_heads


MODEL_SHAPES = {
    key: ModelShape(m.name, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_size,
                    m.vocab_size, m.gated_ffn, m.head_dim)
    for key, m in MODELS.items()
}

TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)


def layer_gemms(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    ffn_size: int,
    gated_ffn: bool,
    tp: int = 1,
    head_dim: int = 0,
) -> list[tuple[int, int]]:
    """``(n, k)`` of each GEMM one decoder layer runs on one of ``tp`` GPUs (Megatron split).

    ``y[m, n] = x[m, k] @ w[k, n]`` with ``m`` the tokens of the step. Column-parallel
    layers (fused QKV, fused gate+up) split ``n``; row-parallel ones (output projection,
    down projection) split ``k``. Heads that do not divide evenly round up (KV heads are
    replicated when ``tp`` exceeds them). ``head_dim`` 0: ``hidden_size // num_heads``.
    """
    head_dim = head_dim or hidden_size // num_heads
    q_heads = math.ceil(num_heads / tp)
    kv_heads = math.ceil(num_kv_heads / tp)
    ffn = math.ceil(ffn_size / tp)
    return [
        ((q_heads + 2 * kv_heads) * head_dim, hidden_size),  # fused QKV projection
        (hidden_size, q_heads * head_dim),  # attention output projection
        ((2 if gated_ffn else 1) * ffn, hidden_size),  # (gate+)up projection / fc1
        (hidden_size, ffn),  # down projection / fc2
    ]


def lm_head_gemm(hidden_size: int, vocab_size: int, tp: int = 1) -> tuple[int, int]:
    """``(n, k)`` of the LM head (vocabulary split over ``tp`` GPUs), run on sampled tokens."""
    return (math.ceil(vocab_size / tp), hidden_size)


def model_gemms(shape: ModelShape, tp: int = 1) -> list[tuple[int, int]]:
    """All distinct GEMM shapes of one model at one tensor-parallel degree."""
    gemms = layer_gemms(
        shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.ffn_size, shape.gated_ffn, tp,
        shape.head_dim,
    )
    gemms.append(lm_head_gemm(shape.hidden_size, shape.vocab_size, tp))
    return list(dict.fromkeys(gemms))


def catalogue_gemms(tp_degrees: tuple[int, ...] = TENSOR_PARALLEL_DEGREES) -> list[tuple[int, int]]:
    """Every distinct ``(n, k)`` the catalogue models run at the given TP degrees, sorted."""
    shapes = {g for s in MODEL_SHAPES.values() for tp in tp_degrees for g in model_gemms(s, tp)}
    return sorted(shapes)
