"""Mixture-of-experts: the shape of a MoE block, its weights on each GPU, and its time.

A MoE decoder layer replaces the dense MLP by a router (one ``hidden x E`` linear), ``E``
routed experts (each a small MLP of ``expert_ffn_size``), of which each token uses
``k = experts_per_token``, and optionally shared experts every token passes through::

    token --router--> top-k of E experts --each: gate/up, act, down--> weighted sum (+ shared)

What it costs, and why (DESIGN.md "Cost model", mixture-of-experts):

- **Memory**: every expert's weights are resident, used or not, so ``E`` experts count in
  the budget (``moe_weight_bytes_per_gpu``); the KV cache gets what is left.
- **Experts touched**: a step's ``T`` tokens each pick ``k`` distinct of ``E`` experts. With
  routing taken as uniform and independent per token, one token misses a given expert with
  probability ``1 - k/E`` and all ``T`` miss it with ``(1 - k/E)^T``; summing over the ``E``
  experts (linearity of expectation) the expected number of distinct experts touched is
  ``E (1 - (1 - k/E)^T)``, the classical occupancy (balls-into-bins) expectation
  (``expected_experts_touched``). Real routers are not uniform; a skewed router touches fewer.
- **Time, roofline** (``moe_roofline_layer_s``): the weights of every touched expert are
  read once, ``touched x expert bytes``; FLOPs are ``2 x T x k x expert params`` (plus the
  router's ``2 T hidden E`` and the shared experts'), except that a grouped GEMM computes
  whole tiles of token rows per expert: vLLM's fused-MoE Triton kernel pads each expert's
  rows to a multiple of ``BLOCK_SIZE_M`` (``moe_align_block_size``), and its untuned default
  block is 16 rows while the step's tokens are at most ``E``, else 64
  (vllm-project/vllm ``vllm/model_executor/layers/fused_moe/fused_moe.py``,
  ``get_default_config``). So the computed rows are ``touched x tile x ceil(rows per touched
  expert / tile)`` (``grouped_gemm_rows``): at a few tokens per expert most of a tile is
  padding, which is the grouped GEMM's low efficiency at small per-expert token counts. The
  block takes ``max(FLOPs / (peak x compute_efficiency), bytes / (bandwidth x
  memory_efficiency))`` with the roofline's own efficiencies (no constant of its own).
  Against the measured block (the RTX PRO 6000 ``moe.csv`` below, Qwen3-30B-A3B, at each
  measured ``(tokens, activated_experts)``; datasheet peaks with the across-profiles fit
  ``measured-rtx4090-a100`` as it was then, 0.761 / 1.0, which saw no MoE kernel) the roofline
  is fast at every point:
  median 31%, from 16% (one token) to 58% (256 tokens on 8 experts): the fused-MoE kernel
  reaches well under the bandwidth the dense GEMMs do. Measured tables, where a profile has
  them, are the better answer; ``tests/simulator/cost_model/test_moe.py`` checks the formulas by hand.
- **Time, profiled** (``MoeTable``): LLMServingSim's ``moe.csv`` times the whole MoE block
  (router and fused experts, profiled as one unit) on one GPU by ``tokens`` and
  ``activated_experts`` (the distinct experts touched), measured at tensor-parallel degree 1
  (``shared/validation/profiles-rtxpro6000/FORMAT-upstream.md``). A step is looked up at its
  tokens and its expected experts touched (``MoeTable``: the grid is a triangle, at most
  ``tokens x k`` experts measured; ``MoeProfiled``: how parallelism maps onto it).

Parallelism (``ExpertGroup``), as vLLM lays a MoE model out
(docs.vllm.ai, "Data Parallel Deployment" and "Expert Parallel Deployment"):

- Attention and dense layers are split by tensor parallelism within one engine (``tp``
  GPUs). With data parallelism (``dp`` engines, each its own scheduler and KV pool behind one
  front end: kvsim's replicas, ``hardware.data_parallel``), the MoE layers of all engines
  form one group of ``dp x tp`` GPUs whose forward passes are aligned.
- In that group the routed experts are split by tensor parallelism (each GPU holds
  ``1/group`` of every expert: vLLM's default) or, with ``hardware.expert_parallel``, by
  expert parallelism (each GPU holds ``E/group`` whole experts). Shared experts and the
  router are split like the dense layers (by ``tp``; the router is replicated).
- Tokens: a group GPU serves the tokens of all ``dp`` engines, taken as each engine's own
  step size (``T x dp``; kvsim's replicas are not stepped in lockstep, so the other engines'
  batches are assumed the size of this one's, and the dummy passes vLLM runs on idle
  engines are not modelled). Under expert parallelism a GPU computes ``1/group`` of the
  token-expert pairs on ``1/group`` of the experts touched.
- Communication: with ``dp > 1`` every MoE layer adds two collectives over the ``dp``
  engines, a dispatch before the experts and a combine after (``ep_collectives_s``). vLLM's
  default all-to-all backend (``allgather_reducescatter``) realizes them as an all-gather
  and a reduce-scatter of the group's hidden states, ``T x dp x hidden x dtype`` bytes each;
  both are timed with the link's all-to-all numbers, ``(n-1)/n x bytes / bus bandwidth +
  latency`` (``interconnect.link_all_to_all_s``). Within one engine (``dp == 1``) the
  tensor-parallel all-reduce after the MLP already combines the experts' outputs.

Plain Python (no numpy, simpy or pydantic): ``gpu_validation`` may import the cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.simulator.cost_model.interconnect import LinkSpec, link_all_to_all_s
from kvsim.simulator.cost_model.interpolation import bracket, lerp

if TYPE_CHECKING:  # (only in annotations: the catalogue imports this module)
    from kvsim.simulator.cost_model.catalogue import ModelSpec

#: vLLM fused-MoE's untuned bf16 tile of token rows (``get_default_config``): 16 while the
#: step's tokens are at most the number of experts, else 64 (module docstring).
SMALL_TILE_ROWS = 16
LARGE_TILE_ROWS = 64

#: MXFP4 (OCP Microscaling Formats v1.0, 2023): blocks of 32 FP4 (E2M1) values sharing one
#: 8-bit (E8M0) scale, so 4 + 8/32 = 4.25 bits per weight.
MXFP4_BYTES = 4.25 / 8
#: FP8 E4M3 weights with one fp32 scale per 128x128 block (deepseek-ai/DeepSeek-V3
#: config.json ``quantization_config``: fmt e4m3, weight_block_size [128, 128]; the DeepSeek-V3
#: technical report, 2024, section 3.3, FP8 training): 1 + 4/16384 bytes per weight.
FP8_BLOCK128_BYTES = 1 + 4 / (128 * 128)


@dataclass(frozen=True)
class MoESpec:
    """The MoE part of a model's shape (Hugging Face config keys in brackets).

    ``num_experts`` routed experts (``num_experts``, ``num_local_experts``,
    ``n_routed_experts``), ``experts_per_token`` of them per token (``num_experts_per_tok``),
    each an MLP of ``expert_ffn_size`` (``moe_intermediate_size``; Mixtral and gpt-oss:
    ``intermediate_size``); ``shared_ffn_size``: the shared experts' intermediate size in all
    (DeepSeek: ``n_shared_experts x moe_intermediate_size``), 0 when none; ``dense_layers``:
    the first layers keep a dense MLP of the model's ``ffn_size`` (``first_k_dense_replace``);
    ``expert_bytes_per_param``: bytes of one routed-expert weight when the experts are stored
    in another format than the model's dtype (gpt-oss: MXFP4), None: the model's."""

    num_experts: int
    experts_per_token: int
    expert_ffn_size: int
    shared_ffn_size: int = 0
    dense_layers: int = 0
    expert_bytes_per_param: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be from 1 to num_experts "
                             f"({self.num_experts})")
        if self.expert_ffn_size < 1 or self.shared_ffn_size < 0 or self.dense_layers < 0:
            raise ValueError("expert_ffn_size must be >= 1, shared_ffn_size and dense_layers >= 0")

    def moe_layers(self, num_layers: int) -> int:
        """Decoder layers whose MLP is this MoE block."""
        return num_layers - self.dense_layers


def hf_moe_shape(hf: dict) -> dict | None:
    """``model.shape.moe`` (the config's keys) from a Hugging Face ``config.json`` dict, or None
    for a model without routed experts: Qwen2/3-MoE (``num_experts``, ``moe_intermediate_size``,
    ``shared_expert_intermediate_size``), Mixtral and gpt-oss (``num_local_experts``, experts of
    ``intermediate_size``), DeepSeek (``n_routed_experts``, ``n_shared_experts``,
    ``first_k_dense_replace``); MXFP4-quantized experts (``quantization_config.quant_method``
    ``mxfp4``, gpt-oss) at 4.25 bits. MoE layers interleaved otherwise than "the first k dense"
    (``mlp_only_layers``, ``decoder_sparse_step`` > 1) are refused: ValueError naming the key."""
    experts = hf.get("num_experts") or hf.get("num_local_experts") or hf.get("n_routed_experts")
    if not experts:
        return None
    k = hf.get("num_experts_per_tok") or hf.get("experts_per_token")
    size = hf.get("moe_intermediate_size") or hf.get("intermediate_size")
    if not k or not size:
        raise ValueError("config.json: num_experts_per_tok / moe_intermediate_size: missing for a MoE model")
    if hf.get("mlp_only_layers") or (hf.get("decoder_sparse_step") or 1) > 1:
        raise ValueError("config.json: mlp_only_layers / decoder_sparse_step: dense layers between MoE layers "
                         "are not modelled (only the first layers: first_k_dense_replace)")
    shared = hf.get("shared_expert_intermediate_size") or (hf.get("n_shared_experts") or 0) * size
    out = {"num_experts": int(experts), "experts_per_token": int(k), "expert_intermediate_size": int(size),
           "shared_expert_intermediate_size": int(shared), "dense_layers": int(hf.get("first_k_dense_replace") or 0)}
    if str((hf.get("quantization_config") or {}).get("quant_method", "")).lower() == "mxfp4":
        out["expert_bytes_per_param"] = MXFP4_BYTES
    return out


def mlp_params(hidden: int, ffn: int, gated: bool) -> int:
    """Weights of one MLP of intermediate size ``ffn``: gate, up and down (3) or fc1, fc2 (2)."""
    return (3 if gated else 2) * hidden * ffn


def expert_params(model: ModelSpec) -> int:
    """Weights of one routed expert."""
    return mlp_params(model.hidden_size, model.moe.expert_ffn_size, model.gated_ffn)


def expert_bytes(model: ModelSpec) -> float:
    """Bytes of one routed expert's weights."""
    per = model.moe.expert_bytes_per_param
    return expert_params(model) * (model.dtype_bytes if per is None else per)


def router_params(model: ModelSpec) -> int:
    return model.hidden_size * model.moe.num_experts


def shared_params(model: ModelSpec) -> int:
    return mlp_params(model.hidden_size, model.moe.shared_ffn_size, model.gated_ffn)


def block_params(model: ModelSpec) -> int:
    """All weights of one MoE block: router, every routed expert, shared experts."""
    return router_params(model) + model.moe.num_experts * expert_params(model) + shared_params(model)


def active_block_params(model: ModelSpec) -> int:
    """Weights one token passes through in a MoE block: router, ``k`` experts, shared."""
    return router_params(model) + model.moe.experts_per_token * expert_params(model) + shared_params(model)


def expected_experts_touched(tokens: float, experts_per_token: int, num_experts: int) -> float:
    """Expected distinct experts ``tokens`` tokens route to, each to ``experts_per_token`` of
    ``num_experts`` uniformly: ``E (1 - (1 - k/E)^T)`` (module docstring). 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    e, k = num_experts, experts_per_token
    return e * (1.0 - (1.0 - k / e) ** tokens)


def grouped_gemm_rows(pairs: float, touched: float, tile: int) -> float:
    """Token rows a grouped GEMM computes for ``pairs`` token-expert pairs spread over
    ``touched`` experts: each expert's rows rounded up to whole tiles of ``tile`` rows."""
    if pairs <= 0 or touched <= 0:
        return 0.0
    return touched * tile * math.ceil(pairs / touched / tile - 1e-9)


@dataclass(frozen=True)
class ExpertGroup:
    """How one engine's MoE layers are spread (module docstring, "Parallelism"):
    ``tensor_parallel`` GPUs per engine, ``data_parallel`` engines whose MoE layers form one
    group, experts split by expert parallelism (``expert_parallel``) or tensor parallelism."""

    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    @property
    def size(self) -> int:
        """GPUs the routed experts are split over."""
        return self.tensor_parallel * self.data_parallel


def moe_weight_bytes_per_gpu(model: ModelSpec, group: ExpertGroup) -> float:
    """Bytes of one GPU's share of all MoE blocks: routed experts split over the group (whole
    experts with expert parallelism, slices of each without; an uneven split rounds up),
    shared experts split by ``tensor_parallel``, the router replicated."""
    moe, layers = model.moe, model.moe.moe_layers(model.num_layers)
    if group.expert_parallel:
        routed = math.ceil(moe.num_experts / group.size) * expert_bytes(model)
    else:
        routed = moe.num_experts * expert_bytes(model) / group.size
    dense = (router_params(model) + shared_params(model) / group.tensor_parallel) * model.dtype_bytes
    return layers * (routed + dense)


@dataclass(frozen=True)
class MoeWork:
    """One GPU's share of one MoE layer for a step: the group's ``tokens``, the token-expert
    ``pairs`` and distinct ``experts`` touched on this GPU, and the share of each expert's
    weights it holds (``1/group`` of every expert without expert parallelism, else 1)."""

    tokens: float
    pairs: float
    experts: float
    shard: float


def moe_work(model: ModelSpec, group: ExpertGroup, tokens: int) -> MoeWork:
    """What one GPU of ``group`` does in one MoE layer when its engine's step has ``tokens``."""
    moe = model.moe
    tg = tokens * group.data_parallel
    touched = expected_experts_touched(tg, moe.experts_per_token, moe.num_experts)
    pairs = tg * moe.experts_per_token
    if group.expert_parallel:
        return MoeWork(tg, pairs / group.size, touched / group.size, 1.0)
    return MoeWork(tg, pairs, touched, 1.0 / group.size)


def moe_roofline_layer_s(model: ModelSpec, group: ExpertGroup, tokens: int, flops_per_s: float,
                         bytes_per_s: float) -> float:
    """Seconds of one MoE layer on one GPU (module docstring, "Time, roofline"):
    ``flops_per_s`` and ``bytes_per_s`` are the GPU's achieved compute and bandwidth."""
    if tokens <= 0:
        return 0.0
    w = moe_work(model, group, tokens)
    tile = SMALL_TILE_ROWS if w.tokens <= model.moe.num_experts else LARGE_TILE_ROWS
    rows = grouped_gemm_rows(w.pairs, w.experts, tile)
    tp = group.tensor_parallel
    flops = (2 * rows * expert_params(model) * w.shard + 2 * w.tokens * router_params(model)
             + 2 * tokens * shared_params(model) / tp)
    nbytes = (w.experts * expert_bytes(model) * w.shard
              + (router_params(model) + shared_params(model) / tp) * model.dtype_bytes)
    return max(flops / flops_per_s, nbytes / bytes_per_s)


def ep_collectives_s(model: ModelSpec, group: ExpertGroup, link: LinkSpec | None, tokens: int) -> float:
    """Seconds of a step's dispatch and combine collectives over the ``data_parallel``
    engines: two per MoE layer, each of the group's hidden states (module docstring); 0
    within one engine or for an empty step."""
    dp = group.data_parallel
    if dp <= 1 or tokens <= 0:
        return 0.0
    if link is None:
        raise ValueError(f"data-parallel MoE over {dp} engines needs a GPU-to-GPU link (hardware.interconnect)")
    nbytes = tokens * dp * model.hidden_size * model.dtype_bytes
    return 2 * model.moe.moe_layers(model.num_layers) * link_all_to_all_s(link, nbytes, dp)


def moe_weight_bytes(model: ModelSpec) -> float:
    """Bytes of every MoE block of the model (all GPUs together)."""
    moe = model.moe
    dense = (router_params(model) + shared_params(model)) * model.dtype_bytes
    return moe.moe_layers(model.num_layers) * (moe.num_experts * expert_bytes(model) + dense)


class MoeRoofline:
    """A step's MoE layers on one GPU of ``group``, by the roofline (module docstring):
    ``compute_s(tokens)``, every MoE layer's block, and ``communication_s(tokens)``, the
    dispatch and combine collectives, for an engine step of ``tokens`` tokens. The GPU
    reaches ``flops_per_s`` and ``bytes_per_s``; ``link`` joins the data-parallel engines."""

    def __init__(self, model: ModelSpec, group: ExpertGroup, flops_per_s: float, bytes_per_s: float,
                 link: LinkSpec | None):
        self.model, self.group, self.link = model, group, link
        self.layers = model.moe.moe_layers(model.num_layers)
        self._flops, self._bw = flops_per_s, bytes_per_s
        self._cache: dict[int, float] = {}
        dp = group.data_parallel
        if dp > 1 and link is None:
            raise ValueError(f"data-parallel MoE over {dp} engines needs a GPU-to-GPU link (hardware.interconnect)")

    def compute_s(self, tokens: int) -> float:
        t = self._cache.get(tokens)
        if t is None:
            t = self.layers * moe_roofline_layer_s(self.model, self.group, tokens, self._flops, self._bw)
            if len(self._cache) >= 65536:
                self._cache.clear()
            self._cache[tokens] = t
        return t

    def communication_s(self, tokens: int) -> float:
        return ep_collectives_s(self.model, self.group, self.link, tokens)

    def communication_coefficients(self) -> tuple[float, float]:
        """``(fixed_s, per_token_s)`` with ``communication_s(T) = fixed + per_token x T`` (T > 0)."""
        if self.group.data_parallel <= 1:
            return 0.0, 0.0
        fixed = self.communication_s(1) - (self.communication_s(2) - self.communication_s(1))
        return fixed, self.communication_s(2) - self.communication_s(1)


@dataclass(frozen=True)
class MoeGrid:
    """A measured MoE block's time (s) on the product of ``tokens`` x ``activated_experts``
    (C order; None: not measured: the profile times at most ``tokens x k`` experts)."""

    tokens: tuple[int, ...]
    activated_experts: tuple[int, ...]
    seconds: tuple[float | None, ...]

    def column(self, j: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The measured ``(tokens, seconds)`` at ``activated_experts[j]``."""
        n = len(self.activated_experts)
        pts = [(t, s) for i, t in enumerate(self.tokens) if (s := self.seconds[i * n + j]) is not None]
        return tuple(p[0] for p in pts), tuple(p[1] for p in pts)

    @property
    def num_experts(self) -> int:
        """The most experts measured: the model's routed experts (a full grid reaches them)."""
        return max(self.activated_experts)

    @property
    def experts_per_token(self) -> int:
        """Experts measured at the fewest tokens: one token touches exactly ``k``."""
        return min(a for j, a in enumerate(self.activated_experts) if self.seconds[j] is not None) \
            if self.tokens[0] == 1 else 0  # (0: the grid does not start at one token)


class MoeTable:
    """A ``MoeGrid`` looked up by nested 1-D interpolation: along tokens within each measured
    experts column (the grid is a triangle: ``experts <= tokens x k``), then across the two
    columns that bracket the experts; each axis by the profiled model's rule
    (``interpolation.bracket``: the smallest point's time below the grid, the secant from half the
    largest point to it above). Lookups outside the grid are reported to ``count(axis, side)``."""

    def __init__(self, grid: MoeGrid, scale: float = 1.0, count=None):
        self._bracket, self._lerp = bracket, lerp
        self.experts = grid.activated_experts
        cols = [grid.column(j) for j in range(len(self.experts))]
        self.columns = [(xs, tuple(s * scale for s in ys)) for xs, ys in cols]
        if any(not xs for xs, _ in self.columns):
            raise ValueError("moe table: an activated_experts value with no measured time")
        self.min_tokens = min(xs[0] for xs, _ in self.columns)
        self.count = count or (lambda axis, side: None)

    def time(self, tokens: float, experts: float) -> float:
        """Seconds of the block at ``tokens`` tokens and ``experts`` distinct experts."""
        j0, j1, w, side = self._bracket(self.experts, experts)
        if side:
            self.count("moe_experts", side)

        def along_tokens(j: int) -> float:
            y, s = self._lerp(*self.columns[j], tokens)
            if s > 0 or tokens < self.min_tokens:  # (below one column's start, inside the triangle: no)
                self.count("moe_tokens", 1 if s > 0 else -1)
            return y

        y0 = along_tokens(j0)
        return y0 + w * (along_tokens(j1) - y0) if w else y0


class MoeProfiled:
    """A step's MoE layers on one GPU of ``group`` from a profile's measured MoE block
    (module docstring, "Time, profiled"). ``grid`` was measured on one GPU holding every
    expert whole (tensor parallelism 1). Without expert parallelism a GPU holds ``1/group`` of
    each expert: the block at the group's tokens and experts touched, divided by the group's
    GPUs (ideal sharding, as the profiled model treats every sharded operator). With it a GPU
    runs ``1/group`` of the token-expert pairs on its ``1/group`` of the experts touched,
    looked up at the tokens that give those pairs (``pairs / k``: the table's tokens each
    route to ``k`` experts). ``count(axis, side)`` hears of lookups outside the grid."""

    def __init__(self, grid: MoeGrid, model: ModelSpec, group: ExpertGroup, link: LinkSpec | None, count=None):
        if model.moe.dense_layers:
            raise ValueError(f"model {model.name}: a profiled MoE model with dense MLP layers "
                             f"({model.moe.dense_layers}) is not supported (the profile's layers have no MLP)")
        self.model, self.group, self.link = model, group, link
        self.layers = model.moe.moe_layers(model.num_layers)
        self.table = MoeTable(grid, 1.0 if group.expert_parallel else 1.0 / group.size, count)
        self._comm = MoeRoofline(model, group, 1.0, 1.0, link)  # (its collectives only)
        self._cache: dict[int, float] = {}

    def compute_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        t = self._cache.get(tokens)
        if t is None:
            w = moe_work(self.model, self.group, tokens)
            at = w.pairs / self.model.moe.experts_per_token if self.group.expert_parallel else w.tokens
            t = self.layers * self.table.time(at, w.experts)
            if len(self._cache) >= 65536:
                self._cache.clear()
            self._cache[tokens] = t
        return t

    def communication_s(self, tokens: int) -> float:
        return self._comm.communication_s(tokens)

    def communication_coefficients(self) -> tuple[float, float]:
        return self._comm.communication_coefficients()
