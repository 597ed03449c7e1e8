"""Iteration-level scheduling with vLLM's (v0) rules.

Each call to :meth:`Scheduler.schedule` forms one iteration:

1. If nothing is swapped out, admit waiting groups FCFS while ``max_num_seqs``,
   ``max_num_batched_tokens`` and free memory above the watermark allow. A step
   that admits anything is a prefill-only step (vLLM v0 does not mix prefills
   into decode steps unless chunked prefill is on).
2. Otherwise every running group, oldest first, appends one slot per sequence;
   when memory runs out the *latest-arrived* running group is preempted (all its
   sequences), repeatedly, until the rest fit.
3. If that preempted nothing, swapped-out groups come back, oldest first, while
   free memory stays above the watermark; they decode in the same step.

Preempted groups are swapped out or recomputed (``preemption``): a recomputed
group rejoins the *front* of the waiting queue with its generated tokens
folded into its prompt. Request-level batching (FasterTransformer) admits a new
batch only when the previous one has completely finished.

Cache tiers below the GPU (``allocator.tiers``, ``policies.tiers.tier_stack``; as vLLM v0
with an offloading connector such as LMCache, whose loads are made asynchronous here as
in the v1 and sglang models). The TierStack's rules hold, with v0's prefix cache:

- *Lookup and load*: when admission considers the head of the waiting queue (FCFS, after
  the never-fits check, before the batch limits: a load takes no batch slot and no token
  budget), its GPU hit (the cached run of its prompt's named full blocks, uncapped as v0's
  hit is) is extended with the blocks some tier holds ready. If any, it loads instead of
  being admitted: its hits (those only the cache holds) and ``k`` fresh blocks must fit
  above the watermark, else admission stops (``NO_SPACE``). It holds them, waits outside
  the queues and the batch (``simulator.sched.tier_loads``, as in v1 and sglang), and at the
  load's end the loaded blocks are cached, it releases them (they stay cached, evictable)
  and goes back to the *front* of the waiting queue, where its next admission hits them
  (its lookups and hits were counted when the load started: not again).
- *Preemption*: a loaded request's blocks are cached GPU blocks like any: recomputation
  frees its blocks (the cached ones stay cached), and its next admission looks them up
  again, GPU first, then the tiers. Swap space (``hardware.swap_space_gib``) and a CPU
  tier are separate memories: a swapped-out group's blocks go to the swap pool and come
  back only by swap-in; a tier keeps prompt blocks only.
- *Stores*: write-through stores the prompt blocks a prefill computed (those past its
  hit) when its step ends; after-hits counts GPU hits at admission and load start;
  write-back stores the cached blocks the GPU evicts (any take of a block: admission,
  decode, copy-on-write, swap-in, a load), in one batch at the end of each scheduling.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvsim.policies.kv_allocator import Admission, KVAllocator, RunWeights
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.cost_model.base import BatchShape, causal_attention_pairs
from kvsim.simulator.decoding import beam_parent_counts, prefix_contents, sample_targets
from kvsim.simulator.latency_histogram import LatencyHistogram
from kvsim.simulator.sched.sequence import DecodeClock, SequenceGroup, Status
from kvsim.simulator.sched.tier_loads import TierLoads
from kvsim.traces import Request


@dataclass(frozen=True)
class SchedulerSettings:
    """Batch limits, preemption and decoding policies: everything the scheduler decides by.

    Token counts are tokens, ``watermark`` a share of KV slots.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_seq_len: int = 2048  # model context window: longer requests are rejected
    watermark: float = 0.01
    request_level_batching: bool = False
    preemption: str = "recompute"  # recompute | swap | auto
    swap_fallback: str = "recompute"  # when the CPU swap pool is full: recompute | abort
    sample_lengths: str = "same"  # parallel samples: same | independent (see decoding.sample_targets)
    beam_concentration: float = 1.0  # beam search parent choice, 0 = uniform (decoding.beam_parent_counts)
    seed: int = 0
    policy: str = "vllm-v0"  # vllm-v0 (this module) | vllm-v1 (simulator.sched.vllm_v1)
    # vllm-v1 only (see simulator.sched.vllm_v1):
    long_prefill_token_threshold: int = 0  # most tokens one request computes in a step; 0 = no cap
    max_num_partial_prefills: int | None = None  # most requests left mid-prefill by a step; None = no limit
    reserve_full_isl: bool = True  # admit only when the whole sequence's blocks are free


