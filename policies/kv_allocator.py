"""The one interface every KV-cache allocator implements.

The scheduler speaks to memory only through this interface, so paged and
contiguous allocators are compared under identical scheduling. Units are token
*slots* (one slot holds the K and V of one token in every layer).

Two layers: :class:`BasicAllocator` is what a policy must write (admit, append, fork,
free, which sequences are resident, their lengths, the memory classes, a check);
:class:`KVAllocator` adds the *lockstep* protocol (every resident sequence appends at
once, and runs of such steps in closed form) with slow but correct defaults built on
the basic one. The tuned allocators override the lockstep methods; the differential
tests against the reference engine say whether they still agree.

Lengths, precisely: a sequence's ``kv_len`` is the number of tokens whose KV is
stored. Prefill stores the prompt (``kv_len = prompt_len``) and samples the first
output token; each decode step first appends one slot (the newest token's KV is
written by that step) and samples one more token. A request with ``o`` output
tokens therefore ends at ``final_len = prompt_len + o - 1`` stored tokens; the
allocator is told ``final_len`` only to *classify* memory (``reserved`` vs
``internal_frag``). Only oracle reservation policies may use it for sizing.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field


def final_lengths(final_len: int | Sequence[int], num_seqs: int) -> list[int]:
    """One final length per sequence: a group's sequences may end at different lengths."""
    if isinstance(final_len, int):
        return [final_len] * num_seqs
    if len(final_len) != num_seqs:
        raise ValueError(f"{len(final_len)} final lengths for {num_seqs} sequences")
    return list(final_len)


class Admission(enum.Enum):
    """Why a group can or cannot be admitted now."""

    OK = "ok"
    NO_SPACE = "no_space"  # total free space (above the watermark) is too small
    FRAGMENTED = "fragmented"  # enough free slots in total, but no hole large enough
    NEVER = "never"  # larger than the whole cache (or the region limit): can never fit


@dataclass(slots=True)
class MemoryUsage:
    """Slots by class at one instant; the four add up to ``capacity``. A value: treat
    it as read-only (not frozen only because frozen dataclasses are 4x slower to
    build, and one is built per engine step).

    ``free`` is split further by the scheduler (external fragmentation,
    stranded, idle) because only it knows whether a request is waiting.
    """

    capacity: int
    token_states: int  # slots holding KV of computed tokens (a shared block counts once)
    reserved: int  # allocated slots that their own sequence's future tokens will fill
    internal_frag: int  # slots a sequence asked for (its reservation) that will never be filled
    free: int  # unallocated slots (a prefix cache's unreferenced blocks count as free)
    #: slots the sequences would hold if nothing were shared (for the sharing saving)
    unshared: int = 0
    #: slots the allocator holds beyond what a sequence asked for (a buddy allocator's rounding
    #: up to a power of two): waste of the allocator, not of the reservation policy
    allocator_frag: int = 0

    def check(self) -> None:
        total = self.token_states + self.reserved + self.internal_frag + self.allocator_frag + self.free
        assert total == self.capacity, f"memory classes sum to {total}, capacity {self.capacity}"
        assert min(self.token_states, self.reserved, self.internal_frag, self.allocator_frag, self.free) >= 0


@dataclass(frozen=True, slots=True)
class SwapResult:
    """What a swap moved: ``blocks`` units of ``block_size`` slots (contiguous: 1 block = the used span)."""

    blocks: int
    slots: int


