"""What a cost model is asked: how long does one iteration (or a transfer) take?"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from kvsim.simulator.cost_model.host_time import NO_HOST, HostTime
from kvsim.simulator.cost_model.interconnect import LinkSpec
from kvsim.simulator.cost_model.interconnect import interconnect as by_name
from kvsim.simulator.cost_model.moe import ExpertGroup

if TYPE_CHECKING:  # (the catalogue is plain data; named here only in annotations)
    from kvsim.simulator.cost_model.catalogue import GPUSpec, ModelSpec


@dataclass(slots=True)
class BatchShape:
    """The work of one iteration, in tokens; everything a step time depends on.

    Aggregates (sums) rather than per-sequence lists keep the cost model O(1) and
    let the engine advance many identical decode iterations in closed form.
    """

    prefill_seqs: int = 0  # sequences whose prompt (or part of it) is computed this step
    prefill_tokens: int = 0  # prompt tokens computed (cached prefix tokens excluded)
    prefill_attn_pairs: float = 0.0  # sum over prefill tokens of keys each attends to (causal)
    decode_seqs: int = 0  # sequences generating one token each
    decode_context: int = 0  # sum of KV lengths read by the decode sequences (tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens through the linear layers."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_seqs == 0


def causal_attention_pairs(new_tokens: int, cached_tokens: int = 0) -> float:
    """Query-key pairs computed when ``new_tokens`` follow ``cached_tokens`` (causal mask).

    Token i (1-based) of the new chunk attends to ``cached_tokens + i`` keys.
    """
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2


class StepParts(NamedTuple):
    """A step's time in its parts (seconds); they add up to ``step_time``.

    ``compute_s``: the GPU's kernels (and a model's fixed per-step overhead);
    ``communication_s``: collectives between the replica's GPUs (tensor-parallel all-reduces;
    0 on one GPU); ``host_s``: the engine's work outside the kernels (``host_time``).
    """

    compute_s: float
    communication_s: float
    host_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.communication_s + self.host_s


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where one replica of a model runs, as every measured cost model is built for it:
    ``model`` on ``tensor_parallel`` ``gpu``s, KV blocks of ``block_size`` tokens read by the
    ``paged`` or ``contiguous`` attention kernel, and the host link's PCIe generation
    (``pcie``: a key of ``catalogue.PCIE``; None: the GPU's own) for swaps; the GPUs' link
    (``interconnect``: a name of ``interconnect.INTERCONNECTS`` or a ``LinkSpec``; None: the
    GPU's own) for collectives; the engine's ``host`` time per step."""

    model: ModelSpec
    gpu: GPUSpec
    tensor_parallel: int = 1
    block_size: int = 16  # tokens per KV block
    kernel: str = "paged"
    pcie: str | None = None
    interconnect: str | LinkSpec | None = None
    host: HostTime = NO_HOST
    #: how a MoE model's expert layers are spread (``moe.ExpertGroup``); None: over this
    #: replica's ``tensor_parallel`` GPUs
    expert_group: ExpertGroup | None = None

    @property
    def link(self) -> LinkSpec | None:
        """The GPUs' link: ``interconnect`` or the GPU's catalogue default."""
        return resolve_link(self.gpu, self.interconnect)


def resolve_link(gpu: GPUSpec, link: str | LinkSpec | None) -> LinkSpec | None:
    """A link given by name or spec, or the GPU's catalogue default (None: no link)."""
    if link is None:
        return by_name(gpu.interconnect) if gpu.interconnect else None
    return by_name(link) if isinstance(link, str) else link


class CostModel(ABC):
    """Predicts seconds for a step and for memory transfers on one model replica.

    The replica's model, GPU, tensor-parallel degree, block size and kernel kind
    are fixed at construction; a step's time depends only on its ``BatchShape``.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1, block_size: int = 16,
                 kernel: str = "paged"):
        """The deployment every kind of cost model times, in one place (with its defaults):
        ``model`` on ``tensor_parallel`` ``gpu``s, KV blocks of ``block_size`` tokens,
        attention by the ``paged`` or ``contiguous`` kernel."""
        self.model, self.gpu, self.tp = model, gpu, tensor_parallel
        self.block_size, self.kernel = block_size, kernel

    @abstractmethod
    def step_time(self, shape: BatchShape) -> float:
        """Seconds one iteration of this shape takes."""

    #: the engine's work outside the kernels (``host_time``); a model that times it sets its own
    host: HostTime = NO_HOST

    def step_parts(self, shape: BatchShape) -> StepParts:
        """``step_time`` in its parts (``StepParts``): kernels, communication (the step's
        collectives, ``communication_coefficients``), host (``host`` for its sequences)."""
        tokens = shape.num_tokens
        if tokens == 0:
            return StepParts(0.0, 0.0, 0.0)
        fixed, per_token = self.communication_coefficients()
        comm = fixed + per_token * tokens
        host = self.host.seconds(shape.prefill_seqs + shape.decode_seqs)
        return StepParts(self.step_time(shape) - comm - host, comm, host)

    def communication_coefficients(self) -> tuple[float, float]:
        """``(fixed_s, per_token_s)``: a step of ``tokens > 0`` tokens spends
        ``fixed_s + per_token_s * tokens`` in collectives (``(0, 0)``: none, e.g. one GPU). Affine
        in the tokens, so a run of steps' communication follows from its totals."""
        return 0.0, 0.0

    @abstractmethod
    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """``(a, b)`` with ``step_time = a + b * decode_context`` for a decode-only batch.

        Lets the engine sum a run of decode iterations in closed form.
        """

    def decode_segment(self, num_seqs: int, context: int) -> tuple[float, float, int]:
        """``(a, b, iterations)``: a decode-only step of ``num_seqs`` sequences holding
        ``context`` tokens lasts ``a + b * context``, exactly, for this step and the next
        ``iterations - 1`` (the context growing by ``num_seqs`` a step).

        The engine advances a run of decode steps in closed form within one segment and
        starts a new run at its end. Default: ``decode_coefficients``, valid forever.
        """
        a, b = self.decode_coefficients(num_seqs)
        return a, b, sys.maxsize

    @abstractmethod
    def swap_time(self, num_blocks: int, num_slots: int | None = None) -> float:
        """Seconds to move KV across the host link (one direction).

        ``num_blocks`` contiguous chunks (paged blocks, or contiguous regions) holding
        ``num_slots`` token slots in all (default: ``num_blocks * block_size``). Each
        chunk is copied per layer, K and V separately, unless transfers are batched.
        """

    @abstractmethod
    def copy_time(self, num_blocks: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks within GPU memory (copy-on-write)."""
