"""KV-cache allocators, block pools, prefix caches and eviction orders: pure data structures,
no simulator imports. (Preemption is the schedulers' rule: simulator/scheduler*.py.)"""

if __name__ != "kvsim.policies":  # one module object per file: never both policies.x and kvsim.policies.x
    raise ImportError(f"import kvsim.policies, not {__name__}: the repository's folders install as the kvsim package")

from kvsim.policies.block_pool import BlockPool, OutOfBlocks
from kvsim.policies.contiguous_allocator import (
    CONTIGUOUS_PRESETS,
    ContiguousAllocator,
    ContiguousPreset,
    OutOfSlots,
    contiguous_preset,
)
from kvsim.policies.kv_allocator import (
    Admission,
    BasicAllocator,
    KVAllocator,
    MemoryUsage,
    SwapResult,
)
from kvsim.policies.paged_allocator import PagedAllocator
from kvsim.policies.reservation import RESERVATION_POLICIES, reservation_slots
from kvsim.policies.slot_space import (
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
