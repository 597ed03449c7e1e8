"""KV-cache allocators, block pools, prefix caches and eviction orders: pure data structures,
no simulator imports. (Preemption is the schedulers' rule: simulator/sched/.)"""

if __name__ != "kvsim.policies":  # one module object per file: never both policies.x and kvsim.policies.x
    raise ImportError(f"import kvsim.policies, not {__name__}: the repository's folders install as the kvsim package")

from kvsim.policies.kv_allocator import (
    Admission,
    BasicAllocator,
    KVAllocator,
    MemoryUsage,
    SwapResult,
)
from kvsim.policies.ledger.block_pool import BlockPool, OutOfBlocks
from kvsim.policies.ledger.contiguous_allocator import (
    CONTIGUOUS_PRESETS,
    ContiguousAllocator,
    ContiguousPreset,
    OutOfSlots,
    contiguous_preset,
)
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.ledger.reservation import RESERVATION_POLICIES, reservation_slots
from kvsim.policies.ledger.slot_space import (
    PLACEMENTS,
    BestFitSpace,
    BuddySpace,
    FirstFitSpace,
    SlotSpace,
    make_slot_space,
)

__all__ = [
    "Admission", "BasicAllocator", "BestFitSpace", "BlockPool", "BuddySpace", "CONTIGUOUS_PRESETS", "ContiguousAllocator",
    "ContiguousPreset", "FirstFitSpace", "KVAllocator", "MemoryUsage", "OutOfBlocks", "OutOfSlots", "PLACEMENTS",
    "PagedAllocator", "RESERVATION_POLICIES", "SlotSpace", "SwapResult", "contiguous_preset", "make_slot_space",
    "reservation_slots",
]
