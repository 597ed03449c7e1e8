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


def split_free(free: float, waiting: bool, blocked: object) -> tuple[float, float, float]:
    """Split free slots by why they are free: (external_frag, stranded_free, idle_free).

    - nothing waits -> ``idle_free``;
    - the head of the queue waits although the total free space would hold it
      (no hole large enough) -> ``external_frag``;
    - otherwise (too little free space, the watermark, batch limits, swapped
      groups first) -> ``stranded_free``: the paper's "& others".
    """
    if not waiting:
        return 0, 0, free
    if blocked is Admission.FRAGMENTED:
        return free, 0, 0
    return 0, free, 0


def classify(usage: MemoryUsage, waiting: bool, blocked: object) -> MemorySnapshot:
    """All six classes at one instant (see ``split_free`` for the free slots)."""
    return MemorySnapshot(usage.token_states, usage.reserved, usage.internal_frag,
                          *split_free(usage.free, waiting, blocked))
