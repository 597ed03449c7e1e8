"""The six memory classes of DESIGN.md ("Memory accounting"), one instant at a time.

The allocator knows which allocated slots hold tokens, are reserved, or are
wasted inside allocations; only the scheduler knows why free slots are free.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.kv_allocator import Admission, MemoryUsage

CLASSES = ("token_states", "reserved", "internal_frag", "external_frag", "stranded_free", "idle_free")


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """Slots by class; the six add up to the KV capacity."""

    token_states: int
    reserved: int
    internal_frag: int
    external_frag: int
    stranded_free: int
    idle_free: int

    def as_tuple(self) -> tuple[int, ...]:
        return (
            self.token_states,
            self.reserved,
            self.internal_frag,
            self.external_frag,
            self.stranded_free,
            self.idle_free,
        )


def classify(usage: MemoryUsage, waiting: bool, blocked: object) -> MemorySnapshot:
    """Split free slots by why they are free.

    - nothing waits -> ``idle_free``;
    - the head of the queue waits although the total free space would hold it
      (no hole large enough) -> ``external_frag``;
    - otherwise (too little free space, the watermark, batch limits, swapped
      groups first) -> ``stranded_free``: the paper's "& others".
    """
    free = usage.free
    external = stranded = idle = 0
    if not waiting:
        idle = free
    elif blocked is Admission.FRAGMENTED:
        external = free
    else:
        stranded = free
    return MemorySnapshot(usage.token_states, usage.reserved, usage.internal_frag, external, stranded, idle)
