"""The seven memory classes of DESIGN.md ("Memory accounting"), one instant at a time.

The allocator knows which allocated slots hold tokens, are reserved, or are
wasted inside allocations; only the scheduler knows why free slots are free.
"""

from __future__ import annotations

from kvsim.policies.kv_allocator import Admission

CLASSES = ("token_states", "reserved", "internal_frag", "allocator_frag", "external_frag", "stranded_free",
           "idle_free")
FREE_CLASSES = ("external_frag", "stranded_free", "idle_free")  # slots in no block or region held


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