@dataclass(slots=True)
class Step:
    """One iteration's batch and the memory traffic it triggered."""

    prefill: list[SequenceGroup] = field(default_factory=list)
    decode: list[SequenceGroup] = field(default_factory=list)
    shape: BatchShape = field(default_factory=BatchShape)
    preempted_swap: int = 0  # groups swapped out this step
    preempted_recompute: int = 0  # groups dropped for recomputation this step
    aborted: int = 0  # groups aborted because swap space ran out
    recompute_tokens: int = 0  # prefill tokens that recompute preempted work
    cached_tokens: int = 0  # prompt tokens served by the prefix cache
    swap_out_blocks: int = 0  # transfers per layer and K/V: blocks (paged) or regions (contiguous)
    swap_in_blocks: int = 0
    swap_out_slots: int = 0  # token slots moved
    swap_in_slots: int = 0
    cow_copies: int = 0  # blocks copied on the GPU (copy-on-write, contiguous forks)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def preempted(self) -> int:
        return self.preempted_swap + self.preempted_recompute + self.aborted

    @property
    def num_groups(self) -> int:
        return len(self.prefill) + len(self.decode)


def beyond_context(prompt: int, output: int, limit: int) -> str | None:
    """Why a request of ``prompt`` + ``output`` tokens can never run in a context window of
    ``limit`` tokens (None: it fits). The v0 and v1 rule: the prompt alone is named first."""
    if prompt > limit:
        return f"prompt of {prompt} tokens exceeds the context window (model.context_len_tokens) {limit}"
    if prompt + output > limit:
        return f"prompt + output = {prompt + output} tokens exceeds the context window (model.context_len_tokens) {limit}"
    return None


class FinishQueue:
    """Running groups by the decode-clock tick at which their next sequence finishes
    (``SequenceGroup.due``; a decode step ticks the clock once for every running group).

    A group is filed again whenever that tick moves; an older entry is dropped when it
    surfaces (the group left the running batch, or its ``due`` changed since). Shared by
    the v0 and v1 schedulers.
    """

    __slots__ = ("_heap", "_by_admission")

    def __init__(self, by_admission: bool = False) -> None:
        """Groups due at the same tick retire in running-list order: by arrival (v0 keeps
        its running list sorted by arrival), or with ``by_admission`` in the order they were
        admitted (``SequenceGroup.admitted``: vLLM v1 frees the requests a step finished in
        its scheduling order, running requests as admitted; the order decides which freed
        block the free queue hands out, and so evicts, first)."""
        self._heap: list[tuple[int, float, int, SequenceGroup]] = []  # (due, rank, id, group)
        self._by_admission = by_admission

    def file(self, g: SequenceGroup) -> None:
        """(Re)file a running group: it finishes when the clock reaches next_finish - gen_base."""
        g.due = g.next_finish - g.gen_base
        r = g.request
        rank = g.admitted if self._by_admission else r.arrival_time
        heapq.heappush(self._heap, (g.due, rank, r.request_id, g))

    def next_due(self) -> int | None:
        """Tick of the earliest finish among running groups (None: no running group)."""
        heap = self._heap
        while heap:
            due, _, _, g = heap[0]
            if g.status is Status.RUNNING and g.due == due:
                return due
            heapq.heappop(heap)
        return None

    def retire_due(self, ticks: int, retire: Callable[[SequenceGroup, float], None], now: float) -> None:
        """Take the running groups due at or before ``ticks``, earliest first, and hand each
        to ``retire(group, now)`` as it is taken (one filed again meanwhile is seen too).
        A loop, not a generator: it runs after every step, and most steps retire nobody."""
        heap = self._heap
        while heap and heap[0][0] <= ticks:
            due, _, _, g = heapq.heappop(heap)
            if g.status is Status.RUNNING and g.due == due:
                retire(g, now)