@dataclass(slots=True, init=False)
class RunWeights:
    """How long each iteration of a run of identical decode steps lasts.

    Iteration ``i`` (1..``steps``) lasts ``first + slope * (i - 1)`` seconds: a
    decode step's time is affine in the batch's total context, which grows by the
    batch size every iteration. Allocators integrate their memory classes against
    these weights in closed form instead of materialising per-iteration arrays.
    A value: treat it as read-only (see ``MemoryUsage``).
    """

    steps: int
    first: float  # seconds, iteration 1
    slope: float  # seconds added per iteration
    total: float = field(init=False)  # seconds of the whole run

    def __init__(self, steps: int, first: float, slope: float) -> None:
        # Written out, not generated: the fast path builds one per run, and the generated
        # ``__init__`` plus a ``__post_init__`` cost a call more.
        self.steps, self.first, self.slope = steps, first, slope
        self.total = self.elapsed(steps)

    def elapsed(self, m: int) -> float:
        """Seconds of the first ``m`` iterations."""
        return m * self.first + self.slope * (m * (m - 1) / 2)

    def iterations_to_reach(self, seconds: float) -> int:
        """Fewest iterations (whatever ``steps``) whose ``elapsed`` reaches ``seconds`` > 0."""
        first, slope = self.first, self.slope
        if slope <= 0:
            m = max(1, math.ceil(seconds / first))
        else:  # slope/2 m^2 + (first - slope/2) m >= seconds
            h = first - slope / 2
            m = max(1, math.ceil((-h + math.sqrt(h * h + 2 * slope * seconds)) / slope))
        while m > 1 and self.elapsed(m - 1) >= seconds:  # float rounding: settle on the exact boundary
            m -= 1
        while self.elapsed(m) < seconds:
            m += 1
        return m

    def tail(self, j: int) -> float:
        """Seconds of iterations ``j..steps`` (1-based): how long a change made by iteration ``j`` lasts."""
        k = self.steps
        m = k - j + 1
        if m <= 0:
            return 0.0
        return m * self.first + self.slope * ((j - 1 + k - 1) * m / 2)

    def tails(self, j: int, every: int, count: int) -> float:
        """Sum of ``tail(j + m * every)`` for m = 0..count-1 (a bucket of sequences that
        take a block every ``every`` iterations), in closed form."""
        return self.tails_sum(every, count, 1, j - 1, (j - 1) ** 2)

    def tails_sum(self, every: int, count: int, c0: int, c1: int, c2: int) -> float:
        """``tails`` summed over buckets, bucket i weighing ``c_i`` at offset ``j_i``,
        given the moments ``c0 = Σ c_i``, ``c1 = Σ c_i (j_i - 1)``, ``c2 = Σ c_i (j_i - 1)²``
        (tail(t) = total - elapsed(t - 1), and elapsed is quadratic in t)."""
        if count <= 0 or not c0:
            return 0.0
        M = count
        pairs = M * (M - 1) / 2
        sx = M * c1 + every * pairs * c0  # Σ c_i Σ_m (a_i + m every)
        sxx = M * c2 + 2 * every * pairs * c1 + every * every * ((M - 1) * M * (2 * M - 1) / 6) * c0
        return M * self.total * c0 - (self.first * sx + self.slope * (sxx - sx) / 2)

    @property
    def ramp(self) -> float:
        """Sum over iterations of ``i * seconds(i)``: the integral of a quantity growing by 1 per iteration."""
        k = self.steps
        return self.first * (k * (k + 1) / 2) + self.slope * ((k - 1) * k * (k + 1) / 3)


