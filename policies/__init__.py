"""KV-cache allocators, block pools, prefix caches and eviction orders: pure data structures,
no simulator imports. (Preemption is the schedulers' rule: simulator/scheduler*.py.)"""

from policies.block_pool import BlockPool, OutOfBlocks
from policies.contiguous_allocator import (
    CONTIGUOUS_PRESETS,
    ContiguousAllocator,
    ContiguousPreset,
    OutOfSlots,
    contiguous_preset,
)
from policies.kv_allocator import Admission, BasicAllocator, KVAllocator, MemoryUsage, SwapResult
from policies.paged_allocator import PagedAllocator
from policies.reservation import RESERVATION_POLICIES, reservation_slots
from policies.slot_space import (
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
