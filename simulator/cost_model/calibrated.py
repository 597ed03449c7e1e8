"""Calibrated step-time model: the roofline's parts, each timed from a GPU profile.

``kvsim calibrate`` (``gpu_validation``) measures one GPU and writes a profile of fitted
formulas (the format: ``simulator.cost_model.calibration_profile``). This
model splits a step exactly as the roofline does and takes each part from the profile:

- linear layers: the measured GEMM table of each of the layer's matrices at the step's
  token count (the same ``(n, k)`` shapes the bench timed, from
  ``simulator.cost_model.gemm_shapes``), times the layers; the LM head on the sampled tokens;
- prefill attention: ``a + b * flops`` per layer, ``flops = 4 * q_dim * pairs``;
- decode attention: ``a + b * kv_bytes + c * seq_heads`` per layer, from the paged fit
  at the run's block size, or the contiguous fit;
- block copy (copy-on-write) and swap: the fitted copy kernel and host-link formulas.

What one GPU cannot measure comes from elsewhere: tensor-parallel all-reduces over the
GPUs' link (``interconnect.py``: measured NCCL bus bandwidths; the step's communication part),
the fixed per-step overhead (``RooflineParams``) and the engine's host time (``host_time.py``). Per-GPU shapes under tensor
parallelism round heads up (KV heads are replicated when ``tp`` exceeds them), as engines
shard them.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvsim.simulator.cost_model.base import BatchShape, CostModel, Deployment
from kvsim.simulator.cost_model.calibration_profile import (
    AffineFit,
    Profile,
    ProfileError,
    read_profile,
)
from kvsim.simulator.cost_model.gemm_shapes import kv_heads_per_gpu, layer_gemms, lm_head_gemm
from kvsim.simulator.cost_model.operator_profile import profile_candidates
from kvsim.simulator.cost_model.roofline import RooflineParams, allreduce_coefficients

_CACHE_LIMIT = 65536  # memoised linear-layer times (distinct token counts) before a reset


def load_profile_for(profile: str | Path, base_dir: str | Path | None = None) -> Profile:
    """Read a profile named in a config: a path (absolute, relative to the working directory
    or to ``base_dir``, the config's folder) or the name of a shipped profile in
    ``gpu_validation/profiles`` (``example-a100-80gb`` or ``example-a100-80gb.yaml``)."""
    candidates = profile_candidates(profile, base_dir)
    for path in candidates:
        if path.is_file():
            return read_profile(path)
    tried = ", ".join(str(p) for p in dict.fromkeys(candidates))
    raise ProfileError(f"cost_model.profile: {profile!r} not found (tried {tried})")


def _nearest_block_size(available: list[int], block_size: int) -> int:
    """Nearest measured block size in log2 distance (ties: the smaller)."""
    return min(available, key=lambda b: (abs(math.log2(b) - math.log2(max(block_size, 1))), b))


class CalibratedCostModel(CostModel):
    """Step, swap and copy times read from a calibration profile; needs no GPU."""

    def __init__(self, profile: Profile, deployment: Deployment, *, swap_batched: bool = False,
                 params: RooflineParams | None = None):
        """``deployment.pcie`` is not read: the host link's swaps are measured in ``profile``."""
        d = deployment
        super().__init__(d.model, d.gpu, d.tensor_parallel, d.block_size, d.kernel)
        self.profile = profile
        self.params = params or RooflineParams()
        m, tp, block_size, kernel = d.model, d.tensor_parallel, d.block_size, d.kernel
        self._layers = m.num_layers
        self._gemms = layer_gemms(m, tp)
        self._lm_head = lm_head_gemm(m, tp)
        self._dtype_bytes = m.dtype_bytes
        kv_heads = kv_heads_per_gpu(m, tp)
        q_heads = math.ceil(m.num_heads / tp)
        # Decode attention, per layer: K+V bytes per context token; programs per sequence.
        self._decode = profile.decode_fit(kernel, block_size)  # fails early on an unmeasured size
        self._kv_bytes_per_token_layer = 2 * kv_heads * m.head_dim * m.dtype_bytes
        self._kv_heads = kv_heads
        # Prefill attention, per layer: FLOPs per causal query-key pair (QK^T and PV).
        self._prefill_flops_per_pair = 4 * q_heads * m.head_dim
        # Copy-on-write: copy bandwidth barely depends on block size; use the nearest measured.
        self._copy: AffineFit = profile.block_copy[
            _nearest_block_size(sorted(profile.block_copy), block_size)
        ]
        self._swap = profile.swap_mode(swap_batched)
        self._swap_batched = swap_batched
        # All-reduce (not measurable on one GPU): two ring all-reduces per layer over the link.
        self._allreduce_fixed_s, self._allreduce_token_s = allreduce_coefficients(m, d.link, tp)
        self.host = d.host
        self._host_step_s, self._host_seq_s = d.host.per_step_s, d.host.per_seq_s  # (inlined in step_time)
        self._linear_cache: dict[tuple[int, int], float] = {}

    # --- parts (seconds) ------------------------------------------------------------
    def linear_time(self, tokens: int, sampled: int) -> float:
        """All layers' GEMMs at ``tokens`` tokens plus the LM head on ``sampled`` tokens."""
        key = (tokens, sampled)
        t = self._linear_cache.get(key)
        if t is None:
            gemm = self.profile.gemm_seconds
            d = self._dtype_bytes
            per_layer = sum(gemm(tokens, n, k, d) for n, k in self._gemms)
            t = self._layers * per_layer + gemm(sampled, *self._lm_head, d)
            if len(self._linear_cache) >= _CACHE_LIMIT:
                self._linear_cache.clear()
            self._linear_cache[key] = t
        return t

    def prefill_attention_time(self, pairs: float) -> float:
        if pairs <= 0:
            return 0.0
        return self._layers * self.profile.prefill.seconds(self._prefill_flops_per_pair * pairs)

    def decode_attention_time(self, num_seqs: int, context: int) -> float:
        if num_seqs <= 0:
            return 0.0
        kv_bytes = self._kv_bytes_per_token_layer * context
        return self._layers * self._decode.seconds(kv_bytes, num_seqs * self._kv_heads)

    def allreduce_time(self, tokens: int) -> float:
        return self._allreduce_fixed_s + self._allreduce_token_s * tokens if tokens else 0.0

    # --- CostModel --------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> float:
        tokens = shape.num_tokens
        if tokens == 0:
            return 0.0
        sampled = shape.prefill_seqs + shape.decode_seqs
        return (
            self.linear_time(tokens, sampled)
            + self.prefill_attention_time(shape.prefill_attn_pairs)
            + self.decode_attention_time(shape.decode_seqs, shape.decode_context)
            + self.allreduce_time(tokens)
            + self.params.step_overhead_s
            + (self._host_step_s + self._host_seq_s * sampled)
        )

    def communication_coefficients(self) -> tuple[float, float]:
        return self._allreduce_fixed_s, self._allreduce_token_s


    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        d = self._decode
        a = (
            self.linear_time(num_seqs, num_seqs)
            + self._layers * (d.a + d.c * num_seqs * self._kv_heads)
            + self.allreduce_time(num_seqs)
            + self.params.step_overhead_s
            + self.host.seconds(num_seqs)
        )
        return a, self._layers * d.b * self._kv_bytes_per_token_layer

    def swap_time(self, num_blocks: int, num_slots: int | None = None) -> float:
        """Measured host-link formula, averaged over the two directions.

        Per block mode: ``2 * layers * num_blocks`` transfers (K and V of each chunk in each
        layer); batched: ``layers`` transfers (one gathered run per layer).
        """
        if num_blocks <= 0:
            return 0.0
        slots = num_blocks * self.block_size if num_slots is None else num_slots
        nbytes = slots * self._kv_bytes_per_token_layer * self._layers
        transfers = self._layers if self._swap_batched else 2 * self._layers * num_blocks
        s = self._swap
        return 0.5 * (s.out.seconds(transfers, nbytes) + s.into.seconds(transfers, nbytes))

    def copy_time(self, num_blocks: int) -> float:
        """One copy launch over all layers: ``a + b * bytes`` (bytes copied)."""
        if num_blocks <= 0:
            return 0.0
        nbytes = num_blocks * self.block_size * self._kv_bytes_per_token_layer * self._layers
        return self._copy.seconds(nbytes)