class BasicAllocator(ABC):
    """What a new allocation policy must write: the nine abstract methods below.

    Admit a group, grow sequences one token at a time, fork, free, say which
    sequences are on the GPU and how long they are, report the memory classes, and
    check the books. Everything else has a default that is correct for any policy
    that answers these: no CPU swap space (a preempted group is recomputed, or
    aborted where it cannot be), beam re-seeding as ``free`` then ``fork``. Subclass
    :class:`KVAllocator` (which adds the lockstep defaults) to run in the engine;
    ``policies.example_first_fit_paged`` is a whole policy in one small file.
    """

    capacity: int  # token slots on the GPU
    #: slots one "block" holds for swap/copy cost purposes (contiguous: 1)
    block_size: int
    #: whether forks share memory (paged) or copy it (contiguous)
    shares_memory: bool
    #: blocks copied inside GPU memory so far (copy-on-write, or a contiguous fork's copy)
    copied_blocks: int = 0

    # --- admission -----------------------------------------------------------
    @abstractmethod
    def check_admit(
        self, prompt_len: int, final_len: int | Sequence[int], num_seqs: int, watermark_slots: int,
        prefix: Sequence[Hashable] = (),
    ) -> Admission:
        """Could a group of ``num_seqs`` sequences sharing a ``prompt_len`` prompt be
        admitted now, keeping ``watermark_slots`` free afterwards?

        ``prefix`` names the content of the prompt's leading full blocks (one entry
        per ``block_size`` tokens); an allocator with a prefix cache reuses blocks
        whose whole chain of contents matches. Others ignore it.
        """

    @abstractmethod
    def admit(self, seq_ids: Sequence[int], prompt_len: int, final_len: int | Sequence[int],
              prefix: Sequence[Hashable] = ()) -> int:
        """Store the prompt's KV for every sequence of a new group (after ``check_admit``
        said OK); return how many prompt tokens were found in the prefix cache.

        ``final_len``: one length for all sequences, or one per sequence (samples of
        different lengths).
        """

    # --- growth and sharing ---------------------------------------------------
    @abstractmethod
    def try_append(self, seq_ids: Sequence[int]) -> bool:
        """Add one slot to each sequence, all or nothing; False if memory is short.
        A sequence may outgrow the final length it was admitted with."""

    @abstractmethod
    def fork(self, parent: int, child: int, child_final_len: int) -> None:
        """Make ``child`` a copy of ``parent`` (shared blocks where the allocator shares)."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything a sequence holds (resident or swapped out)."""

    # --- observation ----------------------------------------------------------------
    @abstractmethod
    def resident(self) -> Iterable[int]:
        """The sequences whose KV is on the GPU (every one of them decodes each step)."""

    @abstractmethod
    def kv_len(self, seq_id: int) -> int:
        """Tokens of KV stored for a sequence."""

    @abstractmethod
    def usage(self) -> MemoryUsage:
        """Exact slot classes now."""

    @abstractmethod
    def check(self) -> None:
        """Raise AssertionError if any invariant is broken (tests call this)."""

    # --- optional, with defaults ----------------------------------------------------------
    def free_slots(self) -> int:
        """Unallocated GPU slots."""
        return self.usage().free

    def fork_into(self, parent: int, target: int, target_final_len: int) -> None:
        """Make the resident sequence ``target`` a fork of ``parent``, dropping what it held:
        beam search re-seeds a dead beam from a surviving one. Same as ``free(target)``
        then ``fork(parent, target, ...)``; allocators may do it with less work."""
        self.free(target)
        self.fork(parent, target, target_final_len)

    def copy_into(self, src: int, dst: int) -> None:
        """Overwrite ``dst``'s KV with ``src``'s (sequences of equal length; beam search
        without sharing). Counts the copy in ``copied_blocks``."""
        raise NotImplementedError(f"{type(self).__name__} shares blocks instead of copying")

    # --- swapping: by default there is no CPU swap space ------------------------------------
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        """Is there CPU swap space for this group? (Default: none, so the scheduler
        recomputes a preempted group instead, or aborts one it cannot recompute.)"""
        return False

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult:
        """Move a group's KV to CPU memory (the caller checked ``can_swap_out``)."""
        raise NotImplementedError(f"{type(self).__name__} has no swap space")

    def check_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> Admission:
        """Could a swapped-out group come back now, keeping the watermark free?"""
        raise NotImplementedError(f"{type(self).__name__} has no swap space")

    def swap_in(self, seq_ids: Sequence[int]) -> SwapResult:
        """Bring a swapped-out group back to the GPU."""
        raise NotImplementedError(f"{type(self).__name__} has no swap space")


class KVAllocator(BasicAllocator):
    """An allocator the engine runs: the basic protocol plus the lockstep protocol.

    Lockstep: in a decode step every resident sequence appends one slot, and between
    two events many steps are alike. The defaults below go through the basic protocol
    one step at a time (correct, and O(resident sequences) per step); a policy makes
    them fast by overriding them (``resident_kv`` from running totals, runs of steps
    with ``max_advance_all`` and ``advance_all``), and the differential tests say
    whether it still agrees with the plain path.
    """

    def try_append_all(self) -> bool:
        """One slot for every sequence on the GPU, all or nothing; False if memory is short.

        Each sequence must stay within the final length it was admitted with
        (the scheduler ends a sequence when it gets there); ``try_append`` is the
        per-sequence path that also allows outgrowing it.
        """
        return self.try_append(list(self.resident()))

    def resident_kv(self) -> tuple[int, int]:
        """(sequences on the GPU, sum of their KV lengths in tokens): a decode batch's shape."""
        lengths = [self.kv_len(s) for s in self.resident()]
        return len(lengths), sum(lengths)

    def max_advance_all(self, limit: int) -> int:
        """How many further ``try_append_all`` calls are certain to succeed without copies,
        with no sequence outgrowing its final length: 0 to ``limit``.

        The default, 0, makes the engine step one iteration at a time.
        """
        return 0

    def advance_all(self, run: RunWeights, now: MemoryUsage | None = None) -> MemoryUsage:
        """Apply ``run.steps`` lockstep appends at once (at most ``max_advance_all``).

        Returns each class's integral over the run, in slot-seconds: the sum over
        iterations of the class after that iteration's append times its duration.
        ``now`` is ``usage()`` before the run, when the caller already has it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support macro-stepping")
