"""What the vllm-v1 and sglang schedulers share because each runs ONE sequence per request.

Both engines fan parallel samples out into separate requests and have no beam search, so a
request of several sequences is rejected at arrival; both number a request's one sequence
in arrival order, preempt by recomputation (nothing is ever swapped), end a request the
same way, and park a request loading from the cache tiers outside their queues until the
load ends (s), when it goes back to the front of the waiting queue (a rule vllm-v0 keeps
too: ``simulator.sched.tier_loads``). The rest (admission, chunking, the prefix cache each one
has) is each scheduler's own: ``simulator.sched.vllm_v1`` and ``simulator.sched.sglang``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsim.policies.indexes.radix_cache import RadixCacheAllocator
from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.cost_model.base import causal_attention_pairs
from kvsim.simulator.latency_histogram import LatencyHistogram
from kvsim.simulator.sched.scheduler import SchedulerSettings, Step
from kvsim.simulator.sched.sequence import DecodeClock, SequenceGroup, Status
from kvsim.simulator.sched.tier_loads import TierLoads
from kvsim.traces import Request


class OneSequenceScheduler(TierLoads):
    """The base of a scheduler that runs one sequence per request. A subclass names itself
    (``NAME``) and says how its engine runs several samples instead (``SAMPLES``), for the
    rejection's reason, and tells what a load's end does to its cache (``_load_done``)."""

    NAME = ""  # the scheduler policy, as a rejection names it
    SAMPLES = ""  # how the real engine runs what a request of several sequences asks for

    def __init__(self, allocator: PagedAllocator | RadixCacheAllocator, limits: SchedulerSettings,
                 on_terminal: Callable[[SequenceGroup], None], tiers: TierStack | None):
        super().__init__(tiers)  # loads from the cache tiers below the GPU cache
        self.alloc = allocator
        self.limits = limits
        self.on_terminal = on_terminal  # called once per request when it ends
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []  # always empty (preemption recomputes); the engine reads it
        #: why the head of the waiting queue was not admitted (None: nothing waits)
        self.blocked: Admission | str | None = None
        self.now = 0.0
        self.itl = LatencyHistogram()  # gaps between consecutive tokens of a request (s)
        self.clock = DecodeClock()
        self._next_seq = 0

    # --- arrivals --------------------------------------------------------------------
    def _arrive(self, request: Request, now: float) -> tuple[SequenceGroup, str | None]:
        """A new request's group at ``now`` (s), its sequence numbered next, and why it can
        never run for asking for several sequences (None: it asks for one)."""
        self.now = now
        g = SequenceGroup.single(request, self._next_seq, self.clock)
        self._next_seq += 1
        if request.num_seqs == 1:
            return g, None
        return g, (f"{self.NAME} runs one sequence per request (n={request.n}, beam_width="
                   f"{request.beam_width}): {self.SAMPLES}")

    # --- ends --------------------------------------------------------------------------
    def _end(self, g: SequenceGroup, status: Status, reason: str | None) -> None:
        g.end(status, reason, self.now)
        self.on_terminal(g)


def add_prefill_chunk(step: Step, g: SequenceGroup, computed: int, n: int) -> None:
    """``g`` computes a chunk of ``n`` tokens over its ``computed`` ones this step (``step``
    has ``chunks``: tokens per prefill, in ``prefill`` order). While it catches up after a
    preemption or retraction, the chunk is work done again (recompute tokens)."""
    if g.recomputing:
        step.recompute_tokens += n
    step.prefill.append(g)
    step.chunks.append(n)
    shape = step.shape
    shape.prefill_seqs += 1
    shape.prefill_tokens += n
    shape.prefill_attn_pairs += causal_attention_pairs(n, computed)