class Scheduler(TierLoads):
    """Owns the waiting, running and swapped queues of one replica.

    Running groups advance in lockstep: every decode step gives each of them one
    token, so the scheduler counts decode steps (``clock``) instead of touching
    every group (``SequenceGroup.generated`` reads the clock), and a
    heap orders running groups by the clock at which their next sequence finishes.
    A step costs work for the groups that join, leave or finish, not for all.
    """

    def __init__(self, allocator: KVAllocator, limits: SchedulerSettings, on_terminal: Callable[[SequenceGroup], None],
                 tiers: TierStack | None = None):
        super().__init__(tiers)  # loads from the cache tiers below the GPU (module docstring)
        self.alloc = allocator
        self.limits = limits
        self.on_terminal = on_terminal  # called once per request when it ends
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # sorted by arrival
        self.swapped: list[SequenceGroup] = []  # sorted by arrival: swap-in takes the oldest first
        self.watermark_slots = int(limits.watermark * allocator.capacity)
        #: why the head of the waiting queue was not admitted (None: nothing waits)
        self.blocked: Admission | str | None = None
        self._next_seq = 0
        self.now = 0.0
        self.itl = LatencyHistogram()  # gaps between consecutive tokens of a sequence (s)
        self.rng = np.random.default_rng(limits.seed)
        self._shares_prefixes = bool(getattr(allocator, "prefix_caching", False))
        self.beam_groups = 0  # beam-search groups admitted and not yet ended
        self.clock = DecodeClock()  # decode steps so far
        self._finishes = FinishQueue()
        self._fresh: list[SequenceGroup] = []  # joined the running batch since the last decode step
        self._last_decode_end = 0.0  # when the last decode step ended (s)
        # Memory only shrinks while nothing is released (decoding takes slots, never gives):
        # a head refused for memory stays refused until the next release, so its verdict is
        # kept (group, releases then, verdict) instead of asking the allocator every step.
        self._releases = 0  # frees, swap-outs and beam re-seedings so far
        self._refused: tuple[SequenceGroup, int, Admission] | None = None
        self._writes_back = self.connector is not None and self.connector.stores_gpu_evictions
        if tiers is not None:
            if not (isinstance(allocator, PagedAllocator) and allocator.prefix_caching):
                raise ValueError("cache tiers need the paged allocator's prefix cache (allocator.prefix_caching: true)")
            if self._writes_back:
                allocator.on_evict = tiers.gpu_evicted

    # --- arrivals --------------------------------------------------------------
    def add(self, request: Request, now: float) -> SequenceGroup:
        self.now = now
        k = request.num_seqs
        limit = self.limits.max_seq_len
        if k == 1:  # the usual case, in short
            group = SequenceGroup.single(request, self._next_seq, self.clock)
        else:
            seq_ids = list(range(self._next_seq, self._next_seq + k))
            outputs = (sample_targets(request, self.limits.sample_lengths, self.rng, limit)
                       if request.beam_width == 1 else [request.output_tokens] * k)
            group = SequenceGroup(request, seq_ids, dict(zip(seq_ids, outputs)), request.prompt_tokens,
                                  clock=self.clock, total_output_tokens=sum(outputs),
                                  beam_width=request.beam_width, next_finish=min(outputs))
        self._next_seq += k
        if self._shares_prefixes:
            group.prefix = prefix_contents(request, self.alloc.block_size)
        if group.beam_width > 1:
            self.beam_groups += 1
        if k > self.limits.max_num_seqs:
            self._end(group, Status.REJECTED, f"{k} sequences (samples or beams) exceed max_num_seqs "
                      f"{self.limits.max_num_seqs}")
        elif why := beyond_context(request.prompt_tokens, group.max_output, limit):
            self._end(group, Status.REJECTED, why)
        else:
            self.waiting.append(group)
        return group

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.loading)

    # --- one iteration -------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        self.now = now
        step = Step()
        may_admit = not self.swapped and not (self.limits.request_level_batching and self.running)
        if may_admit:
            self.blocked = None
            if self.waiting:  # (most decode steps: nothing waits, no call)
                self._admit(step)
                if step.prefill:
                    if self.connector is not None:
                        self.connector.scheduled(now)
                    return step
        elif self.waiting:
            self.blocked = "swapped" if self.swapped else "batch"
        self._decode(step)
        if self.connector is not None:
            self.connector.scheduled(now)
        return step

    def _admit(self, step: Step) -> None:
        """Admit waiting groups FCFS into ``step`` (something waits); say why the next is not."""
        alloc, lim, shape, connector = self.alloc, self.limits, step.shape, self.connector
        refused = self._refused
        if refused is not None and refused[0] is self.waiting[0] and refused[1] == self._releases \
                and connector is None:  # (with tiers a store turning readable may let the head load)
            self.blocked = refused[2]  # nothing released since it was refused: still refused
            return
        seqs = alloc.resident_kv()[0]  # every sequence on the GPU is running
        while self.waiting:
            g = self.waiting[0]
            live = len(g.seq_ids)
            final = g.final_len(g.seq_ids[0]) if live == 1 else [g.final_len(s) for s in g.seq_ids]
            verdict = alloc.check_admit(g.prompt_len, final, live, self.watermark_slots, g.prefix)
            if verdict is Admission.NEVER:
                self.waiting.popleft()
                why = getattr(alloc, "never_reason", None)  # (a contiguous region too small)
                self._end(g, Status.REJECTED, (why and why(g.prompt_len, final, live))
                          or f"needs more KV slots than the whole cache ({alloc.capacity})")
                continue
            if connector is not None:  # the one question to the tiers: can they give more blocks?
                keys, hits = alloc.find_prefix(g.prefix)
                found = connector.found(g, len(hits), len(keys), self.now)
                if found:
                    if alloc.num_free_blocks - alloc.load_blocks(hits, len(found)) < self.watermark_slots // alloc.block_size:
                        self.blocked = Admission.NO_SPACE
                        return
                    self._start_load(self.waiting.popleft(), keys, hits, found)
                    continue
            if verdict is not Admission.OK:
                self.blocked = verdict
                self._refused = (g, self._releases, verdict)
                return
            if shape.prefill_tokens + g.prompt_len > lim.max_num_batched_tokens or seqs + live > lim.max_num_seqs:
                self.blocked = "limits"
                return
            self.waiting.popleft()
            if connector is None:
                cached = alloc.admit(g.seq_ids, g.prompt_len, final, g.prefix)
            else:
                cached = self._admit_with_tiers(g, final, keys, hits)
            g.cached_tokens = cached
            step.cached_tokens += cached
            if g.recomputing:
                step.recompute_tokens += g.prompt_len - cached
                g.recomputing = False
            seqs += live
            shape.prefill_seqs += 1
            shape.prefill_tokens += g.prompt_len - cached
            shape.prefill_attn_pairs += causal_attention_pairs(g.prompt_len - cached, cached)
            self._start_running(g)
            step.prefill.append(g)

    # --- cache tiers below the GPU (module docstring) ---------------------------------
    def _admit_with_tiers(self, g: SequenceGroup, final: int | list[int], keys: list[int], hits: list[int]) -> int:
        """Admit ``g`` (its prompt's ``keys``, its GPU ``hits``) and tell the tiers: its hits
        (after-hits counts them, unless back from a load: counted then), and the prompt blocks
        its prefill computes (written through when the step ends)."""
        p, h = g.request.priority, len(hits)
        counted = not g.after_load
        g.after_load = False
        cached = self.alloc.admit(g.seq_ids, g.prompt_len, final, g.prefix, priority=p, counted=counted)
        if counted:
            self.connector.gpu_hits(g, h, p)
        self.connector.computed(g, h, len(keys), p)
        return cached

    def _block_names(self, g: SequenceGroup, start: int, stop: int) -> list[int]:
        """The tiers name a block by its chain key in v0's prefix cache."""
        return self.alloc.prefix_keys(g.prefix)[start:stop]

    def _start_load(self, g: SequenceGroup, keys: list[int], hits: list[int], found: list[int]) -> None:
        """``g`` loads the ``len(found)`` blocks after its GPU ``hits`` from the tiers ``found``
        names: it holds its hits and fresh blocks, and waits outside the queues and the batch."""
        h, k, p, s = len(hits), len(found), g.request.priority, g.seq_ids[0]
        g.after_load = False
        self.connector.gpu_hits(g, h, p)
        self.alloc.start_load(s, keys, hits, k)
        done, loaded = self.connector.load(g, h, found, self.now, p)
        self._await_load(done, s, g, loaded)

    def _load_done(self, s: int, g: SequenceGroup, keys: list[int]) -> int:
        """The loaded blocks (``keys``) are cached on the GPU and released (a release: the
        head's refusal no longer holds); return the tokens loaded."""
        self.alloc.finish_load(s, keys, g.request.priority)
        self._releases += 1
        return len(keys) * self.alloc.block_size

    def _start_running(self, g: SequenceGroup) -> None:
        """Join the running batch (its finish is filed once its next token is decided:
        after its prefill, or at once by a swap-in)."""
        g.gen_base -= self.clock.ticks  # now counted from the clock
        g.status = Status.RUNNING
        if g.first_scheduled is None:
            g.first_scheduled = self.now
        running = self.running
        if not running or running[-1].request.arrival_time < g.request.arrival_time \
                or running[-1].sort_key <= g.sort_key:  # the usual case: the latest arrival
            running.append(g)
        else:
            bisect.insort(running, g, key=lambda x: x.sort_key)
        g.fresh = True
        self._fresh.append(g)

    def _stop_running(self, g: SequenceGroup) -> None:
        """Write back the lockstep state of a group leaving the running batch (its caller
        then sets where it goes)."""
        g.gen_base += self.clock.ticks
        g.status = Status.WAITING
        if not g.fresh:  # it decoded in the last decode step
            g.last_token = self._last_decode_end

    def _decode(self, step: Step) -> None:
        alloc = self.alloc
        copies_before = alloc.copied_blocks
        if self.beam_groups:
            beams = [g for g in self.running if g.beam_width > 1 and g.generated >= 1]
            # One draw for all groups: the same stream as a draw per group, in order.
            uniforms = self.rng.random(sum(len(g.seq_ids) for g in beams)).tolist()
            at = 0
            for g in beams:
                width = len(g.seq_ids)
                self._choose_beams(g, uniforms[at:at + width])
                at += width
        # Every sequence on the GPU belongs to a running group, and decodes: the fast
        # path gives each its slot in one all-or-nothing call.
        if not alloc.try_append_all():
            self.running = self._append_or_preempt(step)
        if self.swapped and not step.preempted:
            self._swap_in(step)
        step.shape.decode_seqs, step.shape.decode_context = alloc.resident_kv()
        step.decode = list(self.running)
        step.cow_copies = alloc.copied_blocks - copies_before

    def _append_or_preempt(self, step: Step) -> list[SequenceGroup]:
        """Oldest first, each group appends; when memory runs out, the latest-arrived
        running group is preempted, repeatedly, until the rest fit."""
        queue = deque(self.running)
        kept: list[SequenceGroup] = []
        while queue:
            g = queue.popleft()
            while not self.alloc.try_append(g.seq_ids):
                victim = queue.pop() if queue else g
                self._preempt(victim, step)
                if victim is g:
                    break
            else:
                kept.append(g)
        return kept

    def _choose_beams(self, g: SequenceGroup, uniforms: list[float]) -> None:
        """Beam search: the next beams descend from the current ones (best first); a
        survivor chosen m times forks m - 1 times into the places of dead beams
        (``uniforms``: one draw per beam)."""
        parents = g.seq_ids
        counts = beam_parent_counts(self.limits.beam_concentration, uniforms)
        if 0 not in counts:  # every beam chosen once: nothing forks
            return
        self._releases += 1  # a dead beam's blocks are released
        if not self.alloc.shares_memory:
            # Without sharing every beam keeps its own region (all beams have the same
            # length); a beam taking over a dead one's region copies its parent's KV there.
            dead = [s for s, m in zip(parents, counts) if m == 0]
            children = [s for s, m in zip(parents, counts) for _ in range(m - 1)]
            for src, dst in zip(children, dead):
                self.alloc.copy_into(src, dst)
            return
        # A beam chosen m times forks m - 1 times, each fork taking a dead beam's place
        # (all beams have the same target length, so the dead beam's entry stays right).
        final = g.request.prompt_tokens + g.targets[parents[0]] - 1
        dead = iter([s for s, m in zip(parents, counts) if m == 0])
        fork_into = self.alloc.fork_into
        beams: list[int] = []
        for s, m in zip(parents, counts):
            if m:
                beams.append(s)
            for _ in range(m - 1):
                child = next(dead)
                fork_into(s, child, final)
                beams.append(child)
        g.seq_ids = beams

    def _swap_in(self, step: Step) -> None:
        alloc = self.alloc
        seqs = sum(g.num_live for g in self.running)
        while self.swapped:
            g = self.swapped[0]
            if seqs + g.num_live > self.limits.max_num_seqs:
                return
            # Room for the blocks coming back plus one new slot per sequence, above the watermark.
            room = self.watermark_slots + g.num_live * alloc.block_size
            verdict = alloc.check_swap_in(g.seq_ids, room)
            if verdict is Admission.NEVER:
                self.swapped.pop(0)
                self._free_all(g)
                self._end(g, Status.ABORTED, "swapped-out group can no longer fit in GPU memory")
                continue
            if verdict is not Admission.OK:
                return
            self.swapped.pop(0)
            moved = alloc.swap_in(g.seq_ids)
            g.swapped_in_blocks += moved.blocks
            step.swap_in_blocks += moved.blocks
            step.swap_in_slots += self._moved_slots(moved)
            appended = alloc.try_append(g.seq_ids)
            assert appended, "swap-in left no room for the next token"
            seqs += g.num_live
            self._start_running(g)
            self._finishes.file(g)

    # --- preemption -----------------------------------------------------------------
    def _preempt(self, g: SequenceGroup, step: Step) -> None:
        self._releases += 1  # swapped out, recomputed or aborted: its GPU memory is released
        self._stop_running(g)
        g.preemptions += 1
        mode = self.limits.preemption
        if mode == "auto" or g.num_live > 1:
            # vLLM's rule: samples and beams hold different tokens after the shared prompt,
            # so a multi-sequence group is swapped, never recomputed.
            mode = "swap" if g.num_live > 1 else "recompute"
        if mode == "swap":
            if self.alloc.can_swap_out(g.seq_ids):
                moved = self.alloc.swap_out(g.seq_ids)
                g.swapped_out_blocks += moved.blocks
                step.swap_out_blocks += moved.blocks
                step.swap_out_slots += self._moved_slots(moved)
                g.status = Status.SWAPPED
                bisect.insort(self.swapped, g, key=lambda x: x.sort_key)
                step.preempted_swap += 1
                return
            if self.limits.swap_fallback == "abort" or g.num_live > 1:
                self._free_all(g)
                reason = "CPU swap space exhausted"
                if g.num_live > 1 and self.limits.swap_fallback != "abort":
                    reason += " (a multi-sequence group cannot be recomputed)"
                self._end(g, Status.ABORTED, reason)
                step.aborted += 1
                return
        self._recompute(g)
        step.preempted_recompute += 1

    def _moved_slots(self, moved) -> int:
        """Slots a swap transfers: whole blocks for paged, the used span for contiguous."""
        B = self.alloc.block_size
        return moved.blocks * B if B > 1 else moved.slots

    def _recompute(self, g: SequenceGroup) -> None:
        """Drop the group's KV; it will prefill prompt + generated tokens again."""
        for s in g.seq_ids:
            g.recomputed_tokens += self.alloc.kv_len(s)
            self.alloc.free(s)
        g.prompt_len = g.request.prompt_tokens + g.generated
        g.recomputing = True
        g.status = Status.WAITING
        self.waiting.appendleft(g)

    # --- runs of identical decode steps (DESIGN.md "Performance principle") ---------------
    def run_length(self, step: Step, limit: int) -> int:
        """How many more decode iterations identical to ``step`` are certain to follow.

        Identical means: no admission can happen (nothing waits, or the head of the
        queue is blocked and memory only shrinks while decoding), no sequence finishes
        before the last of them, and every append fits without preemption or copy.
        Arrivals are the engine's business (it knows when the next one comes).
        """
        if step.prefill or not step.decode or step.preempted or step.swap_in_blocks or step.cow_copies:
            return 0
        if self.beam_groups:
            return 0
        if self.connector is not None and (self.waiting or self._writes_back):
            return 0  # a store turning readable may let the head load; each step's evictions are a batch
        if self.waiting and self.blocked == "swapped" and not self.swapped:
            return 0  # the swapped groups that blocked admission were aborted in this step
        return self._lockstep_room(limit, scheduled=1)

    def continue_length(self, limit: int) -> int:
        """After a run's finishes were retired: how many more identical decode iterations
        follow at once (0: the next step must be scheduled as usual).

        Only when no admission or swap-in can follow a finish (nothing waits, nothing
        is swapped out) and no beams fork; the run goes on until the next finish.
        """
        if self.waiting or self.swapped or self.beam_groups or not self.running or self._writes_back:
            return 0
        return self._lockstep_room(limit, scheduled=0)

    def _lockstep_room(self, limit: int, scheduled: int) -> int:
        """Decode iterations (<= ``limit``) that can follow the ``scheduled`` ones already
        decided with no sequence finishing before the last of them and every append
        fitting without a copy."""
        due = self._finishes.next_due()
        k = min(limit, due - self.clock.ticks - scheduled) if due is not None else limit
        return self.alloc.max_advance_all(k) if k > 0 else 0

    # --- after the step ----------------------------------------------------------------
    def complete(self, step: Step, now: float, *, run: RunWeights | None = None) -> None:
        """Every scheduled sequence gained one token (or one per iteration of a run:
        ``step`` followed by ``run``); finished sequences free memory."""
        if step.prefill:
            if self.connector is not None:  # the prompt blocks its prefills computed
                self.connector.step_ended(now)
            for g in step.prefill:  # the prefill samples each sequence's first token
                g.gen_base += 1
                if g.first_token is None:
                    g.first_token = now
                else:  # recomputed: the gap since its last token spans the preemption
                    self.itl.add(now - g.last_token, len(g.seq_ids))
                g.last_token = now
                self._finishes.file(g)
        else:
            first_end = now - run.total if run is not None else now
            steady = step.shape.decode_seqs  # decoded in the previous decode step too
            for g in self._fresh:
                g.fresh = False
                if g.status is Status.RUNNING:
                    self.itl.add(first_end - g.last_token, len(g.seq_ids))
                    steady -= len(g.seq_ids)
            self._fresh.clear()
            if steady:
                self.itl.add(first_end - self._last_decode_end, steady)
            self.clock.ticks += 1
            self._last_decode_end = first_end
            if run is not None:
                self._run_done(run, step.shape.decode_seqs, now)
        self._finishes.retire_due(self.clock.ticks, self._retire_done, now)

    def complete_run(self, run: RunWeights, now: float) -> None:
        """A run that went on past a finish (no step of its own) ended at ``now``: every
        running sequence gained one token per iteration."""
        self._run_done(run, self.alloc.resident_kv()[0], now)
        self._finishes.retire_due(self.clock.ticks, self._retire_done, now)

    def _run_done(self, run: RunWeights, seqs: int, now: float) -> None:
        self.itl.add_linear(run.first, run.slope, run.steps, seqs)
        self.clock.ticks += run.steps
        self._last_decode_end = now

    def _retire_done(self, g: SequenceGroup, now: float) -> None:
        self._releases += 1
        if len(g.seq_ids) == 1:  # the usual case: one sequence, and it is due
            self.alloc.free(g.seq_ids.pop())
        else:
            generated = g.generated
            for s in [s for s in g.seq_ids if g.targets[s] <= generated]:
                self.alloc.free(s)
                g.seq_ids.remove(s)
        if g.seq_ids:
            g.next_finish = min(g.targets[s] for s in g.seq_ids)
            self._finishes.file(g)
            return
        self._stop_running(g)
        g.last_token = g.finish = now
        self.running.remove(g)
        self._end(g, Status.FINISHED, None)

    def _free_all(self, g: SequenceGroup) -> None:
        self._releases += 1
        for s in g.seq_ids:
            self.alloc.free(s)

    def _end(self, g: SequenceGroup, status: Status, reason: str | None) -> None:
        if g.beam_width > 1:
            self.beam_groups -= 1
        g.end(status, reason, self.now)
        self.on_terminal(g)
