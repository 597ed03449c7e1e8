"""KV-cache allocators and preemption policies: pure data structures, no simulator imports."""

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
