"""Contiguous KV allocation: one reserved region per sequence (Orca, FasterTransformer).

Every sequence owns one contiguous region of a ``SlotSpace``, sized by a
reservation policy when the sequence is admitted. The region cannot grow in
place (its neighbours may be taken, and moving a region's KV would be a copy
the paper's baselines do not make), so ``try_append`` fails once a sequence has
filled its region. Nothing is shared: each sample or beam of a group gets its
own region holding its own copy of the prompt, and ``fork`` copies.

Memory classes (all in slots, summing to ``capacity``), per live region of
``region`` slots asked for as ``reserve`` slots, holding ``kv_len`` tokens of a
sequence that will end at ``final_len`` tokens, with ``target = max(kv_len,
min(final_len, region))`` and ``asked = max(reserve, target)``: ``token_states =
kv_len``, ``reserved = target - kv_len`` (future tokens of its own),
``internal_frag = asked - target`` (the reservation policy's over-reservation),
``allocator_frag = region - asked`` (a buddy allocator's rounding up to a power of
two, which the vLLM paper counts as external fragmentation "from the memory
allocator like the buddy allocator", section 3); ``free`` is the space's free slots. ``target`` rises with
``kv_len`` only if a sequence outgrows the ``final_len`` it was admitted with.
Running totals keep ``usage()`` and ``try_append`` O(1).

Lockstep clock: in a decode step every sequence on the GPU appends one slot, so
``try_append_all`` and ``advance_all`` only move a shared clock (O(1) Python
work however many sequences run). A resident sequence stores
``kv_len = base + clock``; its headroom to its target (which never exceeds its
region) is kept as the per-sequence constant ``target - base``, so "can everyone
grow by k?" is one C-level ``min`` over a dict minus the clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from kvsim.policies.kv_allocator import (
    Admission,
    KVAllocator,
    MemoryUsage,
    RunWeights,
    SwapResult,
    final_lengths,
)
from kvsim.policies.ledger.reservation import RESERVATION_POLICIES, reservation_slots
from kvsim.policies.ledger.slot_space import SlotSpace, make_slot_space


class OutOfSlots(RuntimeError):
    """No hole fits a region the caller asked for (it skipped or ignored a check)."""


@dataclass(frozen=True, slots=True)
class ContiguousPreset:
    """A named baseline: placement + reservation, and whether it batches per request.

    ``request_level_batching`` is read by the scheduler (a batch runs to
    completion before the next is formed); the allocator ignores it.
    """

    placement: str
    reservation: str
    request_level_batching: bool = False


#: The vLLM paper's contiguous baselines (section 6.1). Orca uses a buddy
#: allocator; Orca-Oracle's exact reservation would be rounded back up to
#: Pow2's by a plain buddy, so it uses ``buddy_exact`` (the rounded tail is
#: returned to the buddy lists, as Linux's alloc_pages_exact does). FasterTransformer preallocates a [batch, max_seq_len] buffer:
#: equal max-length slots, which first fit over equal-size regions reproduces
#: exactly (every region starts at a multiple of max_seq_len).
CONTIGUOUS_PRESETS: dict[str, ContiguousPreset] = {
    "orca-max": ContiguousPreset("buddy", "max"),
    "orca-pow2": ContiguousPreset("buddy", "pow2"),
    "orca-oracle": ContiguousPreset("buddy_exact", "oracle"),
    "fastertransformer": ContiguousPreset("first_fit", "max", request_level_batching=True),
}


def contiguous_preset(name: str) -> ContiguousPreset:
    """Look up a preset by name, with a one-line error listing the allowed names."""
    try:
        return CONTIGUOUS_PRESETS[name]
    except KeyError:
        allowed = ", ".join(CONTIGUOUS_PRESETS)
        raise ValueError(f"unknown contiguous preset {name!r}; allowed: {allowed}") from None


class ContiguousAllocator(KVAllocator):
    """``capacity`` token slots; each sequence holds one region sized by ``reservation``.

    ``placement``: ``buddy``, ``buddy_exact``, ``first_fit`` or ``best_fit``
    (see ``policies.ledger.slot_space``). ``max_seq_len``: the model's maximum
    sequence length in tokens. ``swap_capacity_slots``: CPU swap space in token
    slots; a swapped-out sequence takes exactly its ``kv_len`` slots there (its
    reservation is dropped and made again on swap-in).
    """

    block_size = 1
    shares_memory = False
    copied_blocks = 0

    def __init__(
        self,
        capacity: int,
        placement: str,
        reservation: str,
        max_seq_len: int,
        swap_capacity_slots: int = 0,
    ):
        if reservation not in RESERVATION_POLICIES:
            allowed = ", ".join(RESERVATION_POLICIES)
            raise ValueError(f"unknown reservation policy {reservation!r}; allowed: {allowed}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1 token, got {max_seq_len}")
        if swap_capacity_slots < 0:
            raise ValueError(f"swap_capacity_slots must be >= 0, got {swap_capacity_slots}")
        self.capacity = capacity
        self.placement = placement
        self.reservation = reservation
        self.max_seq_len = max_seq_len
        self.swap_capacity_slots = swap_capacity_slots
        self._space: SlotSpace = make_slot_space(placement, capacity)
        # running sequences: seq_id -> ...
        self._offset: dict[int, int] = {}  # region offset
        self._limit: dict[int, int] = {}  # region size: kv_len may grow up to it
        self._base: dict[int, int] = {}  # kv_len - clock (tokens stored, off the clock)
        self._target: dict[int, int] = {}  # max(kv_len, min(final_len, region))
        self._room_to_target: dict[int, int] = {}  # target - base: appends left = this - clock
        self._final: dict[int, int] = {}  # final_len it was admitted with
        self._reserve: dict[int, int] = {}  # slots asked of the space (before rounding)
        # swapped-out sequences: seq_id -> (kv_len, final_len, reservation)
        self._swapped: dict[int, tuple[int, int, int]] = {}
        self._cpu_used = 0  # swap slots in use
        self._clock = 0  # lockstep appends made so far (kv_len = base + clock on the GPU)
        self._token_states = 0  # sum of kv_len over running sequences
        self._target_sum = 0  # sum of target over running sequences
        self._asked_sum = 0  # sum of max(reserve, target) over running sequences

    @classmethod
    def from_preset(
        cls, name: str, capacity: int, max_seq_len: int, swap_capacity_slots: int = 0
    ) -> ContiguousAllocator:
        preset = contiguous_preset(name)
        return cls(capacity, preset.placement, preset.reservation, max_seq_len, swap_capacity_slots)

    # --- placement helpers -------------------------------------------------------------
    def _admission(self, sizes: Sequence[int], watermark_slots: int) -> Admission:
        """Classify placing regions of ``sizes`` now, keeping ``watermark_slots`` free.

        NEVER also when the group would eat into the watermark of an empty
        space (as vLLM's paged admission does), so it cannot wait forever.
        """
        space = self._space
        needed = sum(space.slots_for(s) for s in sizes)
        if needed > self.capacity - watermark_slots or not space.fits_empty(sizes):
            return Admission.NEVER
        if space.free_slots - watermark_slots < needed:
            return Admission.NO_SPACE
        if not space.can_place(sizes):
            return Admission.FRAGMENTED
        return Admission.OK

    def _reservation(self, stored_len: int, final_len: int) -> int:
        return reservation_slots(self.reservation, stored_len, final_len, self.max_seq_len)

    def _place(self, seq_id: int, reserve: int, kv_len: int, final_len: int) -> None:
        offset = self._space.allocate(reserve)
        if offset is None:
            raise OutOfSlots(
                f"no hole of {reserve} slots for sequence {seq_id} "
                f"(largest hole {self._space.largest_hole()}, free {self._space.free_slots})"
            )
        region = self._space.region_size(offset)
        target = max(kv_len, min(final_len, region))
        base = kv_len - self._clock
        self._offset[seq_id] = offset
        self._limit[seq_id] = region
        self._base[seq_id] = base
        self._target[seq_id] = target
        self._room_to_target[seq_id] = target - base
        self._final[seq_id] = final_len
        self._reserve[seq_id] = reserve
        self._token_states += kv_len
        self._target_sum += target
        self._asked_sum += max(reserve, target)

    def _release(self, seq_id: int) -> tuple[int, int, int]:
        """Free a running sequence's region; return its (kv_len, final_len, reservation)."""
        self._space.free(self._offset.pop(seq_id))
        del self._limit[seq_id], self._room_to_target[seq_id]
        kv_len = self._base.pop(seq_id) + self._clock
        self._token_states -= kv_len
        target, reserve = self._target.pop(seq_id), self._reserve.pop(seq_id)
        self._target_sum -= target
        self._asked_sum -= max(reserve, target)
        return kv_len, self._final.pop(seq_id), reserve

    def _require_new(self, seq_ids: Sequence[int]) -> None:
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate sequence ids in {list(seq_ids)}")
        for s in seq_ids:
            if s in self._base or s in self._swapped:
                raise ValueError(f"sequence {s} already holds memory")

    def _require_running(self, seq_ids: Sequence[int]) -> None:
        for s in seq_ids:
            if s not in self._base:
                raise ValueError(f"sequence {s} is not running on the GPU")

    # --- admission -----------------------------------------------------------------------
    def check_admit(
        self, prompt_len: int, final_len: int, num_seqs: int, watermark_slots: int,
        prefix: Sequence[Hashable] = (),
    ) -> Admission:
        if num_seqs < 1:
            raise ValueError(f"num_seqs must be >= 1, got {num_seqs}")
        finals = final_lengths(final_len, num_seqs)
        reserves = [self._reservation(prompt_len, f) for f in finals]
        if any(r < f for r, f in zip(reserves, finals)):  # a sequence could never finish in its region
            return Admission.NEVER
        return self._admission(reserves, watermark_slots)

    def never_reason(self, prompt_len: int, final_len: int | Sequence[int], num_seqs: int) -> str | None:
        """Why :meth:`check_admit` says NEVER when the cache is not too small: a sequence longer
        than the region it would get (``max_seq_len``: ``allocator.reserve_tokens``); else None."""
        for f in final_lengths(final_len, num_seqs):
            if self._reservation(prompt_len, f) < f:
                return (f"needs {f} KV slots (prompt + output - 1) but a region holds at most {self.max_seq_len} "
                        "(allocator.reserve_tokens)")
        return None

    def admit(self, seq_ids: Sequence[int], prompt_len: int, final_len: int,
              prefix: Sequence[Hashable] = ()) -> int:
        """Place one region per sequence, each with its own copy of the prompt (no prefix cache)."""
        self._require_new(seq_ids)
        finals = final_lengths(final_len, len(seq_ids))
        reserves = [self._reservation(prompt_len, f) for f in finals]
        for r, f in zip(reserves, finals):
            if r < f:
                raise ValueError(
                    f"final_len {f} exceeds the {self.reservation!r} reservation "
                    f"of {r} slots (max_seq_len {self.max_seq_len})"
                )
        if not self._space.can_place(reserves):
            raise OutOfSlots(f"cannot place {len(seq_ids)} regions of {reserves} slots")
        for s, r, f in zip(seq_ids, reserves, finals):
            self._place(s, r, prompt_len, f)
        return 0

    # --- growth and copies ---------------------------------------------------------------
    def try_append(self, seq_ids: Sequence[int]) -> bool:
        """One more token for each sequence, inside its region; False if any region is full.

        The per-sequence path: moves each sequence's base, not the clock, and
        lets a sequence outgrow its target (``final_len``).
        """
        base, limit, clock = self._base, self._limit, self._clock
        for s in seq_ids:
            if base[s] + clock >= limit[s]:
                return False
        target, to_target = self._target, self._room_to_target
        for s in seq_ids:
            b = base[s] + 1
            base[s] = b
            n = b + clock
            if n > target[s]:  # grew past its final_len: the slot is a token, not a reservation
                if n > self._reserve[s]:  # ... and past what it asked for (into the rounding)
                    self._asked_sum += n - max(target[s], self._reserve[s])
                target[s] = n
                self._target_sum += 1
            to_target[s] = target[s] - b
        self._token_states += len(seq_ids)
        return True

    def try_append_all(self) -> bool:
        """One more token for every running sequence: moves the clock, O(1) Python work.

        False (nothing changes) if any region is full. A target never exceeds its
        region, so while every sequence has room to its target all fit; otherwise
        ``try_append`` decides (a full region, or a sequence outgrowing its final_len).
        """
        if not self._base:
            return True
        clock = self._clock
        if min(self._room_to_target.values()) - clock < 1:
            return self.try_append(list(self._base))  # rare: a full region, or an outgrowing sequence
        self._clock = clock + 1
        self._token_states += len(self._base)
        return True

    def max_advance_all(self, limit: int) -> int:
        """Lockstep appends (<= ``limit``) that keep every sequence within its target.

        ``target <= region`` always, so the target is the binding bound; within
        it each append turns one reserved slot per sequence into a token and the
        classes change linearly.
        """
        if not self._room_to_target:
            return max(limit, 0)
        return max(min(limit, min(self._room_to_target.values()) - self._clock), 0)

    def advance_all(self, run: RunWeights, now: MemoryUsage | None = None) -> MemoryUsage:
        """Make ``run.steps`` lockstep appends; return each class's integral in slot-seconds.

        With ``n`` running sequences, after the ``i``-th append
        ``token_states = T0 + n*i`` and ``reserved = R0 - n*i`` while
        ``internal_frag`` and ``free`` stay put, so the integrals are
        ``T0 * total + n * ramp`` and ``R0 * total - n * ramp``.
        """
        k = run.steps
        if k < 0 or self.max_advance_all(k) < k:
            raise ValueError(
                f"cannot advance {k} lockstep steps: at most {self.max_advance_all(max(k, 0))}"
            )
        u = now if now is not None else self.usage()
        n = len(self._base)
        total, ramp = run.total, run.ramp
        grown = n * ramp  # slot-seconds that moved from reserved to token_states
        self._clock += k
        self._token_states += n * k
        return MemoryUsage(
            capacity=self.capacity * total,
            token_states=u.token_states * total + grown,
            reserved=u.reserved * total - grown,
            internal_frag=u.internal_frag * total,
            free=u.free * total,
            unshared=(self.capacity - u.free) * total,  # allocated: nothing is shared
            allocator_frag=u.allocator_frag * total,
        )

    def fork(self, parent: int, child: int, child_final_len: int) -> None:
        """Copy ``parent``'s KV into a new region of ``child``'s own reservation.

        Raises ``OutOfSlots`` if no hole fits (the interface has no fork check:
        a scheduler forking beams should free the dropped beams first).
        """
        self._require_running([parent])
        self._require_new([child])
        kv_len = self._base[parent] + self._clock
        if child_final_len < kv_len:
            raise ValueError(f"child_final_len {child_final_len} < parent's kv_len {kv_len}")
        reserve = self._reservation(kv_len, child_final_len)
        if reserve < child_final_len:
            raise ValueError(
                f"child_final_len {child_final_len} exceeds the reservation of {reserve} slots"
            )
        self._place(child, reserve, kv_len, child_final_len)
        self.copied_blocks += kv_len  # block_size 1: the parent's KV is copied slot by slot

    def copy_into(self, src: int, dst: int) -> None:
        """Copy ``src``'s KV over ``dst``'s, in place: both regions stay where they are."""
        self._require_running([src, dst])
        src_len, dst_len = self.kv_len(src), self.kv_len(dst)
        if src_len != dst_len:
            raise ValueError(f"sequences {src} and {dst} hold {src_len} and {dst_len} tokens")
        self.copied_blocks += src_len

    def free(self, seq_id: int) -> None:
        if seq_id in self._base:
            self._release(seq_id)
        elif seq_id in self._swapped:
            self._cpu_used -= self._swapped.pop(seq_id)[0]
        else:
            raise ValueError(f"sequence {seq_id} holds no memory")

    # --- swapping --------------------------------------------------------------------------
    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        base = self._base
        stored = sum(base[s] for s in seq_ids) + len(seq_ids) * self._clock
        return self._cpu_used + stored <= self.swap_capacity_slots

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult:
        """Copy each sequence's used span to CPU (one transfer per region) and free its region."""
        self._require_running(seq_ids)
        if not self.can_swap_out(seq_ids):
            raise OutOfSlots(f"swap space of {self.swap_capacity_slots} slots is full")
        moved = 0
        for s in seq_ids:
            kv_len, final_len, reserve = self._release(s)
            self._swapped[s] = (kv_len, final_len, reserve)
            moved += kv_len
        self._cpu_used += moved
        return SwapResult(blocks=len(seq_ids), slots=moved)

    def _swapped_reserves(self, seq_ids: Sequence[int]) -> list[int]:
        try:
            return [self._swapped[s][2] for s in seq_ids]
        except KeyError as e:
            raise ValueError(f"sequence {e.args[0]} is not swapped out") from None

    def check_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> Admission:
        return self._admission(self._swapped_reserves(seq_ids), watermark_slots)

    def swap_in(self, seq_ids: Sequence[int]) -> SwapResult:
        """New regions of each sequence's reservation, then copy its used span back."""
        reserves = self._swapped_reserves(seq_ids)
        if not self._space.can_place(reserves):
            raise OutOfSlots(f"cannot place swapped-in regions of {reserves} slots")
        moved = 0
        for s in seq_ids:
            kv_len, final_len, reserve = self._swapped.pop(s)
            self._place(s, reserve, kv_len, final_len)
            moved += kv_len
        self._cpu_used -= moved
        return SwapResult(blocks=len(seq_ids), slots=moved)

    # --- observation ----------------------------------------------------------------------
    def kv_len(self, seq_id: int) -> int:
        """Tokens stored, on the GPU or (if swapped out) on the CPU."""
        if seq_id in self._base:
            return self._base[seq_id] + self._clock
        return self._swapped[seq_id][0]

    def region(self, seq_id: int) -> tuple[int, int]:
        """``(offset, slots)`` of a running sequence's region."""
        return self._offset[seq_id], self._limit[seq_id]

    @property
    def space(self) -> SlotSpace:
        """The slot space, for observation (holes, regions); mutate it only through this class."""
        return self._space

    @property
    def swap_used_slots(self) -> int:
        """CPU swap slots in use."""
        return self._cpu_used

    def resident(self) -> Iterable[int]:
        return self._base.keys()

    def resident_kv(self) -> tuple[int, int]:
        return len(self._base), self._token_states

    def usage(self) -> MemoryUsage:
        free = self._space.free_slots
        return MemoryUsage(
            capacity=self.capacity,
            token_states=self._token_states,
            reserved=self._target_sum - self._token_states,
            internal_frag=self._asked_sum - self._target_sum,
            free=free,
            allocator_frag=self.capacity - free - self._asked_sum,
        )

    def free_slots(self) -> int:
        return self._space.free_slots

    def check(self) -> None:
        space = self._space
        space.check()
        live = {self._offset[s]: s for s in self._offset}
        assert len(live) == len(self._offset), "two sequences share a region offset"
        assert set(live) == {o for o, _ in space.regions()}, "regions and sequences disagree"
        running = set(self._offset)
        for name in ("_limit", "_base", "_target", "_final", "_reserve", "_room_to_target"):
            assert set(getattr(self, name)) == running, f"{name} and the running set disagree"
        clock = self._clock
        for s, offset in self._offset.items():
            region, base = self._limit[s], self._base[s]
            kv_len = base + clock
            assert region == space.region_size(offset), f"sequence {s}: stale region size"
            assert self._reserve[s] <= region, f"sequence {s}: region below its reservation"
            assert 1 <= kv_len <= region, f"sequence {s}: kv_len {kv_len} outside its region"
            want = max(kv_len, min(self._final[s], region))
            assert self._target[s] == want, f"sequence {s}: target {self._target[s]} != {want}"
            assert self._room_to_target[s] == want - base, f"sequence {s}: stale room to target"
        want_tokens = sum(self._base.values()) + len(self._base) * clock
        assert self._token_states == want_tokens, "token_states total drifted"
        assert self._target_sum == sum(self._target.values()), "target total drifted"
        assert self._asked_sum == sum(max(self._reserve[s], t) for s, t in self._target.items()), \
            "asked total drifted"
        assert not running & set(self._swapped), "a sequence is both running and swapped"
        assert self._cpu_used == sum(v[0] for v in self._swapped.values()), "swap total drifted"
        assert self._cpu_used <= self.swap_capacity_slots, "swap space overcommitted"
        self.usage().check()
